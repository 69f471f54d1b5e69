"""The loop's schedules and promises, on small digits runs in this process: logs, evaluations
and checkpoints on and off their intervals (the last step always) with keep-N, a stop at a
step no interval is due on resuming bit-identical with every record once, a finished run
reporting again without writing, non-finite streaks counted in a row, the lock freed however
a run ends, a failing write in one sentence, which config changes a resumed run may make, and
the counts, seed, average and profile window refused before anything is written."""

import errno
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest

from experiments.configs import digits_mlp
from tests.messages import one_sentence
from tests.train import loop_patches
from train import checkpoint
from train import loop
from train import optim
from train import workdir as workdir_lib

# 7 steps: logs every 2 (and at 7), evaluations every 3 (and at 7), checkpoints every 2
# (and at 7) of which the last 2 are kept.
_STEPS, _STOP_AT = 7, 5


def _config(data_dir, **overrides):
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.num_train_steps = _STEPS
  config.log_every_steps = 2
  config.eval_every_steps = 3
  config.checkpoint_every_steps = 2
  config.checkpoints_to_keep = 2
  config.optimizer.warmup_steps = 2
  for key, value in overrides.items():
    config[key] = value
  return config


def _records(workdir, split):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


def _checkpoint_steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())


def _assert_same_arrays(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def _assert_free(workdir):
  workdir_lib.acquire(workdir).release()  # raises if a run still holds it


@pytest.fixture(scope='module')
def straight(data_dir, tmp_path_factory):
  """An uninterrupted run: its work directory and the metrics `train` returned."""
  workdir = str(tmp_path_factory.mktemp('straight') / 'run')
  run = loop.setup(_config(data_dir), workdir)
  final = run.train()
  assert not run.lock.held
  _assert_free(workdir)  # while `run` still holds its Lock object
  return workdir, final


def test_logs_evaluations_and_checkpoints_follow_their_intervals_and_the_last_step(data_dir,
                                                                                   straight):
  workdir, final = straight
  train, evals = _records(workdir, 'train'), _records(workdir, 'eval')
  assert [r['step'] for r in train] == [2, 4, 6, 7]
  assert [r['step'] for r in evals] == [3, 6, 7]
  assert {k: v for k, v in evals[-1].items() if k not in ('step', 'split')} == final
  # Saved at 2, 4, 6 and (off the interval) 7; the last two kept.
  assert _checkpoint_steps(workdir) == [6, 7]
  saved = checkpoint.restore_arrays(workdir)
  assert int(saved['step']) == _STEPS
  # Each record's learning rate is the one its last step ran at: step k ran at lr(k - 1).
  schedule = optim.make_schedule(_config(data_dir).optimizer, _STEPS)
  for record in train:
    assert record['learning_rate'] == pytest.approx(float(schedule(record['step'] - 1)), rel=1e-5)


def test_a_stop_off_every_interval_saves_there_and_the_rerun_continues_exactly(
    data_dir, straight, tmp_path, monkeypatch, capfd):
  workdir = str(tmp_path / 'stopped')
  # Each train log's throughput counts the steps of its interval, from the resumed step on
  # resuming; each evaluation's hooks get the evaluated step.
  intervals, hook_steps = [], []
  log_train, run_hooks = loop.Run._log_train, loop.Run.run_hooks  # pylint: disable=protected-access

  def counting_log_train(self, writer, step, pending, last_log):
    intervals.append((step - last_log[0], len(pending)))
    return log_train(self, writer, step, pending, last_log)

  def recording_run_hooks(self, state, step):
    hook_steps.append(step)
    return run_hooks(self, state, step)

  monkeypatch.setattr(loop.Run, '_log_train', counting_log_train)
  monkeypatch.setattr(loop.Run, 'run_hooks', recording_run_hooks)
  with monkeypatch.context() as patch:
    loop_patches.stop_during_step(_STOP_AT, patch)
    run = loop.setup(_config(data_dir), workdir)
    with pytest.raises(loop.Stopped) as stopped:
      run.train()
  assert str(stopped.value) == f'stopped at step {_STOP_AT}; rerun the same command to resume'
  assert stopped.value.exit_code == 128 + signal.SIGTERM
  assert not run.lock.held
  _assert_free(workdir)
  # Saved at the step it stopped at, though no checkpoint was due there, with the iterator's
  # position; logged up to that step; not evaluated (none was due).
  assert _checkpoint_steps(workdir) == [4, _STOP_AT]
  ckpt = checkpoint.Checkpointer(workdir, 2, 2)
  _, data_state = ckpt.restore(run.parallel.abstract_state(run.init_fn, run.rng), step=_STOP_AT)
  ckpt.close()
  assert data_state == {'iterator': {'next_index': _STOP_AT}}
  assert [r['step'] for r in _records(workdir, 'train')] == [2, 4, _STOP_AT]
  assert [r['step'] for r in _records(workdir, 'eval')] == [3]
  capfd.readouterr()

  final = loop.setup(_config(data_dir), workdir).train()
  assert f'resuming from step {_STOP_AT} of {_STEPS}' in capfd.readouterr().err
  # The same data order, dropout draws and optimiser state as the run never stopped.
  _assert_same_arrays(checkpoint.restore_arrays(workdir, _STEPS),
                      checkpoint.restore_arrays(straight[0], _STEPS))
  assert final == straight[1]
  assert _records(workdir, 'eval') == _records(straight[0], 'eval')
  assert [r['step'] for r in _records(workdir, 'train')] == [2, 4, _STOP_AT, 6, 7]
  assert _checkpoint_steps(workdir) == [6, 7]
  assert intervals == [(2, 2), (2, 2), (1, 1), (1, 1), (1, 1)]
  assert hook_steps == [3, 6, 7]


def test_a_finished_run_reports_its_final_evaluation_again_and_writes_nothing(
    data_dir, straight, tmp_path, capfd):
  workdir = str(tmp_path / 'finished')
  shutil.copytree(straight[0], workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = f.read()
  steps = _checkpoint_steps(workdir)
  capfd.readouterr()
  final = loop.setup(_config(data_dir), workdir).train()
  assert f'already finished: the checkpoint is at step {_STEPS}, of a run of {_STEPS}' in (
      capfd.readouterr().err)
  assert final == straight[1]
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    assert f.read() == records
  assert _checkpoint_steps(workdir) == steps


def test_non_finite_steps_apart_do_not_add_up_to_a_streak(data_dir, tmp_path, monkeypatch):
  # max_bad_steps counts steps in a row: two poisoned batches with good ones between must
  # not stop a run that allows two in a row.
  loop_patches.poison_batches((2, 5), monkeypatch)
  workdir = str(tmp_path / 'run')
  loop.setup(_config(data_dir, max_bad_steps=2, log_every_steps=_STEPS), workdir).train()
  [record] = _records(workdir, 'train')
  assert (record['step'], record['skipped_steps']) == (_STEPS, 2)
  # The record's loss and gradient norm are those of the steps kept.
  assert np.isfinite(record['loss']) and np.isfinite(record['grad_norm'])


def test_a_streak_stops_the_run_with_the_skipped_steps_on_record(data_dir, tmp_path, monkeypatch):
  # The interval in progress is logged before stopping, though no log was due.
  loop_patches.poison_batches((2, 3, 4), monkeypatch)
  workdir = str(tmp_path / 'run')
  run = loop.setup(_config(data_dir, max_bad_steps=3, log_every_steps=_STEPS), workdir)
  with pytest.raises(loop.Stopped, match=r'^The loss or gradients were not finite for 3 steps in '
                                         r'a row \(steps 2-4\), each skipped; the run stops at '
                                         r'step 4 ') as stopped:
    run.train()
  assert stopped.value.exit_code == 1 and not run.lock.held
  assert [(r['step'], r['skipped_steps']) for r in _records(workdir, 'train')] == [(4, 3)]


# A failing last write ---------------------------------------------------------------------

_NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_save_failing_at_the_end_stops_in_one_sentence_and_frees_the_lock(data_dir, tmp_path,
                                                                            monkeypatch):
  close = checkpoint.Checkpointer.close

  def failing_close(self):
    close(self)
    raise _NO_SPACE

  monkeypatch.setattr(checkpoint.Checkpointer, 'close', failing_close)
  workdir = str(tmp_path / 'run')
  run = loop.setup(_config(data_dir, num_train_steps=3), workdir)
  one_sentence(run.train, f"Writing a checkpoint in '{workdir}/checkpoints' failed (No space left "
                          'on device); the checkpoints written before are intact: free space or '
                          'fix permissions and rerun.')
  assert not run.lock.held
  _assert_free(workdir)


def test_the_first_failure_is_the_one_reported(data_dir, tmp_path, monkeypatch):
  # A save that fails (a read-only file system) and then a close that fails too: the save's
  # failure is the cause, and is the one said.
  close = checkpoint.Checkpointer.close

  def failing_save(*_, **__):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))

  def failing_close(self):
    close(self)
    raise _NO_SPACE

  monkeypatch.setattr(checkpoint.Checkpointer, 'save', failing_save)
  monkeypatch.setattr(checkpoint.Checkpointer, 'close', failing_close)
  workdir = str(tmp_path / 'run')
  run = loop.setup(_config(data_dir, num_train_steps=3), workdir)
  one_sentence(run.train, f"Writing a checkpoint in '{workdir}/checkpoints' failed (Read-only file "
                          'system); the checkpoints written before are intact')
  assert not run.lock.held


