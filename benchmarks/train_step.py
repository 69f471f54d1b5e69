r"""Throughput of the train step (and of its input pipeline) for any experiment config.

  python benchmarks/train_step.py --config=experiments/configs/digits_mlp.py [--steps=200] \
      [--dtypes=float32,bfloat16]
  python benchmarks/train_step.py --config=experiments/configs/shakespeare_char_lstm.py \
      --sweep=model.unroll:1,4,16

Prints steps/s and examples/s of the compiled train step in the config's
parallel mode, the step's FLOPs from XLA's cost analysis, the achieved FLOP/s
as a fraction of this machine's float32 matmul peak (measured by this script in
the same run), and the input pipeline's examples/s (and tokens/s for token windows).
With --products_alone (the default) it also runs the step's matrix products, read
from the compiled step (`benchmarks/hlo_dots.py`), in a program that holds
nothing else: their speed there is what the step would reach if it were nothing
but its products, the ceiling its other work and its layouts keep it under. With
--products_by_kind each kind of product is also timed alone, and as one row-major
[M, K] · [K, N] product of the same FLOPs (`hlo_dots.as_one_matrix_product`), which shows
what batch dimensions and transposed operands cost on this backend. With several
--dtypes, or the values of one config field given by --sweep (a field of one
bool, int, float or str, its values read as the type it declares), the step is
measured once per setting, in the same run, and compared. Every setting is checked
as training checks its config (`loop.setup`) before anything is timed.

XLA's cost analysis counts the body of a loop once, not once per iteration;
so for a model with an `unroll` option (a recurrent layer's scan over time)
the FLOPs are those of the same step with the scan fully unrolled, which has
no loop over time, and with gradient accumulation (`grad_accum_steps` > 1, a
scan over micro-batches) those of the same global batch in one micro-batch,
which leaves out only the few adds per parameter that accumulate the gradients
(each only compiled, never run). Any other loop over floating-point values in the
step (a block-sparse attention's over blocks of keys, say) is counted once too, and
the script says so.
"""

import dataclasses
import functools
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
from ml_collections.config_flags import config_path

from benchmarks import hlo_dots
from benchmarks import runs
from experiments import command_line
from models import registry
from train import xla_cpu

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
command_line.load_config_files_with('config')  # a bad --config is one sentence, at once
_STEPS = flags.DEFINE_integer('steps', 200, 'Timed train steps.', lower_bound=1)
_PIPELINE_BATCHES = flags.DEFINE_integer('pipeline_batches', 200, 'Timed input batches.',
                                         lower_bound=1)
_DTYPES = flags.DEFINE_list('dtypes', None, 'Compute dtypes to measure (default: the config\'s).')
_PRODUCTS_ALONE = flags.DEFINE_bool('products_alone', True, 'Also time the step\'s matrix '
                                    'products alone.')
_BY_KIND = flags.DEFINE_bool('products_by_kind', False, 'Also time each kind of the step\'s '
                             'matrix products alone, and as one [M, K]·[K, N] product of its '
                             'FLOPs.')
_SWEEP = flags.DEFINE_string('sweep', None, 'FIELD:V1,V2,... — measure the step once per value of '
                             'the config field FIELD (e.g. model.unroll:1,4,16).')
flags.mark_flags_as_required(['config'])


def matmul_peak_flops(sizes=(512, 1024, 2048), repeats=5) -> tuple[float, int]:
  """Best float32 FLOP/s of a square matmul on the default device, and its size."""
  best = (0.0, 0)
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      matmul(a, b).block_until_ready()
      times.append(time.perf_counter() - start)
    best = max(best, (2 * n**3 / min(times), n))
  return best


