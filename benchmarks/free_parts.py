r"""What a Transformer's train step would reach if one of its parts cost nothing.

  python benchmarks/free_parts.py --config=experiments/configs/shakespeare_char_gpt.py \
      --config.global_batch_size=16 --config.model.dropout_rate=0 --steps=20 \
      [--parts=attention,gelu,layernorm,attention+gelu+layernorm] [--rounds=2]

A profile (`benchmarks/profile_step.py`) sums each operation's traced time, but XLA:CPU
runs independent operations side by side, so a part's traced time is not what the step
would lose without it. This script measures that directly: it times the step as it is
and the step with a part replaced by an identity, in interleaved rounds in one process,
and prints each variant's steps/s, its fraction of the float32 matmul peak (over its own
FLOPs, from XLA's cost analysis) and the step time the part takes (the step's time less
the variant's, the median over the rounds). The parts (join several with '+'):

  attention  the exact attention's softmax(q kᵀ/√H) v becomes v + 0·q − 0·k: the query,
             key and value projections and the output projection stay, the per-head
             products, the mask and the softmax go (self-attention only: q and v must have
             one shape)
  gelu       every `flax.linen.gelu` becomes the identity (the MLPs', and BERT's
             masked-token head's)
  layernorm  every LayerNorm of the Transformer blocks and heads becomes the identity
             (`models.transformer.blocks.layer_norm` and the modules that import it)

The replacements apply only while a variant is built and traced (`freed`); the model code
is not changed. A variant trains a different function, so its loss means nothing: only its
time does. `--config`, `--steps` and `--pipeline_batches` are `benchmarks/train_step.py`'s;
its `--dtypes`, `--sweep`, `--products_alone` and `--products_by_kind`, which this script
would not use, are refused (set the compute dtype by `--config.model.dtype`).
"""

import contextlib
import functools
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import flax.linen as nn

from benchmarks import runs
from benchmarks import train_step
from experiments import command_line
from models.attention import core
from models.transformer import bert
from models.transformer import blocks
from models.transformer import encoder_decoder
from models.transformer import gpt
from models.vision import vit
from train import xla_cpu

PARTS = ('attention', 'gelu', 'layernorm')
TRANSFORMERS = ('gpt', 'bert', 'vit', 'transformer_seq2seq')
_LAYER_NORM_USERS = (blocks, gpt, bert, vit, encoder_decoder)
# train_step.py's flags that this script's measurements do not read.
IGNORED_FLAGS = ('dtypes', 'sweep', 'products_alone', 'products_by_kind')

_PARTS = flags.DEFINE_list('parts', ['attention', 'gelu', 'layernorm', 'attention+gelu+layernorm'],
                           'Variants to time against the step as it is: parts of '
                           f'{", ".join(PARTS)}, several joined by "+".')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Interleaved rounds (each times every variant once).',
                               lower_bound=1)


def parse_variant(text: str) -> tuple[str, ...]:
  """'attention+gelu' → ('attention', 'gelu'); an unknown or repeated part is one sentence."""
  parts = tuple(text.split('+'))
  for part in parts:
    if part not in PARTS:
      raise ValueError(f'--parts has {part!r} in {text!r}, which is not a part; allowed: '
                       f'{", ".join(PARTS)} (several joined by "+").')
  if len(set(parts)) != len(parts):
    raise ValueError(f'--parts variant {text!r} names a part twice.')
  return parts


def _free_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, **unused):
  if q_BxTxNxH.shape != v_BxSxNxH.shape:
    raise ValueError(f'Free attention puts the values in place of the attention\'s output, '
                     f'so it needs self-attention: queries {q_BxTxNxH.shape} and values '
                     f'{v_BxSxNxH.shape} differ (cross-attention); leave attention out of '
                     '--parts for this model.')
  # q and k stay in the program, so their projections and gradients are kept; their two
  # terms differ (0·q − 0·k), else their equal gradients 0·g would be merged into one.
  return v_BxSxNxH + 0.0 * q_BxTxNxH - 0.0 * k_BxSxNxH


class _Identity(nn.Module):

  @nn.compact
  def __call__(self, x):
    return x


def _identity_layer_norm(*unused_args, name=None, **unused_kwargs):
  return _Identity(name=name)


