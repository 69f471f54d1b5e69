"""A run never loses work: the non-finite guard, fall-back from damaged checkpoints, the
run's record of metrics on resume, and the resume and ETA lines."""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from experiments.configs import digits_mlp
from tests.train import loop_patches
from tests.train import test_checkpoint as damage_lib
from train import checkpoint, loop


def _config(data_dir, **overrides):
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.num_train_steps = 300
  config.log_every_steps = 50
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 100
  config.optimizer.warmup_steps = 10
  for key, value in overrides.items():
    target = config
    *path, name = key.split('.')
    for part in path:
      target = target[part]
    target[name] = value
  return config


def _records(workdir, split='train'):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


def _all_finite(tree):
  return all(np.all(np.isfinite(x)) for x in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(x).dtype, np.floating))


def test_divergence_stops_in_one_sentence_and_no_checkpoint_is_non_finite(data_dir, tmp_path):
  workdir = str(tmp_path / 'diverging')
  config = _config(data_dir, **{'optimizer.learning_rate': 1e6, 'checkpoint_every_steps': 5,
                                'log_every_steps': 5, 'max_bad_steps': 5})
  with pytest.raises(loop.Stopped) as info:
    loop.setup(config, workdir).train()
  message = str(info.value)
  assert info.value.exit_code == 1 and '\n' not in message
  assert message.startswith('The loss or gradients were not finite for 5 steps in a row (steps ')
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())
  assert steps  # some checkpoints were written before and during the streak ...
  for step in steps:  # ... and every one of them is finite
    assert _all_finite(checkpoint.restore_arrays(workdir, step))
  assert sum(r['skipped_steps'] for r in _records(workdir)) >= 5


def test_one_nan_batch_is_skipped_and_the_run_ends_finite(data_dir, tmp_path, monkeypatch):
  loop_patches.poison_batches((7,), monkeypatch)
  workdir = str(tmp_path / 'poisoned')
  final = loop.setup(_config(data_dir, num_train_steps=50, log_every_steps=10), workdir).train()
  assert np.isfinite(final['loss']) and final['accuracy'] > 0.8
  logged = {r['step']: r for r in _records(workdir)}
  assert logged[10]['skipped_steps'] == 1 and np.isfinite(logged[10]['loss'])
  assert all(logged[s]['skipped_steps'] == 0 for s in (20, 30, 40, 50))
  assert _all_finite(checkpoint.restore_arrays(workdir))


@pytest.fixture(scope='module')
def straight(data_dir, tmp_path_factory):
  """An uninterrupted 300-step run: its workdir and final state."""
  workdir = str(tmp_path_factory.mktemp('straight') / 'run')
  loop.setup(_config(data_dir), workdir).train()
  return workdir, checkpoint.restore_arrays(workdir, 300)


@pytest.mark.parametrize('damage', sorted(damage_lib._DAMAGE))  # pylint: disable=protected-access
def test_damaged_newest_checkpoint_resumes_from_the_previous_and_ends_bit_identical(
    data_dir, straight, tmp_path, damage, capfd):
  workdir = str(tmp_path / 'run')
  shutil.copytree(straight[0], workdir)
  damage_lib._DAMAGE[damage][0](os.path.join(workdir, 'checkpoints', '300'))  # pylint: disable=protected-access
  loop.setup(_config(data_dir), workdir).train()
  err = capfd.readouterr().err
  assert 'resuming from step 200 of 300' in err
  set_aside = os.listdir(os.path.join(workdir, 'checkpoints_set_aside'))
  assert len(set_aside) == 1 and set_aside[0].startswith('300-')
  end = checkpoint.restore_arrays(workdir, 300)
  assert jax.tree.structure(end) == jax.tree.structure(straight[1])
  for a, b in zip(jax.tree.leaves(end), jax.tree.leaves(straight[1])):
    np.testing.assert_array_equal(a, b)
  # The steps after 200 ran twice but are recorded once.
  steps = [r['step'] for r in _records(workdir)]
  assert steps == [50, 100, 150, 200, 250, 300]