def measure_step(config, steps: int) -> dict:
  """Steps/s and FLOPs of `config`'s compiled train step, and its input pipeline's batches/s."""
  with tempfile.TemporaryDirectory() as workdir:
    run = runs.setup(config, workdir)
    par = run.parallel
    abstract = par.abstract_state(run.init_fn, run.rng)
    state = par.init_state(run.init_fn, run.rng)
    iterator = run.train_iterator()
    host_batch = next(iterator)

    global_step = one_device_step(run, state, host_batch)
    if loops_counted_once(config):
      flops, loops_left = loop_free_step_flops(config)
    else:
      flops, loops_left = compiled_flops(global_step), count_loops(global_step)
    products = [p for p in hlo_dots.products(global_step.as_text())
                if p.dtype in hlo_dots.HLO_DTYPES]  # floating point

    train_step = par.compile_train_step(run.train_step_fn(), abstract)
    state = par.to_run_layout(state)
    batch = par.shard_batch(host_batch)
    for _ in range(3):  # compile and warm up
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    faults = page_faults()
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    step_seconds = (time.perf_counter() - start) / steps
    faults_per_step = None if faults is None else (page_faults() - faults) / steps

    start = time.perf_counter()
    for _ in range(_PIPELINE_BATCHES.value):
      next(iterator)
    batch_seconds = (time.perf_counter() - start) / _PIPELINE_BATCHES.value
    run.lock.release()
  del state, metrics, batch
  alone = hlo_dots.products_alone_seconds(products) if _PRODUCTS_ALONE.value and products else None
  by_kind = products_by_kind(products) if _BY_KIND.value else []
  return {'step_seconds': step_seconds, 'flops': flops, 'loops_left': loops_left,
          'batch_seconds': batch_seconds, 'page_faults_per_step': faults_per_step,
          'mode': par.mode, 'devices': par.num_devices, 'products': products,
          'products_seconds': alone, 'by_kind': by_kind}


def figures(measured: dict, batch_size: int, window: int | None, peak: float) -> dict:
  """The figures printed for one measurement (`measure_step`'s) of a step on `batch_size`
  examples (windows of `window` tokens, or None): the step's steps/s, examples/s, tokens/s
  (None without windows), FLOP/s and their fraction of the matmul `peak`; its products' FLOPs,
  their FLOP/s alone and its fraction of `peak` (None if not timed); the input pipeline's
  examples/s and how many of its batches it makes per train step."""
  step, alone = measured['step_seconds'], measured['products_seconds']
  achieved = measured['flops'] / step
  products_flops = sum(p.flops for p in measured['products'])
  return {'steps_per_second': 1 / step, 'examples_per_second': batch_size / step,
          'tokens_per_second': batch_size * window / step if window else None,
          'flops_per_second': achieved, 'fraction_of_peak': achieved / peak,
          'products_flops': products_flops,
          'products_flops_per_second': products_flops / alone if alone else None,
          'products_fraction_of_peak': products_flops / alone / peak if alone else None,
          'pipeline_examples_per_second': batch_size / measured['batch_seconds'],
          'pipeline_over_step': step / measured['batch_seconds']}


def products_by_kind(products, repeats: int = 9) -> list[tuple]:
  """(product, count, seconds alone, seconds as one [M, K]·[K, N] product) of each kind of
  `products`, each the median of `repeats` calls of a program that holds only that product
  (a product that already is [M, K]·[K, N] is timed once)."""
  timed = []
  for product, count in hlo_dots.kinds(products):
    plain = hlo_dots.as_one_matrix_product(product)
    seconds = hlo_dots.products_alone_seconds([product], repeats=repeats)
    plain_seconds = (seconds if plain == product else
                     hlo_dots.products_alone_seconds([plain], repeats=repeats))
    timed.append((product, count, seconds, plain_seconds))
  return timed