@contextlib.contextmanager
def freed(parts):
  """Within the block, each of `parts` (names from PARTS) is replaced by its identity."""
  with contextlib.ExitStack() as stack:
    def swap(owner, attribute, value):
      original = getattr(owner, attribute)
      setattr(owner, attribute, value)
      stack.callback(setattr, owner, attribute, original)

    for part in parts:
      if part == 'attention':
        swap(core, 'dot_product_attention', _free_attention)
      elif part == 'gelu':
        swap(nn, 'gelu', lambda x, *unused, **unused_kw: x)
      elif part == 'layernorm':
        for module in _LAYER_NORM_USERS:
          swap(module, 'layer_norm', _identity_layer_norm)
      else:
        raise ValueError(f'{part!r} is not a part; allowed: {", ".join(PARTS)}.')
    yield


def main(argv):
  del argv
  xla_cpu.keep_convolutions_off_ynnpack()
  xla_cpu.keep_freed_host_memory()
  print(f'XLA_FLAGS: {os.environ["XLA_FLAGS"]}')
  logging.set_verbosity(logging.WARNING)
  unused = [f'--{name}' for name in IGNORED_FLAGS if flags.FLAGS[name].present]
  if unused:
    raise app.UsageError(f'free_parts does not use {", ".join(unused)} of '
                         'benchmarks/train_step.py; leave them out (set the compute dtype by '
                         '--config.model.dtype).')
  flags.FLAGS.products_alone = False  # measure_step would time them, and nothing prints them
  config = flags.FLAGS.config
  try:
    variants = [()] + [parse_variant(v) for v in _PARTS.value]
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if len({frozenset(v) for v in variants}) != len(variants):
    raise app.UsageError(f'--parts={",".join(_PARTS.value)} names one variant twice.')
  attention = config.model.get('attention', 'exact')
  if attention != 'exact' and any('attention' in v for v in variants):
    raise app.UsageError(f'--parts frees attention, which replaces the exact attention only, and '
                         f'the config\'s is {attention!r}; give --config.model.attention=exact or '
                         'leave attention out of --parts.')
  if config.model.name not in TRANSFORMERS:
    raise app.UsageError(f'--config trains model {config.model.name!r}; free_parts replaces '
                         f'parts of the Transformers ({", ".join(TRANSFORMERS)}).')
  if config.model.name == 'transformer_seq2seq' and any('attention' in v for v in variants):
    raise app.UsageError('--parts frees attention, which transformer_seq2seq\'s cross-attention '
                         'cannot lose (its queries and values differ in length); leave attention '
                         'out of --parts for this model.')
  with tempfile.TemporaryDirectory() as workdir:  # the config's own checks, before any timing
    runs.setup(config, workdir).lock.release()
  peak, peak_n = train_step.matmul_peak_flops()
  print(f'matmul peak (float32, {peak_n}x{peak_n}): {peak / 1e9:.2f} GFLOP/s')
  seconds = {v: [] for v in variants}
  for round_index in range(_ROUNDS.value):
    for variant in variants:
      with freed(variant):
        train_step.forget_loop_free_flops()  # counted per config, which the variants share
        measured = train_step.measure_step(config, flags.FLAGS.steps)
      seconds[variant].append(measured['step_seconds'])
      label = '+'.join(variant) or 'the step as it is'
      products = measured['products']
      print(f'round {round_index + 1}, {label}: {1 / measured["step_seconds"]:.2f} steps/s, '
            f'{measured["flops"]:.4g} FLOP/step, '
            f'{measured["flops"] / measured["step_seconds"] / peak:.2%} of the matmul peak; '
            f'{len(products)} products ({sum(p.batched for p in products)} with batch '
            'dimensions)', flush=True)
  base = statistics.median(seconds[()])
  print(f'median over {_ROUNDS.value} round(s): the step as it is {base * 1e3:.1f} ms')
  for variant in variants[1:]:
    t = statistics.median(seconds[variant])
    print(f'  {"+".join(variant)} free: {t * 1e3:.1f} ms, so it takes {(base - t) * 1e3:.1f} ms '
          f'({(base - t) / base:.1%} of the step)')


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                        needs_workdir=False))
