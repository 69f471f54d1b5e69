"""The one training loop: `train_and_evaluate(config, workdir)`.

`setup` checks every user input and proves the config by tracing the first
train and eval step (`jax.eval_shape`, nothing is compiled), so a wrong flag
stops in seconds with one sentence; `Run.train` then compiles and runs. The
loop dispatches step N+1 before reading step N's metrics (the host never waits
on the device between logs), donates the state buffers, evaluates
periodically, runs the task's eval hooks, and checkpoints so that a killed run
resumes exactly. Everything family-specific is the task's (`train/tasks/`).
"""

import dataclasses
import functools
import json
import os
import sys
import time
from typing import Any, Callable, Iterator

import jax
import ml_collections
import numpy as np

from data import inputs
from data import pipeline
from models import registry
from train import checkpoint, metrics as metrics_lib, optim, parallel as parallel_lib, step as step_lib
from train import preemption
from train import workdir as workdir_lib
from train import tasks
from train.state import init_train_state

CONFIG_FILE = 'config.json'
# Folded into the state's key for eval hooks (sampling), apart from every step's streams.
_HOOK_STREAM = 0x4007


def check_workdir(workdir: str) -> str:
  """The absolute `workdir` if it is, or can be created as, a writable folder; else one sentence.

  Creates nothing: a run creates its work directory only once every check passed.
  """
  workdir = os.path.abspath(workdir)
  existing = workdir
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ValueError(f'The work directory {workdir!r} is not writable ({existing!r} is a file).')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f'The work directory {workdir!r} is not writable (permission denied on '
                     f'{existing!r}).')
  return workdir


# Config keys a resumed run may change: how long it runs (a schedule other than 'constant'
# is then laid out over the new length, which the run says: `note_schedule_change`), how
# often it reports and saves, and where and how it runs (a checkpoint restores on any
# device count).
RESUMABLE_CHANGES = ('num_train_steps', 'log_every_steps', 'eval_every_steps',
                     'checkpoint_every_steps', 'checkpoints_to_keep', 'max_bad_steps',
                     'profile_steps', 'parallel.', 'data.data_dir', 'data.num_threads',
                     'data.options.source_dir')


def _flatten(tree, prefix='') -> dict:
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_flatten(value, f'{prefix}{key}.'))
    return out
  if isinstance(tree, (list, tuple)):
    tree = [_flatten(v, '') if isinstance(v, dict) else v for v in tree]
  return {prefix[:-1]: tree}


def check_record(config, workdir: str, allow_config_change: bool = False) -> None:
  """Refuses, in one sentence, to resume the checkpoints of `workdir` under a changed config."""
  path = os.path.join(workdir, CONFIG_FILE)
  checkpoints = os.path.join(workdir, 'checkpoints')
  if allow_config_change or not os.path.exists(path) or not os.path.isdir(checkpoints) or not any(
      name.isdigit() for name in os.listdir(checkpoints)):
    return
  saved = _flatten(json.loads(read_config(workdir).to_json()))
  wanted = _flatten(json.loads(config.to_json_best_effort()))
  changed = sorted(key for key in set(saved) | set(wanted)
                   if saved.get(key) != wanted.get(key)
                   and not any(key == c or (c.endswith('.') and key.startswith(c))
                               for c in RESUMABLE_CHANGES))
  if changed:
    shown = ', '.join(f'{k} ({saved.get(k)!r} -> {wanted.get(k)!r})' for k in changed[:5])
    more = f' and {len(changed) - 5} more' if len(changed) > 5 else ''
    raise ValueError(f'The checkpoints in {workdir!r} were written with another config: '
                     f'{shown}{more} differ; use a new --workdir, the config that wrote them, or '
                     '--allow_config_change to resume under the new one on purpose.')


