r"""Recomputes a trained run's batch-norm statistics over its training split and evaluates it
before and after.

  python -m experiments.recompute_batch_stats --workdir=workdirs/fashion_mnist_resnet20 \
      [--examples=10000 --max_passes=5 --batch_size=1000]

Reads the run's `config.json` and its latest checkpoint (the parameter EMA when the
run kept one), replaces the running averages of every BatchNorm layer by the exact
population statistics of the training split (`train.batch_stats`; the inputs
preprocessed as in evaluation: the task's transform without augmentation),
evaluates the eval split with the run's own evaluation code under both, prints both
and appends them, with the options of the call, as one line to
`<workdir>/batch_stats_recomputed.jsonl`. Nothing else in the work directory changes: the
checkpoints keep their running averages.
"""

import functools
import os
import sys

from absl import app
from absl import flags
from absl import logging

FLAGS = flags.FLAGS

OUTPUT_FILE = 'batch_stats_recomputed.jsonl'


def recompute(workdir: str, *, examples: int | None = None, max_passes: int | None = None,
              batch_size: int | None = None) -> dict:
  """The record appended to `<workdir>/batch_stats_recomputed.jsonl`: the options as given (None
  for a default), the batch size used, the before and after metrics, passes and changes. Bad
  inputs raise ValueError/FileNotFoundError in one sentence before anything is compiled."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import batch_stats, checkpoint, loop, tasks  # pylint: disable=g-import-not-at-top
  from train import state as state_lib  # pylint: disable=g-import-not-at-top

  for name, value in (('examples', examples), ('max_passes', max_passes),
                      ('batch_size', batch_size)):
    if value is not None and value < 1:
      raise ValueError(f'--{name} must be a positive integer, got {value}.')
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'The work directory {workdir!r} does not exist.')
  config = loop.read_config(workdir)
  checkpoints = os.path.join(workdir, 'checkpoints')
  if not (os.path.isdir(checkpoints) and any(d.isdigit() for d in os.listdir(checkpoints))):
    raise FileNotFoundError(f'The run in {workdir!r} has no checkpoint in {checkpoints!r} yet.')

  # The run's data, task and model, as `train.loop` builds them, but writing nothing and
  # without the run's Checkpointer (which tidies and sets aside checkpoint folders).
  train_source, eval_source, _, task, model = loop.build_parts(config, workdir)
  if examples is not None and examples > len(train_source):
    raise ValueError(f'--examples={examples} exceeds the {len(train_source)} examples of the '
                     f'run\'s training split {config.data.train_split!r}; give at most '
                     f'{len(train_source)}.')
  model_name = config.model.name
  example = task.preprocess(pipeline.read_batch(train_source, np.zeros(1, np.int64)))
  _, model_state = jax.eval_shape(functools.partial(state_lib.init_variables, model, task,
                                                    example_batch=example),
                                  jax.ShapeDtypeStruct((2,), np.uint32))
  if not jax.tree.leaves(model_state.get(batch_stats.COLLECTION)):
    raise ValueError(f'The model {model_name!r} of the run in {workdir!r} has no BatchNorm '
                     'layer, so there are no batch statistics to recompute.')

  saved = checkpoint.restore_arrays(workdir)
  state = state_lib.from_saved_arrays(saved)
  run = loop.Run(config=config, workdir=workdir, parallel=None, model=model, task=task, tx=None,
                 learning_rate_fn=None, init_fn=None, rng=None, train_source=train_source,
                 eval_source=eval_source, checkpointer=None)
  eval_step = jax.jit(run.eval_step_fn())
  before = run.evaluate(eval_step, state)

  # The task's eval transform (train=False: e.g. normalisation, no augmentation), its random
  # streams (if it draws any) from a fixed key.
  rngs = {name: tasks.stream_key(jax.random.PRNGKey(0), name) for name in task.rng_streams}
  size = batch_size or config.eval_batch_size
  new_stats, info = batch_stats.recompute_batch_stats(
      model, {'params': state.eval_params, **state.model_state},
      lambda: pipeline.eval_batches(train_source, global_batch_size=size,
                                    preprocess=task.preprocess),
      model_inputs=lambda batch: task.model_inputs(task.transform(rngs, batch, False)),
      method=task.method, max_passes=max_passes, max_examples=examples)
  state = state.replace(model_state={**state.model_state, batch_stats.COLLECTION: new_stats})
  after = run.evaluate(eval_step, state)
  return {'options': {'examples': examples, 'max_passes': max_passes, 'batch_size': batch_size},
          'batch_size': size, 'checkpoint_step': int(saved['step']),
          'train_examples': info['examples'], 'passes': info['passes'],
          'converged': info['converged'], 'largest_change_per_pass': info['changes'],
          'batch_norm_layers': len(info['layers']), 'before': before, 'after': after}


def write_record(workdir: str, record: dict) -> str:
  """Appends `record` as one line to `<workdir>/batch_stats_recomputed.jsonl`; returns the
  path."""
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(workdir), OUTPUT_FILE)
  command_line.append_record(path, record)
  return path


def run(workdir: str | None, *, examples: int | None = None, max_passes: int | None = None,
        batch_size: int | None = None) -> dict:
  """The command: recomputes, prints both metric sets and appends the record; a bad input
  exits with status 1 and one sentence."""
  try:
    if not workdir:
      raise ValueError('--workdir must name the work directory of a trained run.')
    from experiments import command_line  # pylint: disable=g-import-not-at-top
    command_line.record_file(workdir, OUTPUT_FILE, 'the record is appended to')
    record = recompute(workdir, examples=examples, max_passes=max_passes, batch_size=batch_size)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  for when in ('before', 'after'):
    print(f'{when}: ' + ' '.join(f'{k}={v:.4f}' for k, v in sorted(record[when].items())))
  path = write_record(workdir, record)
  exactness = 'exact' if record['converged'] else 'not converged: raise --max_passes'
  print(f'(step {record["checkpoint_step"]}; {record["train_examples"]} training examples, '
        f'{record["passes"]} passes, {exactness}; appended to {path})', file=sys.stderr)
  return record


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Work directory of a trained run.', required=True)
  flags.DEFINE_integer('examples', None, 'Use only the first N training examples (default: all).')
  flags.DEFINE_integer('max_passes', None, 'At most this many passes over the examples (default: '
                       'as many as the model has BatchNorm layers, which makes every statistic '
                       'exact).')
  flags.DEFINE_integer('batch_size', None, "Examples per batch (default: the run's "
                       'eval_batch_size).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  run(FLAGS.workdir, examples=FLAGS.examples, max_passes=FLAGS.max_passes,
      batch_size=FLAGS.batch_size)


if __name__ == '__main__':
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  define_flags()
  command_line.run(main)
