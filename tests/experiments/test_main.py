"""Wrong inputs stop before compilation with one sentence naming the value."""

import os
import subprocess
import sys
import time

import pytest

from experiments.configs import digits_mlp
from tests.subprocess_util import REPO_ROOT
from train import loop


@pytest.fixture
def config(tmp_path):
  c = digits_mlp.get_config()
  c.data.data_dir = str(tmp_path / 'data')
  return c


def _setup_error(config, workdir):
  with pytest.raises(ValueError) as info:
    loop.setup(config, str(workdir))
  message = str(info.value)
  assert '\n' not in message and message.endswith('.')
  return message


def test_unknown_optimizer(config, tmp_path):
  config.optimizer.name = 'adagrad_typo'
  message = _setup_error(config, tmp_path / 'w')
  assert "'adagrad_typo'" in message and 'adamw' in message


def test_unknown_model(config, tmp_path):
  config.model.name = 'resnet9000'
  message = _setup_error(config, tmp_path / 'w')
  assert "'resnet9000'" in message and 'mlp' in message


def test_unknown_model_option(config, tmp_path):
  config.model.widths = (3,)
  assert "'widths'" in _setup_error(config, tmp_path / 'w')


@pytest.mark.parametrize('lr', [0.0, -1e-3])
def test_non_positive_learning_rate(config, tmp_path, lr):
  config.optimizer.learning_rate = lr
  message = _setup_error(config, tmp_path / 'w')
  assert 'learning_rate' in message and repr(lr) in message


def test_unknown_parallel_mode(config, tmp_path):
  config.parallel.mode = 'tensor'
  assert "'tensor'" in _setup_error(config, tmp_path / 'w')


def test_unwritable_workdir(config, tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  message = _setup_error(config, blocker / 'workdir')
  assert str(blocker / 'workdir') in message and 'not writable' in message


def test_main_exits_with_one_sentence_before_compiling(tmp_path):
  """Through the absl entry point: exit status 1, the sentence, and no checkpoint written."""
  workdir = tmp_path / 'w'
  command = [sys.executable, '-m', 'experiments.main',
             f'--config={os.path.join(REPO_ROOT, "experiments/configs/digits_mlp.py")}',
             f'--workdir={workdir}', '--config.optimizer.learning_rate=-0.1']
  start = time.time()
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'error: optimizer.learning_rate must be positive, got -0.1.')
  assert not (workdir / 'checkpoints').exists()
  assert time.time() - start < 60


def test_batch_not_divisible_by_devices():
  """Needs 8 devices, so runs in its own process."""
  from tests.subprocess_util import run_python  # pylint: disable=g-import-not-at-top
  out = run_python('''
import json, tempfile
from experiments.configs import digits_mlp
from train import loop
c = digits_mlp.get_config()
c.global_batch_size = 60
try:
  loop.setup(c, tempfile.mkdtemp())
  print(json.dumps({'error': None}))
except ValueError as e:
  print(json.dumps({'error': str(e)}))
''', devices=8)
  assert out['error'] == 'config.global_batch_size=60 is not divisible by the 8 devices of the mesh.'


def test_changed_model_with_old_workdir_stops_and_keeps_checkpoints(config, tmp_path):
  workdir = tmp_path / 'w'
  config.num_train_steps = 10
  config.optimizer.warmup_steps = 2
  loop.setup(config, str(workdir)).train()
  checkpoints = workdir / 'checkpoints'
  before = {p: p.stat().st_mtime_ns for p in checkpoints.rglob('*')}
  config.model.features = (128, 10)
  message = _setup_error(config, workdir)
  assert message.startswith(f"The checkpoint of step 10 in '{checkpoints}' does not fit this config: "
                            'params/Dense_0/bias is float32 (256,) there but float32 (128,) here')
  assert {p: p.stat().st_mtime_ns for p in checkpoints.rglob('*')} == before
