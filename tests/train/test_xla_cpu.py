"""train/xla_cpu.py: the launchers keep convolutions off YNNPACK, and a person's flags win."""

import os

import jax
import pytest

from tests import subprocess_util
from train import xla_cpu


def test_the_flag_is_appended_to_other_flags_and_a_persons_choice_is_kept():
  environ = {}
  assert xla_cpu.keep_convolutions_off_ynnpack(environ)
  assert environ['XLA_FLAGS'] == '--xla_cpu_experimental_ynn_fusion_type=-individual_convolution'

  environ = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  assert xla_cpu.keep_convolutions_off_ynnpack(environ)
  assert environ['XLA_FLAGS'] == ('--xla_force_host_platform_device_count=8 '
                                  '--xla_cpu_experimental_ynn_fusion_type=-individual_convolution')

  mine = '--xla_cpu_experimental_ynn_fusion_type= --xla_force_host_platform_device_count=2'
  environ = {'XLA_FLAGS': mine}
  assert not xla_cpu.keep_convolutions_off_ynnpack(environ)
  assert environ['XLA_FLAGS'] == mine


def test_too_late_is_one_sentence(monkeypatch):
  jax.devices()  # the backend has started in this process
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  with pytest.raises(RuntimeError, match=r'after JAX started its backend.*before the first JAX'):
    xla_cpu.keep_convolutions_off_ynnpack()
  assert os.environ['XLA_FLAGS'] == '--xla_force_host_platform_device_count=1'


def test_after_the_backend_started_a_set_flag_or_another_environment_is_no_error(monkeypatch):
  """Too late only matters for the process's own XLA_FLAGS without the flag: a launcher that
  calls it twice, or a person's own YNN setting, returns False; an environment built for a
  child process still gets the flag."""
  jax.devices()
  monkeypatch.setenv('XLA_FLAGS', xla_cpu.NO_YNN_CONVOLUTIONS)
  assert not xla_cpu.keep_convolutions_off_ynnpack()
  assert os.environ['XLA_FLAGS'] == xla_cpu.NO_YNN_CONVOLUTIONS
  child = {'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  assert xla_cpu.keep_convolutions_off_ynnpack(child)
  assert child['XLA_FLAGS'] == ('--xla_force_host_platform_device_count=2 '
                                '--xla_cpu_experimental_ynn_fusion_type=-individual_convolution')


_YNN_CONVOLUTIONS = """
import json
import jax, jax.numpy as jnp
from train import xla_cpu
if LAUNCHER:
  xla_cpu.keep_convolutions_off_ynnpack()
# XLA kept the small convolutions tried (batch 16 and below) for itself; this one, of batch
# 32, goes to YNNPACK under the default flags.
x = jax.random.normal(jax.random.PRNGKey(0), (32, 12, 12, 8))
w = jnp.ones((3, 3, 8, 8))
conv = lambda w, x: jnp.sum(jax.lax.conv_general_dilated(
    x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')) ** 2)
text = jax.jit(jax.grad(conv)).lower(w, x).compile().as_text()
# The YNN fusions' bodies: each `%fused_computation...` whose fusion is of kind __ynn_fusion.
ynn_bodies = [line.split('calls=')[1].split(',')[0] for line in text.splitlines()
              if '__ynn_fusion' in line and 'calls=' in line]
blocks = text.split('\\n\\n')
ynn_convolutions = sum(
    1 for body in ynn_bodies for block in blocks
    if block.lstrip().startswith(body + ' ') and ' convolution(' in block)
print(json.dumps({'ynn_convolutions': ynn_convolutions,
                  'convolutions': text.count(' convolution(')}))
"""


@pytest.mark.parametrize('launcher', [False, True])
def test_the_flag_takes_convolutions_off_ynnpack(launcher):
  """XLA's default hands the weight gradient's convolution to YNNPACK; the flag stops it."""
  source = _YNN_CONVOLUTIONS.replace('LAUNCHER', str(launcher))
  result = subprocess_util.run_python(source, env={'XLA_FLAGS': ''})
  assert result['convolutions'] >= 2  # the forward pass's and the weight gradient's
  assert result['ynn_convolutions'] == (0 if launcher else 1)
