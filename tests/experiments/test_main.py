"""Wrong inputs stop before compilation with one sentence naming the value."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.configs import digits_mlp
from tests.subprocess_util import REPO_ROOT
from train import loop, optim


@pytest.fixture
def config(tmp_path):
  c = digits_mlp.get_config()
  c.data.data_dir = str(tmp_path / 'data')
  return c


def _setup_error(config, workdir, **kwargs):
  with pytest.raises(ValueError) as info:
    loop.setup(config, str(workdir), **kwargs)
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
  config.parallel.mode = 'pipeline'
  assert "'pipeline'" in _setup_error(config, tmp_path / 'w')


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
  # JAX logs every compilation, even of the random key's seed, when JAX_LOG_COMPILES is set.
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu',
                               'JAX_LOG_COMPILES': '1'})
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'error: optimizer.learning_rate must be positive, got -0.1.')
  assert 'Compiling' not in result.stderr
  assert not (workdir / 'checkpoints').exists()
  assert time.time() - start < 60


def test_batch_not_divisible_by_devices():
  """Needs 8 devices, so runs in its own process."""
  from tests.subprocess_util import run_python  # pylint: disable=g-import-not-at-top
  out = run_python('''
import json, tempfile
from experiments.configs import digits_mlp
from train import loop, optim
errors = []
# 60 over 8 devices; then 64 (8 per device), whose 16 micro-batches would divide the global
# batch but not a device's 8 examples.
for batch_size, accumulation in ((60, 1), (64, 16)):
  c = digits_mlp.get_config()
  c.global_batch_size, c.grad_accum_steps = batch_size, accumulation
  try:
    loop.setup(c, tempfile.mkdtemp())
    errors.append(None)
  except ValueError as e:
    errors.append(str(e))
print(json.dumps({'errors': errors}))
''', devices=8)
  assert out['errors'] == [
      'config.global_batch_size=60 is not divisible by the 8 devices of the mesh.',
      'config.grad_accum_steps=16 does not divide the batch of 8 examples per device.']


def test_changed_model_with_old_workdir_stops_and_keeps_checkpoints(config, tmp_path):
  workdir = tmp_path / 'w'
  config.num_train_steps = 10
  config.optimizer.warmup_steps = 2
  loop.setup(config, str(workdir)).train()
  checkpoints = workdir / 'checkpoints'
  before = {p: p.stat().st_mtime_ns for p in checkpoints.rglob('*')}
  config.model.features = (128, 10)
  # The run's record names the change first ...
  message = _setup_error(config, workdir)
  assert message.startswith(f"The checkpoints in '{workdir}' were written with another config: "
                            'model.features ([256, 256, 10] -> [128, 10]) differ;')
  # ... and a change allowed on purpose still cannot load arrays of other shapes.
  message = _setup_error(config, workdir, allow_config_change=True)
  assert message.startswith(f"The checkpoint '{checkpoints / '10'}' does not fit this config: "
                            'params/Dense_0/bias is float32 (256,) there but float32 (128,) here')
  assert {p: p.stat().st_mtime_ns for p in checkpoints.rglob('*')} == before


def test_resume_under_a_changed_optimiser_is_refused_but_step_count_may_change(config, tmp_path,
                                                                               capsys):
  workdir = tmp_path / 'w'
  config.num_train_steps = 10
  config.optimizer.warmup_steps = 2
  loop.setup(config, str(workdir)).train()
  config.optimizer.learning_rate = 1e6
  config.seed = 3
  message = _setup_error(config, workdir)
  assert 'optimizer.learning_rate (0.002 -> 1000000.0)' in message and 'seed (0 -> 3)' in message
  config.optimizer.learning_rate, config.seed = 2e-3, 0
  config.num_train_steps, config.log_every_steps, config.parallel.mode = 20, 5, 'shard_map'
  capsys.readouterr()
  loop.setup(config, str(workdir)).train()
  # The warm-up cosine is laid out over the new length, and the run says so: at step 10 the
  # 10-step schedule had reached its floor, 0, and the 20-step one is at 0.5 (1 + cos(π·8/18))
  # of its peak 2e-3.
  rate = float(optim.make_schedule(config.optimizer, 20)(10))
  assert abs(rate - 1e-3 * (1 + np.cos(np.pi * 8 / 18))) < 1e-8
  assert (f"Resuming at step 10 with num_train_steps 10 -> 20: the 'warmup_cosine' learning-rate "
          f'schedule is laid out over the new length, so the rate there goes from 0 to '
          f'{rate:.4g}.' in capsys.readouterr().err)
  from train import checkpoint  # pylint: disable=g-import-not-at-top
  assert int(checkpoint.restore_arrays(str(workdir))['step']) == 20  # resumed and ran on
  assert loop.read_config(str(workdir)).num_train_steps == 20


def _nothing_written(workdir) -> bool:
  return not any((workdir / name).exists() for name in ('checkpoints', 'metrics.jsonl', 'tensorboard'))


def test_bad_task_option_stops_before_anything_is_written(config, tmp_path):
  config.task.label_smoothing = 2.0
  workdir = tmp_path / 'w'
  assert _setup_error(config, workdir) == 'task.label_smoothing must lie in [0, 1), got 2.0.'
  assert _nothing_written(workdir)


@pytest.mark.parametrize('features', [(256, 0, 10), (256, -3, 10)])
def test_model_width_zero_or_negative_stops_in_one_sentence(config, tmp_path, features):
  config.model.features = features
  message = _setup_error(config, tmp_path / 'w')
  assert 'positive integers' in message and str(features) in message
  assert _nothing_written(tmp_path / 'w')


def test_a_trace_failure_inside_the_model_becomes_one_sentence(config, tmp_path):
  """A model option that only fails when traced (an activation that does not exist)."""
  config.model.activation = 'relu6_typo'
  message = _setup_error(config, tmp_path / 'w')
  assert "'relu6_typo'" in message and len(message) < 300


def test_text_data_set_with_the_classification_task_is_one_short_sentence(config, tmp_path):
  source = tmp_path / 'shakespeare'
  source.mkdir()
  (source / 'input.txt').write_text('First Citizen:\nBefore we proceed any further, hear me speak.\n' * 50)
  config.data.name = 'tiny_shakespeare'
  config.data.eval_split = 'validation'
  config.data.options = {'source_dir': str(source)}
  message = _setup_error(config, tmp_path / 'w')
  assert "task.input_key='image' is not a feature" in message and 'text' in message
  assert 'Citizen' not in message and len(message) < 200


def test_empty_eval_split_is_refused(config, tmp_path):
  config.data.eval_split = 'test[:0]'
  message = _setup_error(config, tmp_path / 'w')
  assert message == "Split 'test[:0]' of data set 'digits' holds no examples."


def test_failed_checks_leave_no_new_work_directory(config, tmp_path):
  workdir = tmp_path / 'fresh' / 'run'
  config.model.features = (256, 0, 10)
  _setup_error(config, workdir)
  assert not (tmp_path / 'fresh').exists()
  config.model.features = (256, 256, 10)
  run = loop.setup(config, str(workdir))  # the same command, fixed, creates it
  assert sorted(os.listdir(workdir)) == ['.lock', 'checkpoints', 'config.json']
  run.lock.release()


def test_a_second_run_on_a_work_directory_in_use_is_refused(config, tmp_path):
  from train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'w'
  workdir.mkdir()
  with workdir_lib.acquire(str(workdir)):
    message = _setup_error(config, workdir)
  assert message.startswith(f"The work directory '{workdir}' is in use by process {os.getpid()} "
                            f'on {socket.gethostname()}')
  assert not (workdir / 'checkpoints').exists()
  loop.setup(config, str(workdir)).lock.release()  # free again once the holder let go


def test_a_task_metric_of_the_wrong_shape_is_refused_at_setup(config, tmp_path, monkeypatch):
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from train import tasks  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class PerClassWeights(tasks.Classification):
    """A weight per class beside a loss per example: a shape bug a new task could make."""

    def loss(self, model, batch):
      metrics = super().loss(model, batch)
      total, _ = metrics['loss']
      return {**metrics, 'loss': (total, jnp.ones((total.shape[0], 10)))}

  monkeypatch.setitem(tasks.TASKS, 'classification', PerClassWeights)
  message = _setup_error(config, tmp_path / 'w')
  assert message == ("Metric 'loss' has a total of shape (64,) and a weight of shape (64, 10); "
                     'both need the same shape, batch axis (64) first.')
  assert not (tmp_path / 'w').exists()