def print_by_kind(by_kind, peak: float) -> None:
  print('  its products kind by kind, each alone (operands as they lie in memory; contracted '
        'and batch dimensions), and as one [M, K]·[K, N] product of the same FLOPs:')
  for product, count, seconds, plain_seconds in by_kind:
    (lhs_c, rhs_c), (lhs_b, rhs_b) = product.dimension_numbers
    batch = f', batch {list(lhs_b)}·{list(rhs_b)}' if lhs_b else ''
    plain = hlo_dots.as_one_matrix_product(product)
    print(f'    {count:3d} × {list(product.lhs_shape)} · {list(product.rhs_shape)} '
          f'(contracting {list(lhs_c)}·{list(rhs_c)}{batch}, {product.dtype}): '
          f'{seconds * 1e3:.3f} ms each, {product.flops / seconds / 1e9:.1f} GFLOP/s '
          f'({product.flops / seconds / peak:.0%}); as {list(plain.lhs_shape)} · '
          f'{list(plain.rhs_shape)}: {product.flops / plain_seconds / 1e9:.1f} GFLOP/s')
  total = sum(count * seconds for _, count, seconds, _ in by_kind)
  flops = sum(count * product.flops for product, count, _, _ in by_kind)
  print(f'  all {sum(count for _, count, _, _ in by_kind)}, kind by kind: {total * 1e3:.1f} ms, '
        f'{flops / total / 1e9:.3f} GFLOP/s = {flops / total / peak:.2%} of the matmul peak')


def one_device_step(run, state, host_batch):
  """`run`'s train step on the whole global batch, compiled for one device.

  Its FLOPs and matrix products are those of one global step in every parallel mode: compiled
  over several devices, XLA's cost analysis counts one device's share. The model is the one
  'jit' runs: under 'shard_map' and 'pmap' batch norm averages its statistics over the device
  axis, which this step, unmapped, has not (it normalises by the whole batch's alike).
  """
  device = jax.devices()[0]
  step = run.train_step_fn()
  if getattr(run.model, 'batch_norm_axis_name', None) is not None:
    step = functools.partial(step, model=run.model.clone(batch_norm_axis_name=None))
  return jax.jit(step).lower(jax.device_put(jax.device_get(state), device),
                             jax.device_put(host_batch, device)).compile()