def note_schedule_change(config, workdir: str) -> str | None:
  """The line said when a resumed run changes num_train_steps under a schedule laid out over
  it (every one but 'constant'), with the learning rate at the resumed step before and after;
  None otherwise."""
  checkpoints = os.path.join(workdir, 'checkpoints')
  steps = [int(n) for n in os.listdir(checkpoints) if n.isdigit()] if os.path.isdir(checkpoints) else []
  if not steps or not os.path.exists(os.path.join(workdir, CONFIG_FILE)):
    return None
  saved = read_config(workdir)
  before, after = saved.num_train_steps, config.num_train_steps
  schedule = config.optimizer.get('schedule', 'constant')
  if before == after or schedule == 'constant':
    return None
  try:
    rates = [float(optim.make_schedule(c.optimizer, n)(max(steps)))
             for c, n in ((saved, before), (config, after))]
  except Exception:  # pylint: disable=broad-except
    return None  # a config the optimizer's own checks will refuse
  return (f'Resuming at step {max(steps)} with num_train_steps {before} -> {after}: the '
          f'{schedule!r} learning-rate schedule is laid out over the new length, so the rate '
          f'there goes from {rates[0]:.4g} to {rates[1]:.4g}.')


def _check_positive(config, *names):
  for name in names:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f'config.{name} must be a positive integer, got {value!r}.')


