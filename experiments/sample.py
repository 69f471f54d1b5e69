r"""Samples text from a trained language-model run, with no optimiser or data pipeline.

  python -m experiments.sample --workdir=workdirs/shakespeare_char_conv --prompt='ROMEO:' \
      [--num_tokens=500 --temperature=0.8 --top_k=0 --top_p=0.95 --num_samples=2 --seed=0]

Reads the run's `config.json` (model), `tokenizer.json` and its latest
checkpoint (the parameter EMA when the run kept one), prints the samples and
writes them to `<workdir>/samples/sample_step<N>_seed<S>.txt` (`..._2.txt` and so on when
that file exists, so an earlier sample is kept) or to --output.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

from experiments import command_line

_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory of a trained language model run.')
_PROMPT = flags.DEFINE_string('prompt', '\n', 'Text the samples continue.')
_NUM_TOKENS = flags.DEFINE_integer('num_tokens', 500, 'Tokens generated after the prompt.')
_TEMPERATURE = flags.DEFINE_float('temperature', 1.0, 'Softmax temperature; 0 is greedy.')
_TOP_K = flags.DEFINE_integer('top_k', 0, 'Keep the k most probable tokens (0: all).')
_TOP_P = flags.DEFINE_float('top_p', 1.0, 'Keep the smallest set with this much mass (1: all).')
_NUM_SAMPLES = flags.DEFINE_integer('num_samples', 1, 'Independent samples.')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed of the samples, in [0, 2**32).')
_OUTPUT = flags.DEFINE_string('output', None, 'File to write (default: under <workdir>/samples).')
flags.mark_flags_as_required(['workdir'])


def sample(workdir: str, prompt: str, *, num_tokens: int, temperature: float, top_k: int,
           top_p: float, num_samples: int, seed: int) -> tuple[list[str], int]:
  """(samples, checkpoint step) of the run in `workdir`; one-sentence errors for bad inputs."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  from data import text, tokenizers
  from models import registry
  from train import checkpoint, loop, sampling

  # The sampling flags before the run is read (`sampling.check_options` checks them again).
  if not 0 <= temperature < float('inf'):
    raise ValueError(f'--temperature must be a finite number >= 0 (0 is greedy), got {temperature}.')
  if top_k < 0:
    raise ValueError(f'--top_k must be >= 0 (0 keeps every token), got {top_k}.')
  if not 0 < top_p <= 1:
    raise ValueError(f'--top_p must lie in (0, 1] (1 keeps every token), got {top_p}.')
  config = loop.read_config(workdir)
  task = config.task.get('name')
  if task != 'language_model':
    raise ValueError(f"The run in {workdir!r} trains task {task!r}, not 'language_model'; only "
                     'a causal language model continues a prompt.')
  if config.data.get('tokenizer') == text.DATASET_TOKENIZER:
    raise ValueError(f'The run in {workdir!r} reads the token records of data set '
                     f"{config.data.get('name')!r} (data.tokenizer={text.DATASET_TOKENIZER!r}), "
                     "which have no text tokenizer to encode a prompt; only a run with "
                     "data.tokenizer 'char' or 'byte_bpe' continues text.")
  tokenizer_path = os.path.join(os.path.abspath(workdir), text.TOKENIZER_FILE)
  if not os.path.isfile(tokenizer_path):
    raise FileNotFoundError(f'{tokenizer_path!r} does not exist: the run in {workdir!r} is not a '
                            'language model run.')
  tokenizer = tokenizers.load(tokenizer_path)
  if num_tokens < 1 or num_samples < 1:
    raise ValueError(f'--num_tokens and --num_samples must be positive, got {num_tokens} and '
                     f'{num_samples}.')
  if not 0 <= seed < 2**32:
    # PRNGKey keeps the low 32 bits: seed 2**32 + s would draw what s draws.
    raise ValueError(f'--seed must lie in [0, 2**32), the seeds of distinct samples, got {seed}.')
  try:
    prompt_ids = tokenizer.encode(prompt)
  except ValueError as e:
    raise ValueError(f'--prompt={prompt!r} cannot be encoded: {e}') from None
  if not prompt_ids:
    raise ValueError('--prompt must hold at least one token.')
  options = config.model.to_dict()
  model = registry.build(options.pop('name'), None, {'vocab_size': tokenizer.vocab_size}, **options)
  state = checkpoint.restore_arrays(workdir)
  # The model the tokenizer sizes, as shapes only: a tokenizer.json of another run (or
  # vocabulary) is one sentence here, not a shape error while the sampler is traced.
  params = nn.unbox(jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32), train=False)['params']))
  mismatch = checkpoint.variables_mismatch({'params': state['params']}, (params, {}))
  if mismatch:
    raise ValueError(f'The checkpoint of {workdir!r} does not fit its model with the '
                     f'{tokenizer.vocab_size} tokens of {tokenizer_path!r}: {mismatch}.')
  variables = checkpoint.eval_variables(state)
  samples = sampling.generate_text(model, variables, tokenizer, prompt, jax.random.PRNGKey(seed),
                                   num_samples=num_samples, num_new_tokens=num_tokens,
                                   temperature=temperature, top_k=top_k, top_p=top_p)
  return samples, int(state['step'])


def _new_file(folder: str, stem: str) -> str:
  """`folder/stem.txt`, or the first of `stem_2.txt`, `stem_3.txt`, … that does not exist."""
  path, copy = os.path.join(folder, f'{stem}.txt'), 1
  while os.path.exists(path):
    copy += 1
    path = os.path.join(folder, f'{stem}_{copy}.txt')
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  if _OUTPUT.value:
    command_line.output_file(_OUTPUT.value, 'output', figure=False)
  try:
    if not _OUTPUT.value and os.path.isdir(_WORKDIR.value):  # else sample() says what it is
      samples_folder = os.path.join(os.path.abspath(_WORKDIR.value), 'samples')
      why = command_line.unwritable(os.path.join(samples_folder, 'sample.txt'))
      if why:
        raise ValueError(f'The samples cannot be written to {samples_folder!r}: {why} (or give '
                         '--output).')
    samples, step = sample(_WORKDIR.value, _PROMPT.value, num_tokens=_NUM_TOKENS.value,
                           temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
                           num_samples=_NUM_SAMPLES.value, seed=_SEED.value)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  joined = '\n----\n'.join(samples)
  output = _OUTPUT.value or _new_file(os.path.join(_WORKDIR.value, 'samples'),
                                      f'sample_step{step}_seed{_SEED.value}')
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output, 'w', encoding='utf-8') as f:
    f.write(joined + '\n')
  print(joined)
  print(f'(step {step}; written to {output})', file=sys.stderr)


if __name__ == '__main__':
  command_line.run(main)
