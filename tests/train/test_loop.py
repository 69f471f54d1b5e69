"""The loop reads a step's metrics only after dispatching the next step; what a train log,
an evaluation and the eval hooks are made of."""

import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import digits_mlp
from train import loop, metrics, parallel, tasks
from train.state import TrainState


def test_metrics_are_read_after_the_next_step_is_dispatched(tmp_path, monkeypatch):
  events = []
  compile_train_step = parallel.Parallel.compile_train_step

  def recording_compile(self, *args, **kwargs):
    step_fn = compile_train_step(self, *args, **kwargs)

    def step(state, batch):
      events.append(('dispatch', len([e for e in events if e[0] == 'dispatch']) + 1))
      return step_fn(state, batch)
    return step

  write = metrics.MetricWriter.write

  def recording_write(self, step, split, values):
    events.append((split, step))
    return write(self, step, split, values)

  monkeypatch.setattr(parallel.Parallel, 'compile_train_step', recording_compile)
  monkeypatch.setattr(metrics.MetricWriter, 'write', recording_write)
  config = digits_mlp.get_config()
  config.data.data_dir = str(tmp_path / 'data')
  config.num_train_steps = 12
  config.log_every_steps = 4
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  config.optimizer.warmup_steps = 2
  loop.setup(config, str(tmp_path / 'run')).train()

  train_logs = [i for i, e in enumerate(events) if e[0] == 'train']
  assert [events[i][1] for i in train_logs] == [4, 8, 12]
  for i in train_logs[:-1]:
    # The metrics of step k are written once step k + 1 is already dispatched.
    assert events[i - 1] == ('dispatch', events[i][1] + 1)
  assert events[-1] == ('train', 12) and ('eval', 12) in events


def test_examples_per_second_leaves_out_the_evaluations(tmp_path, monkeypatch):
  pause = 2.0
  evaluate = loop.Run.evaluate

  def slow_evaluate(self, *args, **kwargs):
    time.sleep(pause)
    return evaluate(self, *args, **kwargs)

  written = []
  write = metrics.MetricWriter.write

  def recording_write(self, step, split, values):
    written.append((step, split, dict(values)))
    return write(self, step, split, values)

  monkeypatch.setattr(loop.Run, 'evaluate', slow_evaluate)
  monkeypatch.setattr(metrics.MetricWriter, 'write', recording_write)
  config = digits_mlp.get_config()
  config.data.data_dir = str(tmp_path / 'data')
  config.num_train_steps = 8
  config.log_every_steps = 4
  config.eval_every_steps = 4
  config.checkpoint_every_steps = 100
  config.optimizer.warmup_steps = 2
  run = loop.setup(config, str(tmp_path / 'run'))
  began = time.time()
  run.train()
  wall = time.time() - began

  train = [(step, values) for step, split, values in written if split == 'train']
  assert [step for step, _ in train] == [4, 8]
  # Each interval's seconds, as its throughput implies, against the wall time of training
  # alone: the run's minus the two evaluations' pauses.
  seconds = [4 * config.global_batch_size / values['examples_per_second'] for _, values in train]
  assert sum(seconds) < wall - 2 * pause + 0.5, (seconds, wall)


class _Recorder:

  def __init__(self):
    self.records = []

  def write(self, step, split, values):
    self.records.append((step, split, dict(values)))


def _step_metrics(loss_total, weight, grad_norm, learning_rate, skipped):
  return {'totals': {'loss': (np.float32(loss_total), np.float32(weight))},
          'grad_norm': np.float32(grad_norm), 'learning_rate': np.float32(learning_rate),
          'skipped': np.int32(skipped)}


def test_a_train_log_pools_the_kept_steps_and_counts_every_step_of_its_interval(monkeypatch):
  """Steps 11-13 (the last one skipped) logged at 13, the previous log at step 10 and t = 100 s,
  now t = 110 s: loss Σ total / Σ weight and the mean gradient norm over the two kept steps,
  the last step's rate, one skipped step, 3 steps of 16 examples over 10 s."""
  run = types.SimpleNamespace(task=tasks.build('classification', {'num_classes': 3}),
                              config=types.SimpleNamespace(global_batch_size=16,
                                                           eval_batch_size=1000))
  pending = [_step_metrics(2.0, 4.0, 1.0, 0.3, 0), _step_metrics(6.0, 2.0, 3.0, 0.2, 0),
             _step_metrics(np.nan, 4.0, np.nan, 0.1, 1)]
  monkeypatch.setattr(loop.time, 'time', lambda: 110.0)
  writer = _Recorder()
  log_train = loop.Run._log_train  # pylint: disable=protected-access
  assert log_train(run, writer, 13, pending, (10, 100.0)) == (13, 110.0)
  [(step, split, values)] = writer.records
  assert (step, split) == (13, 'train')
  assert values == {'loss': pytest.approx(8.0 / 6.0), 'grad_norm': pytest.approx(2.0),
                    'learning_rate': pytest.approx(0.1), 'skipped_steps': 1,
                    'examples_per_second': pytest.approx(3 * 16 / 10.0)}


