"""The one training loop: `train_and_evaluate(config, workdir)`.

`setup` checks every user input and builds everything without compiling, so a
wrong flag stops in a second with one sentence; `Run.train` then compiles and
runs. The loop dispatches step N+1 before reading step N's metrics (the host
never waits on the device between logs), donates the state buffers, evaluates
periodically, and checkpoints so that a killed run resumes exactly.
"""

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Iterator

import jax
import ml_collections
import numpy as np

import data as data_lib
from data import augment as augment_lib
from data import pipeline
from models import registry
from train import checkpoint, metrics as metrics_lib, optim, parallel as parallel_lib, step as step_lib
from train import tasks
from train.state import init_train_state


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


def make_preprocess(data_config) -> Callable[[dict], dict]:
  """Batch of records -> {'input': float32, 'label': int32}, the input scaled by `input_scale`."""
  key, scale = data_config.input_key, np.float32(data_config.get('input_scale', 1.0))

  def preprocess(batch):
    return {'input': np.asarray(batch[key], np.float32) * scale,
            'label': np.asarray(batch['label'], np.int32)}
  return preprocess


def make_augment(spec, num_classes: int) -> Callable[[jax.Array, dict], dict]:
  """`data.augment` stages as a train-step augmentation of {'input', 'label'} batches.

  Labels become one-hot so that mixup and cutmix can mix them.
  """
  augment = augment_lib.build_augmentation(spec)

  def apply(key, batch):
    out = augment(key, {'image': batch['input'],
                        'label': jax.nn.one_hot(batch['label'], num_classes)})
    return {**batch, 'input': out['image'], 'label': out['label']}
  return apply


@dataclasses.dataclass
class Run:
  """Everything one training run needs, built by `setup` without compiling."""
  config: ml_collections.ConfigDict
  workdir: str
  parallel: parallel_lib.Parallel
  model: Any
  task: Callable
  tx: Any
  learning_rate_fn: Callable
  augment: Callable | None
  init_fn: Callable
  rng: Any
  train_source: Any
  eval_source: Any
  preprocess: Callable
  checkpointer: checkpoint.Checkpointer

  def train_iterator(self) -> Iterator:
    threads = self.config.data.get('num_threads')
    if threads is None:
      # Gathering from memory costs less than handing a batch between threads.
      threads = 0 if isinstance(self.train_source, pipeline.InMemorySource) else 2
    return pipeline.train_iterator(
        self.train_source, global_batch_size=self.config.global_batch_size,
        seed=self.config.seed, preprocess=self.preprocess,
        process_index=jax.process_index(), process_count=jax.process_count(),
        num_threads=threads)

  def train_step_fn(self) -> Callable:
    """This run's pure `train_step(state, batch, axis_name=None)`, before compilation."""
    return functools.partial(step_lib.train_step, model=self.model, task=self.task, tx=self.tx,
                             learning_rate_fn=self.learning_rate_fn, augment=self.augment)

  def evaluate(self, eval_step, state) -> dict:
    batches = pipeline.eval_batches(
        self.eval_source, global_batch_size=self.config.eval_batch_size,
        preprocess=self.preprocess, process_index=jax.process_index(),
        process_count=jax.process_count())
    totals = None
    for batch in batches:
      sums = eval_step(state, batch)
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    totals = jax.device_get(totals)
    count = totals.pop('count')
    return {name: value / count for name, value in totals.items()}

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
    eval_step = par.compile_eval_step(functools.partial(
        step_lib.eval_step, model=self.model, task=self.task), abstract)
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
    if log_due is not None:
      self._log_train(writer, log_due, pending, last_log)
    self.checkpointer.close()
    writer.close()
    return eval_metrics

  def _log_train(self, writer, step, pending, last_log):
    means = jax.tree.map(lambda *xs: np.mean(xs), *jax.device_get(pending))
    now = time.time()
    steps = step - last_log[0]
    means['examples_per_second'] = steps * self.config.global_batch_size / max(now - last_log[1], 1e-9)
    writer.write(step, 'train', means)
    return step, now


def setup(config: ml_collections.ConfigDict, workdir: str) -> Run:
  """Validates `config` and builds a `Run`; raises ValueError/FileNotFoundError in one sentence."""
  _check_positive(config, 'num_train_steps', 'global_batch_size', 'eval_batch_size',
                  'log_every_steps', 'eval_every_steps', 'checkpoint_every_steps',
                  'checkpoints_to_keep')
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
  model_options = config.model.to_dict()
  model = registry.build(model_options.pop('name'), par.axis_name, **model_options)
  task_options = config.task.to_dict()
  task = functools.partial(tasks.get(task_options.pop('name')), **task_options)
  tx, learning_rate_fn = optim.make_optimizer(config.optimizer, config.num_train_steps)
  data_options = dict(config.data.get('options', {}))
  load = functools.partial(data_lib.load, config.data.name, data_dir=config.data.get('data_dir'),
                           **data_options)
  train_source = load(config.data.train_split)
  eval_source = load(config.data.eval_split)
  if config.data.get('in_memory', True):
    train_source = pipeline.InMemorySource(train_source)
    eval_source = pipeline.InMemorySource(eval_source)
  first = pipeline.read_batch(train_source, np.zeros(1, np.int64))
  if config.data.input_key not in first:
    raise ValueError(f'config.data.input_key={config.data.input_key!r} is not a feature of '
                     f'{config.data.name!r}; its features are: {", ".join(sorted(first))}.')
  preprocess = make_preprocess(config.data)
  example_input = preprocess(first)['input']
  augment = None
  if config.get('augment'):
    num_classes = data_lib.info(config.data.name, data_dir=config.data.get('data_dir'),
                                **data_options).features['label'].num_classes
    augment = make_augment(config.augment, num_classes)
    # Traces once, so a spec that does not fit the data stops here.
    jax.eval_shape(augment, jax.random.PRNGKey(0), {'input': example_input,
                                                    'label': np.zeros(1, np.int32)})
  init_fn = functools.partial(_init, model=model, tx=tx, example_input=example_input)
  rng = jax.random.PRNGKey(config.seed)
  checkpointer = checkpoint.Checkpointer(workdir, config.checkpoint_every_steps,
                                         config.checkpoints_to_keep)
  checkpointer.check_compatible(par.abstract_state(init_fn, rng))
  return Run(config=config, workdir=workdir, parallel=par, model=model, task=task, tx=tx,
             learning_rate_fn=learning_rate_fn, augment=augment, init_fn=init_fn, rng=rng,
             train_source=train_source, eval_source=eval_source, preprocess=preprocess,
             checkpointer=checkpointer)


def _init(rng, *, model, tx, example_input):
  return init_train_state(model, tx, rng, example_input)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  return setup(config, workdir).train()
