r"""Generation speed with and without the decoding cache, at several lengths.

  python benchmarks/generation.py --config=experiments/configs/shakespeare_char_gpt.py \
      [--lengths=64,128,256] [--batch=1] [--repeats=3]

Builds the config's model (random parameters: the speed does not depend on
them) and times `train.sampling.generate` from a one-token prompt to each
length, compiled once per length and timed after a warm-up. Without the cache
every new token reruns the model on the whole buffer, O(L²) token evaluations
for L tokens; with it each step reads one token and attends over the cached
keys and values, O(L). Prints new tokens per second for both and their ratio.
The model's `max_length` is raised to the longest length for models with one.
"""

import dataclasses
import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
import numpy as np
from ml_collections import config_flags

from benchmarks import runs
from experiments import command_line
from models import registry
from train import sampling

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
command_line.load_config_files_with('config')  # a bad --config is one sentence, at once
_LENGTHS = flags.DEFINE_list('lengths', ['64', '128', '256'], 'Total sequence lengths L.')
_BATCH = flags.DEFINE_integer('batch', 1, 'Sequences generated at once.', lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per setting (the best is kept).',
                                lower_bound=1)
flags.mark_flags_as_required(['config'])


def time_generation(model, variables, length: int, batch: int, use_cache: bool,
                    repeats: int) -> float:
  """Best seconds of one `generate` call producing `length − 1` new tokens."""
  prompt = np.zeros((batch, 1), np.int32)
  def call():
    return sampling.generate(model, variables, prompt, jax.random.PRNGKey(0),
                             num_new_tokens=length - 1, temperature=1.0, use_cache=use_cache)
  jax.block_until_ready(call())  # compile
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    best = min(best, time.perf_counter() - start)
  return best


def rates(model, variables, length: int, batch: int, repeats: int) -> tuple[float, float, float]:
  """New tokens per second of `batch` sequences generated to `length` without the cache and
  with it, and the speed-up the cache gives."""
  seconds = {use_cache: time_generation(model, variables, length, batch, use_cache, repeats)
             for use_cache in (False, True)}
  new_tokens = batch * (length - 1)
  return new_tokens / seconds[False], new_tokens / seconds[True], seconds[False] / seconds[True]


def has_cache(config) -> bool | None:
  """Whether `config`'s model has a decoding cache, decided from the config alone: the model
  is built, not initialised, with stand-ins for the options the data fills in (vocabulary,
  classes, horizon), which do not decide it; None if it cannot be built so."""
  options = config.model.to_dict()
  name = options.pop('name')
  # Only for options the model has: the MLP, whose last width is its number of classes, is
  # refused against a stand-in class count.
  fields = ({f.name for f in dataclasses.fields(registry.MODELS[name])}
            if name in registry.MODELS else set())
  stand_ins = {key: 2 for key in ('vocab_size', 'num_classes', 'horizon')
               if key in fields and options.get(key) is None}
  try:
    return sampling.supports_cache(registry.build(name, None, stand_ins, **options))
  except (ValueError, TypeError):
    return None  # loop.setup says what is wrong with the model's options


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  lengths = command_line.integers_at_least(_LENGTHS.value, 'lengths', 2,
                                           'a one-token prompt and at least one new token')
  no_cache = (f'Model {config.model.name!r} of --config has no decoding cache to compare with; '
              'give a language model with one, e.g. experiments/configs/shakespeare_char_gpt.py.')
  if has_cache(config) is False:  # before the data is read and the model initialised
    raise app.UsageError(no_cache)
  if 'max_length' in config.model:
    config.model.max_length = max(config.model.max_length, max(lengths))
  with tempfile.TemporaryDirectory() as workdir:
    run = runs.setup(config, workdir)
    state = run.parallel.init_state(run.init_fn, run.rng)
    run.lock.release()
  variables = {'params': state.params, **state.model_state}
  if not sampling.supports_cache(run.model):
    raise app.UsageError(no_cache)
  print(f'{config.model.name}: batch {_BATCH.value}, new tokens per second')
  print(f'{"length":>8} {"no cache":>12} {"cache":>12} {"speed-up":>9}')
  for length in lengths:
    no_cache, cache, speed_up = rates(run.model, variables, length, _BATCH.value, _REPEATS.value)
    print(f'{length:>8} {no_cache:>12.1f} {cache:>12.1f} {speed_up:>8.1f}x')


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                  needs_workdir=False))
