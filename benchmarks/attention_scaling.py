r"""Time and memory of every attention kind against sequence length.

  python benchmarks/attention_scaling.py [--kinds=exact,chunked,...] \
      [--lengths=256,512,...,16384] [--width=64] [--heads=1] [--repeats=5] [--causal] \
      [--figure=workdirs/attention_scaling.png]

For each kind of models/attention/kinds.py and each length n, compiles the
forward and backward pass of one attention call (batch 1, `--heads` heads of width
`--width`: the gradient of Σ out ⊙ c with respect to q, k and v) and reports

  * the time per call: every length of a kind is compiled first, then `--repeats` rounds
    time a batch of calls (at least `--min_batch_seconds` long) of each length in turn, and
    the best round is kept, and
  * the memory XLA's analysis of the compiled function gives: temporaries plus
    arguments plus outputs (a compile-time figure, so it does not depend on what
    else runs on the machine).

It then fits the exponent b of time ∝ n^b and of memory ∝ n^b by least squares on
log–log over the lengths from 1,024 up, and names the first length at which each
kind is faster than exact attention. Options per kind are the `OPTIONS` below
(Performer with 256 features, Linformer projecting to 256, blocks of 128 for the
sparse kinds, of 512 for chunked). Linformer has no causal form and is skipped
with `--causal`. Every setting is compiled before any is timed: one whose compiled
memory would exceed `--max_gb` is not run, and if none is left the script stops.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments import command_line
from models.attention import core
from models.attention import kinds

OPTIONS = {
    'chunked': {'query_block': 512, 'key_block': 512},
    'linear': {'block': 128},
    'performer': {'num_features': 256, 'block': 128},
    'linformer': {'projected_length': 256},
    'local': {'block': 128},
    'strided': {'block': 128},
    'fixed': {'block': 128, 'summary': 8},
}
FIT_FROM = 1024

_KINDS = flags.DEFINE_list('kinds', list(kinds.KINDS), 'Attention kinds to measure.')
_LENGTHS = flags.DEFINE_list('lengths', [str(2 ** i) for i in range(8, 15)], 'Sequence lengths.')
_WIDTH = flags.DEFINE_integer('width', 64, 'Head width H.', lower_bound=1)
_HEADS = flags.DEFINE_integer('heads', 1, 'Number of heads N.', lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed rounds over the lengths (the best is kept).',
                                lower_bound=1)
_MIN_BATCH_SECONDS = flags.DEFINE_float(
    'min_batch_seconds', 0.2, 'Each timing runs enough calls to take at least this long.',
    lower_bound=0.0)
_CAUSAL = flags.DEFINE_boolean('causal', False, 'Causal attention (Linformer is then skipped).')
_MAX_GB = flags.DEFINE_float('max_gb', 12.0, 'Skip settings whose compiled memory exceeds this.')
flags.register_validator('max_gb', lambda gb: gb > 0, 'the compiled memory a setting may take '
                         'must be a positive number of GB.')
_FIGURE = flags.DEFINE_string('figure', None, 'Where to save the log–log figure (PNG).')


def attention_fn(kind: str, length: int, causal: bool):
  """(params, q, k, v) ↦ Σ out ⊙ c for attention of `kind`, and its parameters."""
  layer = kinds.Attend(kind, tuple(OPTIONS.get(kind, {}).items()), max_length=length)
  shape = (1, length, _HEADS.value, _WIDTH.value)
  q, k, v, c = (jax.random.normal(jax.random.PRNGKey(i), shape) for i in range(4))
  params = layer.init(jax.random.PRNGKey(4), q, k, v, causal=causal)

  def loss(params, q, k, v):
    return jnp.sum(layer.apply(params, q, k, v, causal=causal) * c)

  return jax.value_and_grad(loss, argnums=(1, 2, 3)), (params, q, k, v)


def compile_setting(kind: str, length: int, causal: bool):
  """(call, compiled bytes) of forward plus backward; call is None if over --max_gb."""
  fn, args = attention_fn(kind, length, causal)
  compiled = jax.jit(fn).lower(*args).compile()
  memory = compiled.memory_analysis()
  total_bytes = (memory.temp_size_in_bytes + memory.argument_size_in_bytes
                 + memory.output_size_in_bytes)
  if total_bytes > _MAX_GB.value * 2 ** 30:
    return None, total_bytes
  return (lambda: jax.block_until_ready(compiled(*args))), total_bytes


def calls_per_batch(call) -> int:
  """Calls that take at least --min_batch_seconds together (at least 1), after a warm-up."""
  call()
  start = time.perf_counter()
  call()
  once = time.perf_counter() - start
  return max(1, int(np.ceil(_MIN_BATCH_SECONDS.value / max(once, 1e-9))))


def time_interleaved(calls) -> list[float | None]:
  """Seconds per call of each of `calls` (None entries are skipped): --repeats rounds, each
  timing one batch of every setting in turn, and the best round kept per setting.

  Interleaving puts a passing load on a shared machine into every length's rounds alike
  instead of into one length's, and a batch of calls per timing keeps the timer's and the
  dispatch's fixed costs out of the short settings.
  """
  numbers = [None if call is None else calls_per_batch(call) for call in calls]
  best = [None if call is None else float('inf') for call in calls]
  for _ in range(_REPEATS.value):
    for i, (call, number) in enumerate(zip(calls, numbers)):
      if call is None:
        continue
      start = time.perf_counter()
      for _ in range(number):
        call()
      best[i] = min(best[i], (time.perf_counter() - start) / number)
  return best


def fitted_exponent(lengths, values) -> float:
  """b of values ∝ lengths^b, least squares on log–log over the lengths ≥ FIT_FROM."""
  points = [(n, v) for n, v in zip(lengths, values) if n >= FIT_FROM and v is not None]
  if len(points) < 2:
    return float('nan')
  x, y = np.log([n for n, _ in points]), np.log([v for _, v in points])
  return float(np.polyfit(x, y, 1)[0])


def main(argv):
  del argv
  unknown = sorted(set(_KINDS.value) - set(kinds.KINDS))
  if unknown:
    raise app.UsageError(f'--kinds has {unknown[0]!r}; allowed: {", ".join(kinds.KINDS)}.')
  lengths = sorted(command_line.integers_at_least(_LENGTHS.value, 'lengths'))
  causal = _CAUSAL.value
  chosen = [k for k in _KINDS.value if not (causal and k == 'linformer')]
  if not _KINDS.value:
    raise app.UsageError(f'--kinds= names no attention kind; give one or more of: '
                         f'{", ".join(kinds.KINDS)}.')
  if not chosen:
    raise app.UsageError(f'--kinds={",".join(_KINDS.value)} with --causal leaves nothing to '
                         'measure, as Linformer has no causal form; add another kind.')
  if _FIGURE.value:
    command_line.output_file(_FIGURE.value, 'figure')  # checked before the benchmark runs
  compiled = {kind: [compile_setting(kind, n, causal) for n in lengths] for kind in chosen}
  if all(call is None for settings in compiled.values() for call, _ in settings):
    least = min(b for settings in compiled.values() for _, b in settings)
    raise app.UsageError(f'Every setting takes more compiled memory than --max_gb='
                         f'{_MAX_GB.value:g} (the least {least / 2 ** 30:.3g} GB), so none '
                         'would run; raise --max_gb or give shorter --lengths.')
  results = {}
  print(f'forward + backward, batch 1, {_HEADS.value} head(s) of width {_WIDTH.value}, '
        f'{"causal" if causal else "non-causal"}; time in ms (compiled memory in MB; — over '
        f'--max_gb={_MAX_GB.value:g})')
  print(f'{"kind":<10}' + ''.join(f'{n:>18}' for n in lengths))
  for kind in chosen:
    calls, memory = zip(*compiled[kind])
    row = list(zip(time_interleaved(calls), memory))
    results[kind] = row
    cells = [f'{"—" if s is None else f"{1e3 * s:.1f}"} ({b / 2 ** 20:.0f})' for s, b in row]
    print(f'{kind:<10}' + ''.join(f'{c:>18}' for c in cells), flush=True)
  print(f'\nfitted exponent b (n ≥ {FIT_FROM}) and where each kind overtakes exact attention')
  print(f'{"kind":<10} {"time b":>7} {"memory b":>9} {"faster than exact from n =":>27}')
  exact = results.get('exact')
  for kind, row in results.items():
    seconds, memory = [s for s, _ in row], [b for _, b in row]
    crossover = '—'
    if exact is not None and kind != 'exact' and any(s is not None for s in seconds):
      faster = [n for n, (s, _), (e, _) in zip(lengths, row, exact)
                if s is not None and (e is None or s < e)]
      crossover = str(faster[0]) if faster else 'never (in range)'
    time_b, memory_b = (fitted_exponent(lengths, v) for v in (seconds, memory))
    print(f'{kind:<10} {"—" if np.isnan(time_b) else f"{time_b:.2f}":>7} '
          f'{"—" if np.isnan(memory_b) else f"{memory_b:.2f}":>9} {crossover:>27}')
  if _FIGURE.value:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, (ax_time, ax_memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, row in results.items():
      kept = [(n, s, b) for n, (s, b) in zip(lengths, row) if s is not None]
      ax_time.loglog([n for n, _, _ in kept], [1e3 * s for _, s, _ in kept], 'o-', label=kind)
      ax_memory.loglog(lengths, [b / 2 ** 20 for _, b in row], 'o-', label=kind)
    ax_time.set(xlabel='sequence length n', ylabel='forward + backward (ms)', title='time')
    ax_memory.set(xlabel='sequence length n', ylabel='compiled memory (MB)', title='memory')
    ax_time.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(_FIGURE.value)), exist_ok=True)
    fig.savefig(_FIGURE.value, dpi=120)
    print(f'figure: {_FIGURE.value}')


if __name__ == '__main__':
  command_line.run(main)
