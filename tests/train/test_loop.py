"""The loop reads a step's metrics only after dispatching the next step."""

import time

from experiments.configs import digits_mlp
from train import loop, metrics, parallel


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
