"""The benchmark scripts refuse counts that would leave nothing to time, before any work."""

import os
import subprocess
import sys

import pytest

from tests.subprocess_util import REPO_ROOT

_GPT = 'experiments/configs/shakespeare_char_gpt.py'
_DIGITS = 'experiments/configs/digits_mlp.py'


@pytest.mark.parametrize('script, args', [
    ('train_step.py', [f'--config={_DIGITS}', '--steps=0']),
    ('train_step.py', [f'--config={_DIGITS}', '--pipeline_batches=0']),
    ('profile_step.py', [f'--config={_DIGITS}', '--steps=0']),
    ('generation.py', [f'--config={_GPT}', '--repeats=0']),
    ('attention_scaling.py', ['--repeats=0']),
    ('attention_scaling.py', ['--width=0']),
])
def test_a_count_of_zero_is_refused_by_name(script, args):
  # Without the bound each ran: a division by the zero count after the timing (train_step,
  # profile_step), NaN rates (generation, attention_scaling) or a crash in the model.
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, os.path.join('benchmarks', script), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  name = args[-1].split('=')[0]
  assert f'flag {name}=0: 0 is not a positive integer' in result.stderr
  assert 'matmul peak' not in result.stdout  # refused before anything was measured