@dataclasses.dataclass
class Run:
  """Everything one training run needs, built by `setup` without compiling."""
  config: ml_collections.ConfigDict
  workdir: str
  parallel: parallel_lib.Parallel
  model: Any
  task: tasks.Task
  tx: Any
  learning_rate_fn: Callable
  init_fn: Callable
  rng: Any
  train_source: Any
  eval_source: Any
  checkpointer: checkpoint.Checkpointer
  lock: Any = None  # the work directory's lock (`train.workdir`), released when training ends

  def train_iterator(self) -> Iterator:
    threads = self.config.data.get('num_threads')
    if threads is None:
      # Gathering from memory costs less than handing a batch between threads.
      threads = 0 if hasattr(self.train_source, 'gather') else 2
    return pipeline.train_iterator(
        self.train_source, global_batch_size=self.config.global_batch_size,
        seed=self.config.seed, preprocess=self.task.preprocess,
        process_index=jax.process_index(), process_count=jax.process_count(),
        num_threads=threads)

  def train_step_fn(self) -> Callable:
    """This run's pure `train_step(state, batch, axis_name=None)`, before compilation."""
    return functools.partial(step_lib.train_step, model=self.model, task=self.task, tx=self.tx,
                             learning_rate_fn=self.learning_rate_fn,
                             grad_accum_steps=self.config.get('grad_accum_steps', 1),
                             ema_decay=self.config.get('ema_decay', 0.0))

  def eval_step_fn(self) -> Callable:
    """This run's pure `eval_step(state, batch, index, axis_name=None)`."""
    return functools.partial(step_lib.eval_step, model=self.model, task=self.task)

  def eval_batches(self) -> Iterator:
    return pipeline.eval_batches(
        self.eval_source, global_batch_size=self.config.eval_batch_size,
        preprocess=self.task.preprocess, process_index=jax.process_index(),
        process_count=jax.process_count())

  def evaluate(self, eval_step, state) -> dict:
    """The task's finalized metrics over the whole eval split."""
    totals = None
    for index, batch in enumerate(self.eval_batches()):
      sums = eval_step(state, batch, np.int32(index))
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    return self.task.finalize(jax.device_get(totals))

  def run_hooks(self, state, step: int) -> dict:
    """The task's eval hooks on the evaluated variables (EMA parameters when kept)."""
    context = tasks.HookContext(
        module=self.model, variables={'params': state.eval_params, **state.model_state},
        rng=jax.random.fold_in(jax.random.fold_in(state.rng, _HOOK_STREAM), step), step=step)
    outputs = {}
    for hook in self.task.eval_hooks():
      outputs.update(hook(context))
    return outputs

  def train(self) -> dict:
    """Trains (resuming from the newest good checkpoint) and returns the final eval metrics.

    Raises `Stopped` when a stop signal, or `max_bad_steps` non-finite steps in a
    row, end the run early.
    """
    try:
      train_step, eval_step, train_iter, state, start_step, writer, evaluation_due = self._start()
    except BaseException:
      # Nothing trained yet: the checkpointer and the lock are freed all the same, so a rerun
      # in this process (a notebook's) is not refused as the directory's holder.
      try:
        self._close_checkpointer()
      except Exception:  # pylint: disable=broad-except
        pass  # the error on its way up is the one to report
      if self.lock is not None:
        self.lock.release()
      raise
    config, par = self.config, self.parallel
    total = config.num_train_steps
    # In a multi-process run every process must stop at the same step: each
    # step reduces every process's stop request over the global batch.
    shared_stop = jax.process_count() > 1
    profile = _ProfileWindow(self.workdir, config.get('profile_steps') or ())

    pending, log_due, last_log = [], None, (start_step, time.time())
    previous, bad_in_a_row = None, 0
    eval_metrics, stopped = {}, None
    with preemption.StopRequest() as stop:
      try:
        # Already finished: report the final model again. Resuming after a stop that skipped
        # the evaluation due at this step: run it (every process) and record it unless an
        # earlier resume already did.
        if start_step >= total or evaluation_due:
          canonical = par.to_canonical(state)
          eval_metrics = self.evaluate(eval_step, canonical)
          if evaluation_due:
            outputs = self.run_hooks(canonical, start_step)
            if not writer.recorded(start_step, 'eval'):  # (process 0 decides what it writes)
              writer.write(start_step, 'eval', eval_metrics)
              writer.write_outputs(start_step, outputs)
          last_log = (start_step, time.time())
        for step in range(start_step, total):
          profile.before(step)
          batch = next(train_iter)
          if shared_stop:
            batch['stop_requested'] = np.full(len(jax.tree.leaves(batch)[0]), stop.requested, np.int32)
          state, step_metrics = train_step(state, par.shard_batch(batch))
          profile.after(step, state)
          # Step `step` is now dispatched; reading the metrics of earlier steps
          # lets the device work while the host writes logs.
          stop_agreed = False
          if previous is not None:
            control = jax.device_get({k: previous[k] for k in ('skipped', 'stop_requested')
                                      if k in previous})
            stop_agreed = bool(control.get('stop_requested', 0))
            bad_in_a_row = bad_in_a_row + 1 if control['skipped'] else 0
          if log_due is not None:
            last_log = self._log_train(writer, log_due, pending, last_log)
            pending, log_due = [], None
          if bad_in_a_row >= config.max_bad_steps:
            if pending:  # the steps up to `step`, so the skipped ones are on record
              self._log_train(writer, step, pending, last_log)
            raise Stopped(
                f'The loss or gradients were not finite for {bad_in_a_row} steps in a row '
                f'(steps {step - bad_in_a_row + 1}-{step}), each skipped; the run stops at step '
                f'{step} with its last finite state and its checkpoints intact (lower '
                'optimizer.learning_rate or set optimizer.grad_clip_norm).', exit_code=1)
          pending.append(step_metrics)
          previous = step_metrics
          done = step + 1
          # A multi-process run stops on the previous step's reduced request, which
          # every process reads alike, so all stop after the same step.
          stopping = stop_agreed if shared_stop else stop.requested
          if done % config.log_every_steps == 0 or done == total or stopping:
            log_due = done
          eval_due = done % config.eval_every_steps == 0 or done == total
          # A stop saves and exits at once; the checkpoint says the evaluation is still due.
          is_eval = eval_due and not stopping
          is_ckpt = done % config.checkpoint_every_steps == 0 or done == total or stopping
          if is_eval or is_ckpt:
            canonical = par.to_canonical(state)
            if is_ckpt:
              # Orbax copies the arrays to the host as soon as `save` is called; with
              # the step still running, those copies can hold the threads that a
              # multi-device CPU step needs for its collectives.
              jax.block_until_ready(canonical)
              self._save(done, canonical, train_iter, force=done == total or stopping,
                         evaluation_due=eval_due and stopping)
            if is_eval:
              jax.block_until_ready(canonical)  # the step's own time stays in its interval
              began = time.time()
              eval_metrics = self.evaluate(eval_step, canonical)
              writer.write(done, 'eval', eval_metrics)
              writer.write_outputs(done, self.run_hooks(canonical, done))
              # Training throughput leaves the evaluation's time out of its interval.
              last_log = (last_log[0], last_log[1] + time.time() - began)
          if stopping:
            stopped = Stopped(f'stopped at step {done}; rerun the same command to resume',
                              exit_code=stop.exit_code or 1)
            break
        if log_due is not None:
          self._log_train(writer, log_due, pending, last_log)
      finally:
        # Each is closed even if another fails; while an error is on its way up, a
        # second one (e.g. the same full disk) must not replace it.
        in_flight = sys.exc_info()[1] is not None
        errors = []
        for close in (profile.close, writer.close, self._close_checkpointer):
          try:
            close()
          except Exception as e:  # pylint: disable=broad-except
            errors.append(e)
        if self.lock is not None:
          self.lock.release()
        if errors and not in_flight:
          raise errors[0]
    if stopped is not None:
      raise stopped
    return eval_metrics

  def _start(self) -> tuple:
    """(train step, eval step, train iterator, state in the run's layout, its step, metric
    writer, whether an evaluation is due): the newest good checkpoint restored, or a new state."""
    par, total = self.parallel, self.config.num_train_steps
    abstract = par.abstract_state(self.init_fn, self.rng)
    train_iter = self.train_iterator()
    restored = self.checkpointer.restore_latest(abstract)
    evaluation_due = False
    if restored is None:
      state = par.init_state(self.init_fn, self.rng)
    else:
      state, data_state, _ = restored
      train_iter.set_state(data_state['iterator'])
      # A stop skipped the evaluation due at the checkpoint's step: it runs on resuming.
      evaluation_due = bool(data_state.get('evaluation_due', False))
    start_step = int(jax.device_get(state.step))
    if start_step:
      _say(f'already finished: the checkpoint is at step {start_step}, of a run of {total}'
           if start_step >= total else
           f'resuming from step {start_step} of {total}')
    train_step = par.compile_train_step(self.train_step_fn(), abstract)
    eval_step = par.compile_eval_step(self.eval_step_fn(), abstract)
    writer = metrics_lib.MetricWriter(self.workdir, total, start_step=start_step)
    try:
      state = par.to_run_layout(state)
    except BaseException:
      writer.close()
      raise
    return train_step, eval_step, train_iter, state, start_step, writer, evaluation_due

  def _save(self, step: int, state, train_iter, *, force: bool, evaluation_due: bool) -> None:
    data_state = {'iterator': train_iter.get_state()}
    if evaluation_due:  # read back by `train` on resuming
      data_state['evaluation_due'] = True
    try:
      self.checkpointer.save(step, state, data_state, force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise _save_failed(self.checkpointer.directory, e) from e

  def _close_checkpointer(self) -> None:
    """Waits for the last asynchronous save; a failed write stops in one sentence."""
    try:
      self.checkpointer.close()
    except Exception as e:  # pylint: disable=broad-except
      raise _save_failed(self.checkpointer.directory, e) from e

  def _log_train(self, writer, step, pending, last_log):
    """Logs the log interval: its weighted sums finalized (skipped steps left out), their
    mean gradient norm, the learning rate of the logged step, how many steps were skipped and
    the training examples per second over the interval's wall time less its evaluations'."""
    pending = jax.device_get(pending)
    kept = [m for m in pending if not m['skipped']] or pending
    totals = jax.tree.map(lambda *xs: np.sum(xs), *[m['totals'] for m in kept])
    values = self.task.finalize(totals)
    values['grad_norm'] = float(np.mean([m['grad_norm'] for m in kept]))
    values['learning_rate'] = float(pending[-1]['learning_rate'])
    values['skipped_steps'] = int(sum(m['skipped'] for m in pending))
    now = time.time()
    steps = step - last_log[0]
    values['examples_per_second'] = steps * self.config.global_batch_size / max(now - last_log[1], 1e-9)
    writer.write(step, 'train', values)
    return step, now


class Stopped(Exception):
  """The run stopped before its last step; `str(e)` says why and what to do."""

  def __init__(self, message: str, exit_code: int = 1):
    super().__init__(message)
    self.exit_code = exit_code


def _say(line: str) -> None:
  if jax.process_index() == 0:
    print(line, file=sys.stderr, flush=True)


# How the OS words the write failures a person can fix; Orbax and TensorStore wrap
# them in exceptions of their own (OSError, or ValueError: RESOURCE_EXHAUSTED: ...).
_WRITE_FAILURES = ('No space left on device', 'Disk quota exceeded', 'Read-only file system',
                   'Permission denied')


def _save_failed(directory: str, error: Exception) -> ValueError:
  # Orbax writes in the background and reports a failure at the next save or at the
  # end, so the step that failed is not always the one being saved now.
  text = str(error)
  reason = next((r for r in _WRITE_FAILURES if r in text), None)
  if reason is None:
    reason = getattr(error, 'strerror', None) or f'{type(error).__name__}: {text.splitlines()[0][:200] if text else ""}'
  return ValueError(f'Writing a checkpoint in {directory!r} failed ({reason}); the checkpoints '
                    'written before are intact: free space or fix permissions and rerun.')


class _ProfileWindow:
  """Records a `jax.profiler` trace of steps [start, stop) into WORKDIR/profile (TensorBoard's
  profile tab reads it)."""

  def __init__(self, workdir: str, steps):
    self.start, self.stop = (tuple(steps) + (None, None))[:2]
    self.directory = os.path.join(workdir, 'profile')
    self.active = False

  def before(self, step: int) -> None:
    if self.start is not None and step == self.start and jax.process_index() == 0:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after(self, step: int, state) -> None:
    if self.active and step + 1 >= self.stop:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      _say(f'profile of steps {self.start}-{self.stop - 1} written to {self.directory}')


def _prove(what: str, fn: Callable):
  """Runs `fn` (a trace); any failure becomes one sentence saying what failed."""
  try:
    return fn()
  except ValueError as e:
    if '\n' not in str(e):
      raise
    error = e
  except Exception as e:  # pylint: disable=broad-except
    error = e
  first_line = (str(error).strip().splitlines() or [''])[0].rstrip('.')
  raise ValueError(f'This config fails when {what}: {type(error).__name__}: {first_line}.') from error


def setup(config: ml_collections.ConfigDict, workdir: str, *,
          allow_config_change: bool = False) -> Run:
  """Validates `config` and builds a `Run`; raises ValueError/FileNotFoundError in one sentence.

  Every check (options, data, a trace of the first train and eval step, the
  checkpoints already in `workdir`) runs before anything is written: a new work
  directory is created only when all passed.
  """
  _check_positive(config, 'num_train_steps', 'global_batch_size', 'eval_batch_size',
                  'log_every_steps', 'eval_every_steps', 'checkpoint_every_steps',
                  'checkpoints_to_keep', 'grad_accum_steps', 'max_bad_steps')
  seed = config.get('seed', 0)
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
    # PRNGKey keeps a seed's low 32 bits: 2**32 would initialise as 0 does (and 2**63 and up
    # were an OverflowError traceback).
    raise ValueError(f'config.seed must be an integer in [0, 2**32), got {seed!r}.')
  ema_decay = config.get('ema_decay', 0.0)
  if not 0 <= ema_decay < 1:
    raise ValueError(f'config.ema_decay must lie in [0, 1) (0 keeps no average), got {ema_decay!r}.')
  threads = config.get('data', {}).get('num_threads')
  if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                              or threads < 0):
    raise ValueError(f'config.data.num_threads must be a non-negative integer (0 reads in the '
                     f'training thread) or None (chosen by the data source), got {threads!r}.')
  profile_steps = tuple(config.get('profile_steps') or ())
  if profile_steps and not (len(profile_steps) == 2 and 0 <= profile_steps[0] < profile_steps[1]):
    raise ValueError(f'config.profile_steps must be (first, end) with 0 <= first < end, or (), '
                     f'got {profile_steps!r}.')
  workdir = check_workdir(workdir)
  # One run per work directory, held by process 0 of a multi-process run: taken at
  # once on an existing directory, and on a new one as soon as it is created.
  lead = jax.process_index() == 0
  lock = workdir_lib.acquire(workdir) if lead and os.path.isdir(workdir) else None
  try:
    run, workdir_files = _build(config, workdir, allow_config_change)
    # Every check passed: from here on the run writes.
    os.makedirs(workdir, exist_ok=True)
    if lead and lock is None:
      lock = workdir_lib.acquire(workdir)
    _start_writing(run, workdir_files)
  except BaseException:
    if lock is not None:
      lock.release()
    raise
  run.lock = lock
  return run


