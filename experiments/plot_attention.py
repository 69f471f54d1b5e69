r"""Attention weights of a trained encoder–decoder: which source characters each output read.

  python -m experiments.plot_attention --workdir=workdirs/dates_seq2seq_attention \
      [--indices=0,1,2,3] [--output=PNG]

Reads the run's `config.json` and latest checkpoint (the parameter EMA when the
run kept one), decodes examples `--indices` of its eval split greedily (as the
seq2seq task's `exact_match` does) and draws, for each, the weights α_{t,i}
of output token t (rows: each decoded token up to the first EOS, or all of them
when none was decoded) over source character i (columns), with the decoded text.
Writes `<workdir>/attention.png` (or --output) and prints source → decoded pairs.
"""

import math
import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from experiments import command_line  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Work directory of a trained seq2seq run with attention.',
                      required=True)
  flags.DEFINE_list('indices', ['0', '1', '2', '3'], 'Examples of the eval split.')
  flags.DEFINE_string('output', None, 'PNG to write (default: in the work directory).')


def decode_with_attention(task, module, variables, batch):
  """(decoded tokens [B, N], attention weights [B, N, S]) of greedy decoding."""
  source_inputs = (batch['source'], batch['source_length'])
  decoded_BxN = task.greedy_decode(module, variables, source_inputs)
  # The weights of the decoded sequence: one teacher-forced pass over BOS + its tokens.
  decoder_input = jnp.concatenate([batch['decoder_input'][:, :1], decoded_BxN[:, :-1]], axis=1)
  _, state = module.apply(variables, decoder_input, *source_inputs, train=False,
                          mutable=['intermediates'])
  if 'attention' not in state.get('intermediates', {}):
    raise ValueError(f'The model {type(module).__name__} has no attention to plot; train one '
                     "with config.model.attention='dot' or 'additive'.")
  return np.asarray(decoded_BxN), np.asarray(state['intermediates']['attention'][0])


def row_labels(tokens) -> list[str]:
  """The label of each decoded position up to and including the first EOS (all of them when
  there is none): its character, or 'EOS', 'PAD', 'BOS', '?' for an id that is not printable."""
  from train.tasks import seq2seq  # pylint: disable=g-import-not-at-top
  names = {seq2seq.EOS_ID: 'EOS', seq2seq.PAD_ID: 'PAD', seq2seq.BOS_ID: 'BOS'}
  labels = []
  for token in np.asarray(tokens).tolist():
    labels.append(names.get(token) or (chr(token) if 32 <= token < seq2seq.NUM_TOKEN_IDS else '?'))
    if token == seq2seq.EOS_ID:
      break
  return labels


def plot(workdir: str, indices: list[int], output: str) -> list[str]:
  """Writes the figure of the run in `workdir`; returns 'source → decoded' lines."""
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from models.sequence import rnn_models  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop
  from train.tasks import seq2seq

  config = loop.read_config(workdir)
  _, eval_source, _, task, module = loop.build_parts(config, workdir)
  if not isinstance(task, seq2seq.Seq2Seq) or not task.source_length_key:
    raise ValueError(f'The run in {workdir} is not a sequence-to-sequence run over text sources.')
  # Only the recurrent encoder–decoder records its weights (a Transformer's are not recorded).
  name = type(module).__name__
  if not isinstance(module, rnn_models.Seq2Seq):
    raise ValueError(f'The model {name} of the run in {workdir!r} has no attention to plot: this '
                     "script draws the weights that model 'seq2seq' with config.model.attention="
                     f"'dot' or 'additive' records; a {name} records none.")
  if module.attention == 'none':
    raise ValueError(f'The model {name} of the run in {workdir!r} has no attention to plot '
                     "(config.model.attention='none'); train one with config.model.attention="
                     "'dot' or 'additive'.")
  bad = [i for i in indices if not 0 <= i < len(eval_source)]
  if bad:
    raise ValueError(f'--indices {bad} are outside the eval split, which has {len(eval_source)} '
                     'examples.')
  state = checkpoint.restore_arrays(workdir)
  variables = checkpoint.eval_variables(state)
  batch = task.preprocess(pipeline.read_batch(eval_source, np.array(indices)))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  decoded_BxN, weights_BxNxS = decode_with_attention(task, module, variables, batch)

  columns = min(2, len(indices))
  rows = math.ceil(len(indices) / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 3.4 * rows), squeeze=False)
  lines = []
  for k, ax in enumerate(axes.flat):
    if k >= len(indices):
      ax.axis('off')
      continue
    length = int(batch['source_length'][k])
    source = ''.join(chr(int(c)) for c in batch['source'][k, :length])
    text = seq2seq.decode_text(decoded_BxN[k])
    # One row per decoded token, as decoded: the text drops padding and BOS and has no EOS when
    # none was decoded, so its characters need not be the rows.
    labels = row_labels(decoded_BxN[k])
    ax.imshow(weights_BxNxS[k, :len(labels), :length], cmap='viridis', vmin=0, vmax=1,
              aspect='auto')
    ax.set_xticks(range(length), list(source), fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_title(f'{source!r} → {text!r}', fontsize=9)
    lines.append(f'{source} → {text}')
  fig.suptitle(f'attention weights α_t,i ({config.model.attention}), {config.model.name} on '
               f'{config.data.name}, step {int(state["step"])}')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=100)
  plt.close(fig)
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  output = FLAGS.output or os.path.join(FLAGS.workdir, 'attention.png')
  # An empty list would pass the split's range check and fail in the figure.
  indices = command_line.integers_at_least(FLAGS.indices, 'indices', least=0,
                                           why='examples of the eval split')
  command_line.output_file(output, 'output')
  try:
    lines = plot(FLAGS.workdir, indices, output)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  print('\n'.join(lines))
  print(f'written to {output}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
