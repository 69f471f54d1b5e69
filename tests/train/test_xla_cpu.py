"""train/xla_cpu.py: the launchers keep convolutions off YNNPACK and freed host memory for reuse,
and a person's own settings win."""

import os
import resource
import types

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


GLIBC = xla_cpu._is_glibc()  # pylint: disable=protected-access

_PAGE_FAULTS = """
import json, resource
from train import xla_cpu
kept = xla_cpu.keep_freed_host_memory() if LAUNCHER else None
import jax, jax.numpy as jnp
x = jax.random.normal(jax.random.PRNGKey(0), (4096, 16))
# tanh(x xᵀ) is a 4096 × 4096 float32 buffer of XLA's: 64 MB, freed at the end of each call.
f = jax.jit(lambda x: jnp.sum(jnp.tanh(x @ x.T) @ x))
faults = []
for _ in range(4):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({'kept': kept, 'faults': faults}))
"""


@pytest.mark.skipif(not GLIBC, reason='mallopt is glibc\'s')
@pytest.mark.parametrize('launcher', [False, True])
def test_a_programs_freed_buffer_is_reused_without_page_faults(launcher):
  """glibc maps a freed 64 MB buffer afresh at every call, 16,384 pages faulted in each time
  (measured 16,386–17,333); after the launcher's call the first call's pages are reused (0 or
  1 faults measured in each later call)."""
  result = subprocess_util.run_python(_PAGE_FAULTS.replace('LAUNCHER', str(launcher)))
  pages = 64 * 2**20 // resource.getpagesize()
  later = result['faults'][1:]
  if launcher:
    assert result['kept'] is True
    assert max(later) < 0.05 * pages, result
  else:
    assert min(later) > 0.9 * pages, result


@pytest.mark.parametrize('environ', [
    {'MALLOC_ARENA_MAX': '8'}, {'MALLOC_MMAP_MAX_': '65536'}, {'MALLOC_MMAP_THRESHOLD_': '0'},
    {'MALLOC_TRIM_THRESHOLD_': '0'}, {'MALLOC_TOP_PAD_': '0'},
    {'GLIBC_TUNABLES': 'glibc.rtld.nns=4:glibc.malloc.hugetlb=1'}])
def test_a_persons_own_malloc_settings_win(monkeypatch, environ):
  jax.devices()  # even after the backend started: nothing to do is no error
  monkeypatch.setattr(xla_cpu.ctypes, 'CDLL', _unreachable)
  assert not xla_cpu.keep_freed_host_memory(environ)


def test_freed_memory_too_late_is_one_sentence_and_other_tunables_are_not_malloc_settings(
    monkeypatch):
  if not GLIBC:
    pytest.skip('mallopt is glibc\'s')
  jax.devices()  # the backend has started in this process
  monkeypatch.setattr(xla_cpu.ctypes, 'CDLL', _unreachable)
  for environ in ({}, {'GLIBC_TUNABLES': 'glibc.rtld.nns=4'}):
    with pytest.raises(RuntimeError, match=r'^keep_freed_host_memory\(\) came after JAX '
                       r'started its backend.*before the first JAX computation\.$'):
      xla_cpu.keep_freed_host_memory(environ)


@pytest.mark.parametrize('confstr', ['musl', ValueError('unrecognized configuration name')])
def test_another_c_library_is_left_as_it_is(monkeypatch, confstr):
  def fake_confstr(name):
    assert name == 'CS_GNU_LIBC_VERSION'
    if isinstance(confstr, Exception):
      raise confstr
    return confstr
  monkeypatch.setattr(xla_cpu.os, 'confstr', fake_confstr)
  monkeypatch.setattr(xla_cpu.ctypes, 'CDLL', _unreachable)
  assert not xla_cpu.keep_freed_host_memory({})


def test_the_three_settings_are_made_once_and_a_second_call_changes_nothing(monkeypatch):
  calls = []
  monkeypatch.setattr(xla_cpu, '_kept_freed_memory', False)
  monkeypatch.setattr(xla_cpu, '_is_glibc', lambda: True)
  monkeypatch.setattr(xla_cpu, '_backends_started', lambda: False)
  monkeypatch.setattr(xla_cpu.ctypes, 'CDLL', lambda name: types.SimpleNamespace(
      mallopt=lambda parameter, value: calls.append((parameter, value)) or 1))
  assert xla_cpu.keep_freed_host_memory({})
  # M_ARENA_MAX 1, M_MMAP_MAX 0, M_TRIM_THRESHOLD 2³¹ − 1 (mallopt's int).
  assert calls == [(-8, 1), (-4, 0), (-1, 2**31 - 1)]
  monkeypatch.setattr(xla_cpu, '_backends_started', lambda: True)  # too late, but already set
  assert not xla_cpu.keep_freed_host_memory({})
  assert len(calls) == 3


def test_a_refused_setting_is_one_sentence(monkeypatch):
  calls = []
  def mallopt(parameter, value):
    calls.append((parameter, value))
    return int(parameter != xla_cpu.M_MMAP_MAX)  # glibc returns 1 on success, 0 on error
  monkeypatch.setattr(xla_cpu, '_kept_freed_memory', False)
  monkeypatch.setattr(xla_cpu, '_is_glibc', lambda: True)
  monkeypatch.setattr(xla_cpu, '_backends_started', lambda: False)
  monkeypatch.setattr(xla_cpu.ctypes, 'CDLL', lambda name: types.SimpleNamespace(mallopt=mallopt))
  with pytest.raises(RuntimeError, match=r"^glibc's mallopt refused parameter -4 = 0\.$"):
    xla_cpu.keep_freed_host_memory({})
  assert calls == [(-8, 1), (-4, 0)]  # M_ARENA_MAX 1, then M_MMAP_MAX 0


def _unreachable(*args):
  raise AssertionError(f'malloc was configured: CDLL{args}')