def build_parts(config, workdir: str, axis_name: str | None = None) -> tuple:
  """(train source, eval source, meta, task, model) of `config`; writes nothing.

  Also what a script needs to use a trained run again (its data, objective and
  model), e.g. `experiments/plot_filters.py`.
  """
  train_source, eval_source, meta = inputs.make_sources(config.data, workdir)
  task_options = config.task.to_dict()
  task = tasks.build(task_options.pop('name'), meta, **task_options)
  model_options = config.model.to_dict()
  model = registry.build(model_options.pop('name'), axis_name, meta.get('model_defaults'),
                         **model_options)
  return train_source, eval_source, meta, task, model


def _build(config, workdir: str, allow_config_change: bool) -> tuple[Run, dict]:
  """Checks everything and builds the run, writing nothing."""
  check_record(config, workdir, allow_config_change)
  note = note_schedule_change(config, workdir)
  if note:
    _say(note)
  mode = config.parallel.mode
  if mode not in parallel_lib.MODES:
    raise ValueError(f'Unknown parallel.mode {mode!r}; allowed: {", ".join(parallel_lib.MODES)}.')
  model_parallelism = config.parallel.get('model_parallelism', 1)
  if mode != 'tensor' and model_parallelism != 1:
    raise ValueError(f'parallel.model_parallelism={model_parallelism!r} needs '
                     f"parallel.mode='tensor'; mode {mode!r} keeps whole parameters on each device.")
  mesh = parallel_lib.make_mesh(config.parallel.get('num_devices'),
                                model_parallelism if mode == 'tensor' else None)
  par = parallel_lib.Parallel(mode, mesh, config.parallel.get('fsdp_min_size', 1024),
                              config.parallel.get('logical_axis_rules'))
  shards = (f'{par.num_devices} devices of the mesh' if par.data_size == par.num_devices else
            f"{par.data_size} rows of the {' x '.join(map(str, mesh.devices.shape))} "
            "(data x model) mesh")
  for name in ('global_batch_size', 'eval_batch_size'):
    if config[name] % par.data_size:
      raise ValueError(f'config.{name}={config[name]} is not divisible by the {shards}.')
  per_device = config.global_batch_size // par.data_size
  if per_device % config.grad_accum_steps:
    raise ValueError(f'config.grad_accum_steps={config.grad_accum_steps} does not divide the '
                     f'batch of {per_device} examples per device.')

  train_source, eval_source, meta, task, model = build_parts(config, workdir, par.axis_name)
  model_name = config.model.name
  tx, learning_rate_fn = optim.make_optimizer(config.optimizer, config.num_train_steps)

  example = task.preprocess(pipeline.read_batch(train_source, np.zeros(1, np.int64)))
  init_fn = functools.partial(init_train_state, model, task, tx, example_batch=example,
                              ema=config.get('ema_decay', 0.0) > 0, logical_axes=True)
  rng = jax.random.PRNGKey(config.seed)
  run = Run(config=config, workdir=workdir, parallel=par, model=model, task=task, tx=tx,
            learning_rate_fn=learning_rate_fn, init_fn=init_fn, rng=rng,
            train_source=train_source, eval_source=eval_source, checkpointer=None)
  abstract = _prove(f'initialising model {model_name!r}',
                    lambda: par.abstract_state(init_fn, rng))
  _prove_steps(run, abstract, example)
  if os.path.isdir(os.path.join(workdir, 'checkpoints')):
    run.checkpointer = checkpoint.Checkpointer(workdir, config.checkpoint_every_steps,
                                               config.checkpoints_to_keep)
    run.checkpointer.check_compatible(abstract)
  return run, meta.get('workdir_files', {})