def test_half_written_newer_checkpoint_is_ignored(data_dir, straight, tmp_path, capfd):
  workdir = str(tmp_path / 'run')
  shutil.copytree(straight[0], workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '300'))
  partial = os.path.join(workdir, 'checkpoints', '300.orbax-checkpoint-tmp-1234')
  shutil.copytree(os.path.join(straight[0], 'checkpoints', '300'), partial)
  os.truncate(damage_lib._array_data_file(partial), 10)  # pylint: disable=protected-access
  loop.setup(_config(data_dir), workdir).train()
  assert 'resuming from step 200 of 300' in capfd.readouterr().err
  for a, b in zip(jax.tree.leaves(checkpoint.restore_arrays(workdir, 300)),
                  jax.tree.leaves(straight[1])):
    np.testing.assert_array_equal(a, b)


def test_finished_run_says_so_and_eta_uses_this_sessions_rate(data_dir, straight, tmp_path, capfd):
  workdir = str(tmp_path / 'run')
  shutil.copytree(straight[0], workdir)
  loop.setup(_config(data_dir), workdir).train()
  assert 'already finished: the checkpoint is at step 300, of a run of 300' in capfd.readouterr().err
  # A shorter run asked for names the checkpoint's step, not the run's end.
  loop.setup(_config(data_dir, num_train_steps=250), workdir).train()
  assert 'the checkpoint is at step 300, of a run of 250' in capfd.readouterr().err
  # Resumed at 200 of 400: after 100 more steps the ETA is about the time they took,
  # not (elapsed / 300 done) * 100, which would be a third of it.
  shutil.rmtree(workdir)
  shutil.copytree(straight[0], workdir)
  from train import metrics  # pylint: disable=g-import-not-at-top
  writer = metrics.MetricWriter(workdir, 400, start_step=200)
  writer.start_time -= 100.0  # as if the 100 steps since the resume took 100 s
  writer.write(300, 'train', {'loss': 1.0})
  writer.close()
  writer_lines = capfd.readouterr().err.splitlines()
  assert writer_lines[-1].endswith('100s elapsed, eta 100s'), writer_lines[-1]
  # The records of steps after the resume point were dropped before appending.
  assert [r['step'] for r in _records(workdir)] == [50, 100, 150, 200, 300]


def test_profile_steps_write_a_trace_viewable_in_tensorboard(data_dir, tmp_path):
  workdir = tmp_path / 'profiled'
  loop.setup(_config(data_dir, num_train_steps=6, profile_steps=(2, 4),
                    **{'optimizer.warmup_steps': 1}), str(workdir)).train()
  traces = list((workdir / 'profile').rglob('*.xplane.pb'))
  assert len(traces) == 1 and traces[0].stat().st_size > 0


@pytest.mark.parametrize('seed', [-1, None, 2**32, 2**63])
def test_a_bad_seed_is_refused_before_anything_is_written(data_dir, tmp_path, seed):
  # A negative seed failed in the input pipeline, after the work directory was written; 2**32
  # initialised as 0 does (PRNGKey keeps 32 bits), 2**63 was an OverflowError traceback.
  workdir = str(tmp_path / 'w')
  message = f'config.seed must be an integer in [0, 2**32), got {seed!r}.'
  with pytest.raises(ValueError, match=re.escape(message)):
    loop.setup(_config(data_dir, seed=seed), workdir)
  assert not os.path.exists(workdir)


@pytest.mark.parametrize('steps', [(4, 2), (3,), (-1, 2)])
def test_bad_profile_steps_are_refused(data_dir, tmp_path, steps):
  with pytest.raises(ValueError, match=r'config.profile_steps must be \(first, end\)'):
    loop.setup(_config(data_dir, profile_steps=steps), str(tmp_path / 'w'))
