r"""Throughput of the train step (and of its input pipeline) for any experiment config.

  python benchmarks/train_step.py --config=experiments/configs/digits_mlp.py [--steps=200] \
      [--dtypes=float32,bfloat16]

Prints steps/s and examples/s of the compiled train step in the config's
parallel mode, the step's FLOPs from XLA's cost analysis, the achieved FLOP/s
as a fraction of this machine's float32 matmul peak (measured by this script in
the same run), and the input pipeline's examples/s. With several --dtypes the
step is measured once per compute dtype, in the same run, and compared.
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from train import loop

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Timed train steps.')
_PIPELINE_BATCHES = flags.DEFINE_integer('pipeline_batches', 200, 'Timed input batches.')
_DTYPES = flags.DEFINE_list('dtypes', None, 'Compute dtypes to measure (default: the config\'s).')
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
    run = loop.setup(config, workdir)
    par = run.parallel
    abstract = par.abstract_state(run.init_fn, run.rng)
    state = par.init_state(run.init_fn, run.rng)
    iterator = run.train_iterator()
    host_batch = next(iterator)

    # FLOPs of one global step (the same computation in every mode).
    global_step = jax.jit(run.train_step_fn())
    cost = global_step.lower(state, par.global_batch(host_batch)).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get('flops', float('nan')))

    train_step = par.compile_train_step(run.train_step_fn(), abstract)
    state = par.to_run_layout(state)
    batch = par.shard_batch(host_batch)
    for _ in range(3):  # compile and warm up
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    step_seconds = (time.perf_counter() - start) / steps

    start = time.perf_counter()
    for _ in range(_PIPELINE_BATCHES.value):
      next(iterator)
    batch_seconds = (time.perf_counter() - start) / _PIPELINE_BATCHES.value
    run.lock.release()
  return {'step_seconds': step_seconds, 'flops': flops, 'batch_seconds': batch_seconds,
          'mode': par.mode, 'devices': par.num_devices}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  peak, peak_n = matmul_peak_flops()
  batch_size = config.global_batch_size
  print(f'matmul peak (float32, {peak_n}x{peak_n}): {peak / 1e9:.2f} GFLOP/s')
  results = {}
  for dtype in _DTYPES.value or [config.model.get('dtype', 'float32')]:
    config.unlock()
    config.model.dtype = dtype
    config.lock()
    r = results[dtype] = measure_step(config, _STEPS.value)
    achieved = r['flops'] / r['step_seconds']
    print(f'config: {config.data.name} / {config.model.name} ({dtype}), mode={r["mode"]}, '
          f'devices={r["devices"]}, global batch {batch_size}')
    print(f'  train step: {1 / r["step_seconds"]:.1f} steps/s, '
          f'{batch_size / r["step_seconds"]:.0f} examples/s')
    print(f'  step FLOPs (XLA cost analysis): {r["flops"]:.4g}')
    print(f'  achieved: {achieved / 1e9:.3f} GFLOP/s = {achieved / peak:.2%} of the float32 '
          'matmul peak')
    print(f'  input pipeline: {batch_size / r["batch_seconds"]:.0f} examples/s '
          f'({r["step_seconds"] / r["batch_seconds"]:.1f}x the train step)')
  if len(results) > 1:
    first, *others = results
    for other in others:
      print(f'{other} step time / {first} step time: '
            f'{results[other]["step_seconds"] / results[first]["step_seconds"]:.2f}')


if __name__ == '__main__':
  app.run(main)