def _start_writing(run: Run, workdir_files: dict) -> None:
  """Writes what the data asks to keep (e.g. the tokenizer), the checkpoint folder and the
  config that this run follows."""
  for filename, save in workdir_files.items():
    path = os.path.join(run.workdir, filename)
    if jax.process_index() == 0 and not os.path.exists(path):
      save(path + '.tmp')
      os.replace(path + '.tmp', path)
  if run.checkpointer is None:
    run.checkpointer = checkpoint.Checkpointer(run.workdir, run.config.checkpoint_every_steps,
                                               run.config.checkpoints_to_keep)
  _write_config(run.config, run.workdir)


def _prove_steps(run: Run, abstract, example: dict) -> None:
  """Traces one train and one eval step on batches of the configured shapes."""
  def batch_of(size, extra=None):
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((size,) + x.shape[1:], x.dtype), example)
    return {**batch, **(extra or {})}
  config = run.config
  mask = {'mask': jax.ShapeDtypeStruct((config.eval_batch_size,), np.int32)}
  # Mapped over the devices as the mode runs them, so collectives over the device axis (batch
  # norm's under shard_map and pmap) trace; in the steps' context, so the activations' sharding
  # constraints are proved too.
  par = run.parallel
  with par.context():
    _prove('running the first train step', lambda: jax.eval_shape(
        par.per_device_train_step(run.train_step_fn()), abstract,
        batch_of(config.global_batch_size)))
    _prove('running the first eval step', lambda: jax.eval_shape(
        par.per_device_eval_step(run.eval_step_fn()), abstract,
        batch_of(config.eval_batch_size, mask), np.int32(0)))


def _write_config(config, workdir: str) -> None:
  """Keeps the config beside the checkpoints (read by `experiments/sample.py`)."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, CONFIG_FILE)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(config.to_json_best_effort(indent=1, sort_keys=True) + '\n')
  os.replace(path + '.tmp', path)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run wrote into `workdir`, or one sentence saying it is not there."""
  path = os.path.join(os.path.abspath(workdir), CONFIG_FILE)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise FileNotFoundError(f'{workdir!r} is a file, not the work directory of a run.')
  try:
    with open(path, encoding='utf-8') as f:
      return ml_collections.ConfigDict(json.load(f))
  except FileNotFoundError:
    raise FileNotFoundError(f'{path!r} does not exist: {workdir!r} is not the work directory of '
                            'a run.') from None
  except json.JSONDecodeError as e:
    raise ValueError(f'{path!r} is not a readable config ({e.msg} at line {e.lineno}).') from None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  return setup(config, workdir).train()