def page_faults() -> int | None:
  """The process's page faults so far (minor ones, served without reading a disk), or None
  where the OS does not count them: each maps in a page of fresh memory, which a step that
  reuses its buffers does not need (train/xla_cpu.py)."""
  try:
    import resource  # pylint: disable=g-import-not-at-top
  except ImportError:  # not a Unix
    return None
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def compiled_flops(compiled) -> float:
  """FLOPs of a compiled program by XLA's cost analysis."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get('flops', float('nan')))


def count_loops(compiled) -> int:
  """The number of loops (HLO `while` ops) in a compiled program that carry floating-point
  values (not, say, a random-bit generator's rounds over unsigned integers)."""
  floating = re.compile(rf'\b(?:{"|".join(hlo_dots.HLO_DTYPES)})\[')
  return sum(bool(floating.search(line.split(' while(')[0]))
             for line in compiled.as_text().splitlines() if ' while(' in line)


def loops_counted_once(config) -> list[str]:
  """How the FLOPs of `config`'s train step are counted without each loop this script knows
  of (a recurrent layer's scan, the micro-batches), whose body XLA's cost analysis counts once;
  empty if the step has neither."""
  loops = []
  if _takes_unroll(config):
    loops.append('scan unrolled')
  if config.get('grad_accum_steps', 1) > 1:
    loops.append('micro-batches as one batch')
  return loops


def _takes_unroll(config) -> bool:
  """Whether `config`'s model has an `unroll` option, given by the config or left at the
  model's default."""
  model = registry.MODELS.get(config.model.get('name'))
  fields = {f.name for f in dataclasses.fields(model)} if dataclasses.is_dataclass(model) else ()
  return 'unroll' in config.model or 'unroll' in fields


_LOOP_FREE_FLOPS = {}


def forget_loop_free_flops() -> None:
  """Forgets the loop-free FLOPs counted so far, which are kept per config: for a caller that
  changes what the model computes without changing its config (`benchmarks/free_parts.py`)."""
  _LOOP_FREE_FLOPS.clear()


def loop_free_step_flops(config) -> tuple[float, int]:
  """FLOPs of `config`'s train step with its scan over time fully unrolled and its
  micro-batches as one batch (once per config up to `unroll` and `grad_accum_steps`, which
  change the loops, not the arithmetic, but for the adds that accumulate micro-batches),
  and the number of loops that step still holds."""
  config = config.copy_and_resolve_references()
  if _takes_unroll(config):
    with config.unlocked():
      config.model.unroll = 10**6  # more than any length: lax.scan unrolls it all
  if 'grad_accum_steps' in config:
    config.grad_accum_steps = 1
  key = config.to_json()
  if key not in _LOOP_FREE_FLOPS:
    _LOOP_FREE_FLOPS[key] = _compiled_flops(config)
  return _LOOP_FREE_FLOPS[key]


def _compiled_flops(config) -> tuple[float, int]:
  with tempfile.TemporaryDirectory() as workdir:
    run = runs.setup(config, workdir)
    state = run.parallel.init_state(run.init_fn, run.rng)
    compiled = one_device_step(run, state, next(run.train_iterator()))
    run.lock.release()
  return compiled_flops(compiled), count_loops(compiled)


def _settings(config) -> list[tuple[str, str, object]]:
  """(label, config field, value) of every measurement the flags ask for; a bad --dtypes or
  --sweep is a UsageError in one sentence (called before anything is timed)."""
  if _SWEEP.value and _DTYPES.value is not None:
    raise app.UsageError('--sweep and --dtypes cannot be given together; sweep the dtype '
                         'instead, e.g. --sweep=model.dtype:float32,bfloat16.')
  if _SWEEP.value:
    field, sep, values = _SWEEP.value.partition(':')
    if not field or not sep or not values:
      raise app.UsageError(f'--sweep={_SWEEP.value} must read FIELD:V1,V2,... '
                           '(e.g. model.unroll:1,4,16).')
    try:
      kind = config_path.get_type(field, config)
    except (KeyError, AttributeError, IndexError, TypeError, ValueError):
      raise app.UsageError(f'--sweep field {field!r} is not in the config, so it has no '
                           'values to sweep.') from None
    current = config_path.get_value(field, config)
    if isinstance(current, ml_collections.ConfigDict):
      fields = f'; sweep one of its fields: {", ".join(sorted(current))}' if current else ''
      raise app.UsageError(f'--sweep field {field!r} is a group of fields, not one value{fields}.')
    if kind not in (bool, int, float, str):
      raise app.UsageError(f'--sweep field {field!r} holds {current!r}, not one bool, int, float '
                           'or str, so --sweep cannot set it.')
    try:
      parsed = [_parse(kind, v) for v in values.split(',')]
    except ValueError:
      raise app.UsageError(f'--sweep values {values!r} are not all {kind.__name__}s, the type of '
                           f'{field}.') from None
    if field == 'model.dtype':
      _check_dtypes(parsed, '--sweep')
    return [(f'{field}={v}', field, v) for v in parsed]
  if _DTYPES.value is not None:
    _check_dtypes(_DTYPES.value, '--dtypes')
  dtypes = _DTYPES.value or [config.model.get('dtype', 'float32')]
  return [(dtype, 'model.dtype', dtype) for dtype in dtypes]


def _check_settings(config, settings) -> None:
  """Runs `loop.setup`'s checks of `config` with each of `settings` (writing only into a
  temporary folder); a setting it refuses is a UsageError in its one sentence."""
  for _, field, value in settings:
    _set(config, field, value)
    with tempfile.TemporaryDirectory() as workdir:
      runs.setup(config, workdir).lock.release()


def _check_dtypes(dtypes: list[str], flag: str) -> None:
  """UsageError unless `dtypes`, given by `flag`, are one or more compute dtypes of a model."""
  allowed = ', '.join(registry.DTYPES)
  if not dtypes:
    raise app.UsageError(f'{flag}= names no dtype; give one or more of: {allowed}.')
  bad = [d for d in dtypes if d not in registry.DTYPES]
  if bad:
    raise app.UsageError(f'{flag} has {bad[0]!r}, which is not a compute dtype; allowed: '
                         f'{allowed}.')


def _parse(kind: type, text: str):
  """`text` as a value of `kind`; a bool from true/false (bool('False') would be True)."""
  if kind is bool:
    if text.lower() not in ('true', 'false'):
      raise ValueError(text)
    return text.lower() == 'true'
  return kind(text)


def _set(config, field: str, value) -> None:
  *path, last = field.split('.')
  parent = config
  for key in path:
    parent = parent[key]
  config.unlock()
  parent[last] = value
  config.lock()


def main(argv):
  del argv
  xla_cpu.keep_convolutions_off_ynnpack()
  kept = xla_cpu.keep_freed_host_memory()
  print(f'XLA_FLAGS: {os.environ["XLA_FLAGS"]}')
  print('malloc: ' + ('freed memory kept for reuse (train/xla_cpu.py)' if kept
                       else "the C library's and the environment's settings"))
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  settings = _settings(config)  # every --dtypes and --sweep value checked before any timing
  _check_settings(config, settings)
  peak, peak_n = matmul_peak_flops()
  print(f'matmul peak (float32, {peak_n}x{peak_n}): {peak / 1e9:.2f} GFLOP/s')
  results = {}
  for label, field, value in settings:
    _set(config, field, value)
    r = results[label] = measure_step(config, _STEPS.value)
    batch_size, window = config.global_batch_size, config.data.get('window')  # a sweep may set them
    f = figures(r, batch_size, window, peak)
    print(f'config: {config.data.name} / {config.model.name} ({label}), mode={r["mode"]}, '
          f'devices={r["devices"]}, global batch {batch_size}')
    tokens = f', {f["tokens_per_second"]:.0f} tokens/s' if window else ''
    faults = r.get('page_faults_per_step')
    faults = '' if faults is None else f'; {faults:.0f} page faults per step'
    print(f'  train step: {f["steps_per_second"]:.2f} steps/s, '
          f'{f["examples_per_second"]:.0f} examples/s{tokens}{faults}')
    loops = ''.join(f', {loop}' for loop in loops_counted_once(config))
    print(f'  step FLOPs (XLA cost analysis{loops}): {r["flops"]:.4g}')
    if r['loops_left']:
      print(f'  (the step holds {r["loops_left"]} more loop(s) over floating-point values, '
            'such as a block-sparse attention\'s, whose bodies XLA counts once: these FLOPs '
            'and the fraction below are lower bounds)')
    print(f'  achieved: {f["flops_per_second"] / 1e9:.3f} GFLOP/s = {f["fraction_of_peak"]:.2%} '
          'of the float32 matmul peak')
    if r['products_seconds']:
      once = ' (a loop body\'s once)' if loops else ''
      print(f'  its {len(r["products"])} matrix products alone{once}: {f["products_flops"]:.4g} '
            f'FLOP ({f["products_flops"] / r["flops"]:.1%} of the step\'s) in '
            f'{r["products_seconds"] * 1e3:.1f} ms, {f["products_flops_per_second"] / 1e9:.3f} '
            f'GFLOP/s = {f["products_fraction_of_peak"]:.2%} of the matmul peak')
    if r['by_kind']:
      print_by_kind(r['by_kind'], peak)
    print(f'  input pipeline: {f["pipeline_examples_per_second"]:.0f} examples/s '
          f'({f["pipeline_over_step"]:.1f}x the train step)')
  if len(results) > 1:
    first, *others = results
    for other in others:
      print(f'{other} step time / {first} step time: '
            f'{results[other]["step_seconds"] / results[first]["step_seconds"]:.2f}')


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                  needs_workdir=False))
