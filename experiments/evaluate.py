r"""Evaluates a trained run's latest checkpoint again, optionally under changed data settings.

  python -m experiments.evaluate --workdir=workdirs/shakespeare_char_gpt_rotary [--window=256] \
      [--set=data.options.length=2048 --set=model.max_length=2048]

Reads the run's `config.json` and newest good checkpoint (the parameter EMA when the run
kept one; `--set=ema_decay=0` evaluates the parameters) and runs the run's own evaluation
over its eval split. With `--window` the text windows have that many tokens instead of the
trained context, e.g. twice the training length to see which position schemes extrapolate
(Press et al. 2022). Each `--set=KEY=VALUE` replaces one value of the run's config (a
dotted key that exists there; the value read as a Python literal, else as a string), e.g.
a generated data set's length; one under which the model's parameters differ from the
checkpoint's (a leaf missing, added, or of another shape or dtype) is refused
before evaluating. Prints the metrics and appends them, with the window, the checkpoint
step and the weights evaluated ('ema' or 'params'), to `<workdir>/evaluations.jsonl`; nothing
else in the work directory changes.
"""

import ast
import functools
import os
import sys
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

FLAGS = flags.FLAGS

OUTPUT_FILE = 'evaluations.jsonl'


def apply_overrides(config, overrides: Sequence[str]) -> dict:
  """Sets each 'dotted.key=value' of `overrides` in `config`; returns {key: value}."""
  applied = {}
  for item in overrides:
    key, sep, raw = item.partition('=')
    if not sep or not key:
      raise ValueError(f'--set={item!r} must have the form dotted.key=value.')
    node, parts = config, key.split('.')
    for depth, part in enumerate(parts):
      if not hasattr(node, 'keys') or part not in node.keys():
        where = '.'.join(parts[:depth]) or 'the config'
        raise ValueError(f'--set={item!r}: {where} has no key {part!r}; the run\'s config.json '
                         'lists the keys.')
      if depth < len(parts) - 1:
        node = node[part]
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    try:
      node[parts[-1]] = value
    except TypeError as e:
      raise ValueError(f'--set={item!r} gives {parts[-1]!r} a value of the wrong type: '
                       f'{e}.'.replace('..', '.')) from None
    applied[key] = value
  return applied


def evaluate(workdir: str, *, window: int | None = None, batch_size: int | None = None,
             overrides: Sequence[str] = ()) -> dict:
  """{'step', 'window', 'metrics'} (and the applied 'overrides') of the run in `workdir`; bad
  inputs raise ValueError or FileNotFoundError in one sentence before anything is compiled."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top
  from train import state as state_lib  # pylint: disable=g-import-not-at-top

  for name, value in (('window', window), ('batch_size', batch_size)):
    if value is not None and value < 1:
      raise ValueError(f'--{name} must be a positive integer, got {value}.')
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'The work directory {workdir!r} does not exist.')
  config = loop.read_config(workdir)
  if window is not None:
    if config.data.get('window') is None:
      raise ValueError(f'--window applies to token windows; the run in {workdir!r} reads '
                       f'{config.data.name!r} without them.')
    config.data.window = window
  if batch_size is not None:
    config.eval_batch_size = batch_size
  trained_decay = config.get('ema_decay') or 0.0
  applied = apply_overrides(config, overrides)
  if 'ema_decay' in applied and config.ema_decay and config.ema_decay != trained_decay:
    kept = f'their average of decay {trained_decay}' if trained_decay else 'no average'
    raise ValueError(f'--set=ema_decay={applied["ema_decay"]!r}: the checkpoints hold the '
                     f'parameters and {kept}; only --set=ema_decay=0 (evaluate the parameters) '
                     'changes the weights evaluated.')
  train_source, eval_source, _, task, model = loop.build_parts(config, workdir)
  example = task.preprocess(pipeline.read_batch(train_source, np.zeros(1, np.int64)))
  init = functools.partial(state_lib.init_variables, model, task, example_batch=example)
  abstract = loop._prove(  # pylint: disable=protected-access
      'initialising the model', lambda: jax.eval_shape(init, jax.ShapeDtypeStruct((2,), np.uint32)))
  saved = checkpoint.restore_arrays(workdir)
  mismatch = checkpoint.variables_mismatch(saved, abstract)
  if mismatch:
    changes = ' and '.join(f'--set={key}={value!r}' for key, value in applied.items())
    raise ValueError(f'The checkpoint of {workdir!r} does not fit the model '
                     f'{"under " + changes if changes else "of its config"}: {mismatch}.')
  if not config.get('ema_decay'):  # the run's, or the parameters asked for by --set
    saved = {**saved, 'ema_params': None}
  state = state_lib.from_saved_arrays(saved)
  run = loop.Run(config=config, workdir=workdir, parallel=None, model=model, task=task, tx=None,
                 learning_rate_fn=None, init_fn=None, rng=None, train_source=None,
                 eval_source=eval_source, checkpointer=None)
  metrics = run.evaluate(jax.jit(run.eval_step_fn()), state)
  record = {'step': int(saved['step']), 'window': config.data.get('window'), 'metrics': metrics,
            'weights': 'params' if state.ema_params is None else 'ema'}
  if applied:
    record['overrides'] = applied
  return record


def run(workdir: str | None, *, window: int | None = None, batch_size: int | None = None,
        overrides: Sequence[str] = ()) -> dict:
  """The command: evaluates, prints and appends the record; a bad input exits with status 1
  and one sentence."""
  try:
    if not workdir:
      raise ValueError('--workdir must name the work directory of a trained run.')
    from experiments import command_line  # pylint: disable=g-import-not-at-top
    command_line.record_file(workdir, OUTPUT_FILE, 'the record is appended to')
    record = evaluate(workdir, window=window, batch_size=batch_size, overrides=overrides)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  changed = ''.join(f', {key}={value!r}' for key, value in record.get('overrides', {}).items())
  print(f'step {record["step"]}, window {record["window"]}{changed}: '
        + ' '.join(f'{k}={v:.4f}' for k, v in sorted(record['metrics'].items())))
  command_line.append_record(os.path.join(os.path.abspath(workdir), OUTPUT_FILE), record)
  return record


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Work directory of a trained run.', required=True)
  flags.DEFINE_integer('window', None, 'Tokens per evaluation window (default: the run\'s).')
  flags.DEFINE_integer('batch_size', None, "Windows per batch (default: the run's "
                       'eval_batch_size).')
  flags.DEFINE_multi_string('set', [], 'dotted.key=value: a config value to change for this '
                            'evaluation (repeatable).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  run(FLAGS.workdir, window=FLAGS.window, batch_size=FLAGS.batch_size, overrides=FLAGS.set)


if __name__ == '__main__':
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  define_flags()
  command_line.run(main)