@pytest.mark.parametrize('error,reason', [
    (ValueError('RESOURCE_EXHAUSTED: writing "d/x": Disk quota exceeded [source locations]'),
     'Disk quota exceeded'),
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES)), 'Permission denied'),
    (OSError(errno.EIO, os.strerror(errno.EIO)), 'Input/output error'),
    # As TensorStore reports them: the OS's words inside a status of its own.
    (ValueError('UNKNOWN: Error writing "d/x": Read-only file system [source locations]\nmore'),
     'Read-only file system'),
    (ValueError('RESOURCE_EXHAUSTED: Error writing "d/x": No space left on device'),
     'No space left on device'),
    (RuntimeError('the write was cancelled\nat a later line'),
     'RuntimeError: the write was cancelled'),
])
def test_a_failed_write_names_its_reason(error, reason):
  message = str(loop._save_failed('/w/checkpoints', error))  # pylint: disable=protected-access
  assert message == (f"Writing a checkpoint in '/w/checkpoints' failed ({reason}); the checkpoints "
                     'written before are intact: free space or fix permissions and rerun.')


def test_a_setup_that_fails_on_an_existing_work_directory_frees_its_lock(data_dir, straight,
                                                                         tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(straight[0], workdir)
  config = _config(data_dir)
  config.model.features = (128, 10)
  with pytest.raises(ValueError, match='were written with another config') as refused:
    loop.setup(config, workdir)
  _assert_free(workdir)  # while the traceback, and the frames it holds, are still alive
  del refused


def test_a_run_refused_for_a_directory_in_use_touches_nothing_there(data_dir, straight, tmp_path):
  # The lock is taken before any check: the refused run must not set aside (or otherwise
  # change) the checkpoints of the run that holds the directory.
  workdir = str(tmp_path / 'run')
  shutil.copytree(straight[0], workdir)
  with open(os.path.join(workdir, 'checkpoints', str(_STEPS), 'state', '_METADATA'), 'wb') as f:
    f.write(b'not json')  # damage the holder would set aside itself, if it came to that
  with workdir_lib.acquire(workdir):
    with pytest.raises(ValueError, match=f'^The work directory {workdir!r} is in use by process '):
      loop.setup(_config(data_dir), workdir)
  assert _checkpoint_steps(workdir) == [6, 7]
  assert not os.path.exists(os.path.join(workdir, 'checkpoints_set_aside'))


# Config changes on resuming (judged from the run's record, without training) ------------------


def _recorded_run(tmp_path, config, checkpoint_steps=(10,)):
  """A work directory holding `config` as its run's record and empty checkpoint folders."""
  workdir = str(tmp_path / 'run')
  for step in checkpoint_steps:
    os.makedirs(os.path.join(workdir, 'checkpoints', str(step)))
  os.makedirs(os.path.join(workdir, 'checkpoints'), exist_ok=True)
  loop._write_config(config, workdir)  # pylint: disable=protected-access
  return workdir


def _changed(key, value):
  config = digits_mlp.get_config()
  *path, name = key.split('.')
  target = config
  for part in path:
    target = target[part]
  target[name] = value
  return config


@pytest.mark.parametrize('key,value', [
    ('num_train_steps', 3000), ('log_every_steps', 7), ('eval_every_steps', 7),
    ('checkpoint_every_steps', 7), ('checkpoints_to_keep', 7), ('max_bad_steps', 7),
    ('profile_steps', (3, 5)), ('parallel.mode', 'fsdp'), ('parallel.fsdp_min_size', 0),
    ('data.data_dir', '/elsewhere'), ('data.num_threads', 4),
    ('data.options.source_dir', '/elsewhere'),
])
def test_a_resumed_run_may_change_how_long_how_often_and_where_it_runs(tmp_path, key, value):
  workdir = _recorded_run(tmp_path, digits_mlp.get_config())
  loop.check_record(_changed(key, value), workdir)


@pytest.mark.parametrize('key,value', [
    ('seed', 1), ('optimizer.learning_rate', 0.1), ('model.features', (8, 10)),
    ('global_batch_size', 32), ('data.name', 'mnist1d'), ('data.train_split', 'train[:50%]'),
])
def test_a_resumed_run_may_not_change_what_it_trains(tmp_path, key, value):
  workdir = _recorded_run(tmp_path, digits_mlp.get_config())
  one_sentence(lambda: loop.check_record(_changed(key, value), workdir),
               f"The checkpoints in '{workdir}' were written with another config: {key} (",
               '--allow_config_change to resume under the new one on purpose.')
  loop.check_record(_changed(key, value), workdir, allow_config_change=True)


def test_many_changes_are_counted_after_the_first_five(tmp_path):
  workdir = _recorded_run(tmp_path, digits_mlp.get_config())
  config = digits_mlp.get_config()
  for name in ('b1', 'b2', 'eps', 'learning_rate', 'momentum', 'weight_decay'):
    config.optimizer[name] = 0.5
  config.optimizer.warmup_steps = 7
  message = one_sentence(lambda: loop.check_record(config, workdir))
  assert message.count('optimizer.') == 5 and ' and 2 more differ; ' in message


def test_a_run_that_saved_no_checkpoint_may_restart_under_any_config(tmp_path):
  # Its record says what it was started with, but nothing was trained under it yet (a folder
  # left by an unfinished first save is no checkpoint).
  workdir = _recorded_run(tmp_path, digits_mlp.get_config(), checkpoint_steps=())
  os.makedirs(os.path.join(workdir, 'checkpoints', '10.orbax-checkpoint-tmp-1700000000000000'))
  loop.check_record(_changed('seed', 1), workdir)
  assert loop.note_schedule_change(_changed('num_train_steps', 4000), workdir) is None


def test_a_new_length_says_how_the_rate_at_the_newest_checkpoint_moves(tmp_path):
  workdir = _recorded_run(tmp_path, digits_mlp.get_config(), checkpoint_steps=(500, 1500))
  config = _changed('num_train_steps', 3000)
  before = float(optim.make_schedule(config.optimizer, 2000)(1500))
  after = float(optim.make_schedule(config.optimizer, 3000)(1500))
  assert abs(before - after) > 0.1 * after
  assert loop.note_schedule_change(config, workdir) == (
      "Resuming at step 1500 with num_train_steps 2000 -> 3000: the 'warmup_cosine' "
      f'learning-rate schedule is laid out over the new length, so the rate there goes from '
      f'{before:.4g} to {after:.4g}.')
  # The same length, or a constant rate, moves nothing and says nothing.
  assert loop.note_schedule_change(_changed('log_every_steps', 7), workdir) is None
  constant = _changed('optimizer.schedule', 'constant')
  workdir = _recorded_run(tmp_path / 'constant', constant, checkpoint_steps=(500,))
  constant.num_train_steps = 3000
  assert loop.note_schedule_change(constant, workdir) is None


def test_profile_window_traces_exactly_its_steps(tmp_path, monkeypatch):
  events = []
  monkeypatch.setattr(jax.profiler, 'start_trace', lambda directory: events.append('start'))
  monkeypatch.setattr(jax.profiler, 'stop_trace', lambda: events.append('stop'))
  window = loop._ProfileWindow(str(tmp_path), (2, 4))  # pylint: disable=protected-access
  for step in range(6):
    window.before(step)
    events.append(step)
    window.after(step, None)
  window.close()
  assert events == [0, 1, 'start', 2, 3, 'stop', 4, 5]


# Refused before anything is written -------------------------------------------------------------

_COUNTS = ('num_train_steps', 'global_batch_size', 'eval_batch_size', 'log_every_steps',
           'eval_every_steps', 'checkpoint_every_steps', 'checkpoints_to_keep', 'grad_accum_steps',
           'max_bad_steps')


@pytest.mark.parametrize('value', [0, -1, True])  # True is an int to Python, not a count
@pytest.mark.parametrize('name', _COUNTS)
def test_a_count_or_interval_below_one_or_a_bool_is_refused(tmp_path, name, value):
  config = digits_mlp.get_config()
  config[name] = value
  workdir = tmp_path / 'w'
  assert one_sentence(lambda: loop.setup(config, str(workdir))) == (
      f'config.{name} must be a positive integer, got {value!r}.')
  assert not workdir.exists()


@pytest.mark.parametrize('key,value,message', [
    ('seed', True, 'config.seed must be an integer in [0, 2**32), got True.'),
    ('seed', 2**32, 'config.seed must be an integer in [0, 2**32), got 4294967296.'),
    ('ema_decay', 1.0, 'config.ema_decay must lie in [0, 1) (0 keeps no average), got 1.0.'),
    ('ema_decay', -0.1, 'config.ema_decay must lie in [0, 1) (0 keeps no average), got -0.1.'),
    ('profile_steps', (3, 3), 'config.profile_steps must be (first, end) with 0 <= first < end, '
                              'or (), got (3, 3).'),
])
def test_a_seed_average_or_profile_window_out_of_range_is_refused(tmp_path, key, value, message):
  config = digits_mlp.get_config()
  config[key] = value
  workdir = tmp_path / 'w'
  assert one_sentence(lambda: loop.setup(config, str(workdir))) == message
  assert not workdir.exists()


def test_a_negative_reader_thread_count_is_refused_before_anything_is_written(tmp_path):
  config = digits_mlp.get_config()
  config.data.num_threads = -1
  workdir = tmp_path / 'w'
  assert one_sentence(lambda: loop.setup(config, str(workdir))) == (
      'config.data.num_threads must be a non-negative integer (0 reads in the training thread) '
      'or None (chosen by the data source), got -1.')
  assert not workdir.exists()


def test_no_reader_threads_is_allowed(tmp_path):
  # 0 reads in the training thread: accepted, so the check after it (the profile window) speaks.
  config = digits_mlp.get_config()
  config.data.num_threads = 0
  config.profile_steps = (3, 3)
  assert one_sentence(lambda: loop.setup(config, str(tmp_path / 'w'))).startswith(
      'config.profile_steps must be')


def test_a_file_where_the_work_directory_goes_is_named(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  workdir = blocker / 'run'
  assert one_sentence(lambda: loop.setup(digits_mlp.get_config(), str(workdir))) == (
      f'The work directory {str(workdir)!r} is not writable ({str(blocker)!r} is a file).')


def test_a_record_that_is_not_json_is_named(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / loop.CONFIG_FILE).write_text('{"seed": 0,\n')
  path = str(workdir / loop.CONFIG_FILE)
  assert one_sentence(lambda: loop.read_config(str(workdir))) == (
      f"{path!r} is not a readable config (Expecting property name enclosed in double quotes at "
      'line 2).')


def test_a_run_that_fails_before_its_first_step_frees_its_work_directory(data_dir, tmp_path,
                                                                         monkeypatch):
  # Restoring (here: no checkpoint could be read, whose message says a rerun starts from
  # scratch) came before the part of train() that frees the lock, so a rerun in the same
  # process was refused as the directory's holder.
  workdir = str(tmp_path / 'run')
  run = loop.setup(_config(data_dir), workdir)

  def unreadable(*unused):
    raise ValueError('None of the checkpoints could be restored.')

  monkeypatch.setattr(run.checkpointer, 'restore_latest', unreadable)
  with pytest.raises(ValueError, match='None of the checkpoints'):
    run.train()
  assert not run.lock.held
  _assert_free(workdir)
  monkeypatch.undo()
  rerun = loop.setup(_config(data_dir), workdir)
  assert rerun.train()['accuracy'] > 0
