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
import time
from typing import Any, Callable, Iterator

import jax
import ml_collections
import numpy as np

from data import inputs
from data import pipeline
from models import registry
from train import checkpoint, metrics as metrics_lib, optim, parallel as parallel_lib, step as step_lib
from train import tasks
from train.state import init_train_state

CONFIG_FILE = 'config.json'
# Folded into the state's key for eval hooks (sampling), apart from every step's streams.
_HOOK_STREAM = 0x4007


def check_workdir(workdir: str) -> str:
  """Creates `workdir` if needed and proves it writable, or raises one sentence."""
  workdir = os.path.abspath(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f'.write_test_{os.getpid()}')
    with open(probe, 'w', encoding='utf-8') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise ValueError(f'The work directory {workdir!r} is not writable ({e.strerror}).') from None
  return workdir


def _check_positive(config, *names):
  for name in names:
    value = config[name]
    if not isinstance(value, int) or value <= 0:
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
    """Trains (resuming from the latest checkpoint) and returns the final eval metrics."""
    config, par = self.config, self.parallel
    abstract = par.abstract_state(self.init_fn, self.rng)
    train_iter = self.train_iterator()
    if self.checkpointer.latest_step() is not None:
      state, data_state = self.checkpointer.restore(abstract)
      train_iter.set_state(data_state['iterator'])
    else:
      state = par.init_state(self.init_fn, self.rng)
    start_step = int(jax.device_get(state.step))
    total = config.num_train_steps
    train_step = par.compile_train_step(self.train_step_fn(), abstract)
    eval_step = par.compile_eval_step(self.eval_step_fn(), abstract)
    writer = metrics_lib.MetricWriter(self.workdir, total)
    state = par.to_run_layout(state)

    pending, log_due, last_log = [], None, (start_step, time.time())
    eval_metrics = {}
    if start_step >= total:  # already finished: report the final model again
      eval_metrics = self.evaluate(eval_step, par.to_canonical(state))
    for step in range(start_step, total):
      batch = par.shard_batch(next(train_iter))
      state, step_metrics = train_step(state, batch)
      # Step `step` is now dispatched; reading the metrics of earlier steps
      # lets the device work while the host writes logs.
      if log_due is not None:
        last_log = self._log_train(writer, log_due, pending, last_log)
        pending, log_due = [], None
      pending.append(step_metrics)
      done = step + 1
      if done % config.log_every_steps == 0 or done == total:
        log_due = done
      is_eval = done % config.eval_every_steps == 0 or done == total
      is_ckpt = done % config.checkpoint_every_steps == 0 or done == total
      if is_eval or is_ckpt:
        canonical = par.to_canonical(state)
        if is_ckpt:
          # Orbax copies the arrays to the host as soon as `save` is called; with
          # the step still running, those copies can hold the threads that a
          # multi-device CPU step needs for its collectives.
          jax.block_until_ready(canonical)
          self.checkpointer.save(done, canonical, {'iterator': train_iter.get_state()},
                                 force=done == total)
        if is_eval:
          eval_metrics = self.evaluate(eval_step, canonical)
          writer.write(done, 'eval', eval_metrics)
          writer.write_outputs(done, self.run_hooks(canonical, done))
    if log_due is not None:
      self._log_train(writer, log_due, pending, last_log)
    self.checkpointer.close()
    writer.close()
    return eval_metrics

  def _log_train(self, writer, step, pending, last_log):
    """Logs the log interval's metrics: its weighted sums finalized, the mean gradient norm
    and the learning rate of the logged step."""
    pending = jax.device_get(pending)
    totals = jax.tree.map(lambda *xs: np.sum(xs), *[m['totals'] for m in pending])
    values = self.task.finalize(totals)
    values['grad_norm'] = float(np.mean([m['grad_norm'] for m in pending]))
    values['learning_rate'] = float(pending[-1]['learning_rate'])
    now = time.time()
    steps = step - last_log[0]
    values['examples_per_second'] = steps * self.config.global_batch_size / max(now - last_log[1], 1e-9)
    writer.write(step, 'train', values)
    return step, now


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