def test_an_evaluation_sums_every_batch_each_seeded_by_its_index():
  batches = [{'x': np.array([1.0, 2.0])}, {'x': np.array([3.0])}, {'x': np.array([6.0, 0.0])}]
  indices = []

  def eval_step(state, batch, index):
    indices.append(int(index))
    return {'loss': (np.float32(batch['x'].sum()), np.float32(len(batch['x'])))}

  run = types.SimpleNamespace(eval_batches=lambda: iter(batches),
                              task=tasks.build('classification', {'num_classes': 3}))
  assert loop.Run.evaluate(run, eval_step, None) == {'loss': pytest.approx(12.0 / 5.0)}
  assert indices == [0, 1, 2]


def test_eval_hooks_see_the_average_and_a_key_of_their_own_for_each_step():
  seen = []
  task = types.SimpleNamespace(eval_hooks=lambda: [lambda context: seen.append(context) or {}])
  run = types.SimpleNamespace(model='module', task=task)
  state = TrainState(step=jnp.int32(4), params={'w': jnp.zeros(2)}, opt_state=(),
                     model_state={'batch_stats': {'m': jnp.ones(2)}}, rng=jax.random.PRNGKey(0),
                     ema_params={'w': jnp.full(2, 5.0)})
  for step in (4, 4, 8):
    loop.Run.run_hooks(run, state, step)
  assert [c.step for c in seen] == [4, 4, 8] and seen[0].module == 'module'
  np.testing.assert_array_equal(seen[0].variables['params']['w'], [5.0, 5.0])
  np.testing.assert_array_equal(seen[0].variables['batch_stats']['m'], [1.0, 1.0])
  keys = [tuple(np.asarray(c.rng).tolist()) for c in seen]
  assert keys[0] == keys[1] and keys[0] != keys[2]
  # Not the state's key, nor the train step's stream of the same number.
  for step, key in ((4, keys[0]), (8, keys[2])):
    assert key not in (tuple(np.asarray(state.rng).tolist()),
                       tuple(np.asarray(jax.random.fold_in(state.rng, step)).tolist()))


def test_the_train_step_takes_the_configs_accumulation_and_average():
  config = digits_mlp.get_config()
  config.grad_accum_steps, config.ema_decay = 4, 0.9
  run = types.SimpleNamespace(config=config, model='model', task='task', tx='tx',
                              learning_rate_fn='schedule')
  keywords = loop.Run.train_step_fn(run).keywords
  assert (keywords['grad_accum_steps'], keywords['ema_decay']) == (4, 0.9)


def test_the_train_data_follows_the_configs_seed_and_batch_size(monkeypatch):
  monkeypatch.setattr(loop.pipeline, 'train_iterator', lambda source, **options: options)
  config = digits_mlp.get_config()
  config.seed, config.global_batch_size = 7, 24
  run = types.SimpleNamespace(config=config, train_source=None, task=types.SimpleNamespace(
      preprocess=None))
  options = loop.Run.train_iterator(run)
  assert (options['seed'], options['global_batch_size']) == (7, 24)


def test_the_initial_parameters_follow_the_configs_seed(tmp_path):
  config = digits_mlp.get_config()
  config.data.data_dir = str(tmp_path / 'data')
  kernels = {}
  for index, seed in enumerate((0, 3, 3)):
    config.seed = seed
    run = loop.setup(config, str(tmp_path / f'run{index}'))
    params = run.init_fn(run.rng).params
    kernels.setdefault(seed, []).append(np.asarray(jax.tree.leaves(params)[-1]))
  np.testing.assert_array_equal(*kernels[3])  # the same seed, the same parameters
  assert not np.allclose(kernels[0][0], kernels[3][0])