def setup(config: ml_collections.ConfigDict, workdir: str) -> Run:
  """Validates `config` and builds a `Run`; raises ValueError/FileNotFoundError in one sentence."""
  _check_positive(config, 'num_train_steps', 'global_batch_size', 'eval_batch_size',
                  'log_every_steps', 'eval_every_steps', 'checkpoint_every_steps',
                  'checkpoints_to_keep', 'grad_accum_steps')
  ema_decay = config.get('ema_decay', 0.0)
  if not 0 <= ema_decay < 1:
    raise ValueError(f'config.ema_decay must lie in [0, 1) (0 keeps no average), got {ema_decay!r}.')
  workdir = check_workdir(workdir)
  mode = config.parallel.mode
  if mode not in parallel_lib.MODES:
    raise ValueError(f'Unknown parallel.mode {mode!r}; allowed: {", ".join(parallel_lib.MODES)}.')
  mesh = parallel_lib.make_mesh(config.parallel.get('num_devices'))
  par = parallel_lib.Parallel(mode, mesh, config.parallel.get('fsdp_min_size', 1024))
  for name in ('global_batch_size', 'eval_batch_size'):
    if config[name] % par.num_devices:
      raise ValueError(f'config.{name}={config[name]} is not divisible by the '
                       f'{par.num_devices} devices of the mesh.')
  per_device = config.global_batch_size // par.num_devices
  if per_device % config.grad_accum_steps:
    raise ValueError(f'config.grad_accum_steps={config.grad_accum_steps} does not divide the '
                     f'batch of {per_device} examples per device.')

  train_source, eval_source, meta = inputs.make_sources(config.data, workdir)
  task_options = config.task.to_dict()
  task = tasks.build(task_options.pop('name'), meta, **task_options)
  model_options = config.model.to_dict()
  model_name = model_options.pop('name')
  model = registry.build(model_name, par.axis_name, meta.get('model_defaults'), **model_options)
  tx, learning_rate_fn = optim.make_optimizer(config.optimizer, config.num_train_steps)

  example = task.preprocess(pipeline.read_batch(train_source, np.zeros(1, np.int64)))
  init_fn = functools.partial(init_train_state, model, task, tx, example_batch=example,
                              ema=ema_decay > 0)
  rng = jax.random.PRNGKey(config.seed)
  run = Run(config=config, workdir=workdir, parallel=par, model=model, task=task, tx=tx,
            learning_rate_fn=learning_rate_fn, init_fn=init_fn, rng=rng,
            train_source=train_source, eval_source=eval_source, checkpointer=None)
  abstract = _prove(f'initialising model {model_name!r}',
                    lambda: par.abstract_state(init_fn, rng))
  _prove_steps(run, abstract, example)

  run.checkpointer = checkpoint.Checkpointer(workdir, config.checkpoint_every_steps,
                                             config.checkpoints_to_keep)
  run.checkpointer.check_compatible(abstract)
  _write_config(config, workdir)
  return run


def _prove_steps(run: Run, abstract, example: dict) -> None:
  """Traces one train and one eval step on batches of the configured shapes."""
  def batch_of(size, extra=None):
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((size,) + x.shape[1:], x.dtype), example)
    return {**batch, **(extra or {})}
  config = run.config
  _prove('running the first train step', lambda: jax.eval_shape(
      run.train_step_fn(), abstract, batch_of(config.global_batch_size)))
  mask = {'mask': jax.ShapeDtypeStruct((config.eval_batch_size,), np.int32)}
  _prove('running the first eval step', lambda: jax.eval_shape(
      run.eval_step_fn(), abstract, batch_of(config.eval_batch_size, mask), np.int32(0)))


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
