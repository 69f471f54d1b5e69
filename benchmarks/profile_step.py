r"""Where the train step's time goes: a jax.profiler trace, summarised by operation.

  python benchmarks/profile_step.py --config=experiments/configs/fashion_mnist_resnet.py \
      [--steps=10] [--top=15] [--trace_dir=DIR]

Compiles the config's train step, warms it up, traces `--steps` steps with
`jax.profiler` (kept in --trace_dir, viewable in Perfetto or TensorBoard) and
prints the device operations that took the most time: the share of the traced
op time of each op kind (the op name without its numeric suffix, e.g.
`transpose_copy_fusion` for `transpose_copy_fusion.12`), its calls per step and
milliseconds per step. Operations that compute matrix products (read from the
compiled program, `benchmarks/hlo_dots.py`) are kinds of their own, `… (dot)`
or `… (batched dot)` (products with batch dimensions, such as attention's per
head), so XLA:CPU's YNNPACK fusions of products are told from its YNNPACK
fusions of reductions and elementwise work; the products' FLOPs over their
traced time give the FLOP/s they ran at. XLA:CPU runs independent operations
side by side, so traced times can overlap: their sum may exceed the step's.
Over several devices, calls and times are summed over the devices.
"""

import collections
import functools
import glob
import gzip
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from benchmarks import hlo_dots
from experiments import command_line
from train import loop
from train import xla_cpu

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
command_line.load_config_files_with('config')  # a bad --config is one sentence, at once
_STEPS = flags.DEFINE_integer('steps', 10, 'Traced train steps.', lower_bound=1)
_TOP = flags.DEFINE_integer('top', 15, 'Op kinds to print.', lower_bound=1)
_TRACE_DIR = flags.DEFINE_string('trace_dir', None, 'Where to keep the trace (default: a '
                                 'temporary folder, removed afterwards).')
flags.mark_flags_as_required(['config'])

# Trace events that are not device operations (Python, runtime bookkeeping).
_SKIPPED = re.compile(r'^(\$|PjitFunction|CommonPjRt|ThunkExecutor|TfrtCpu|Execute|jit_|'
                      r'ProcessInputs|XlaModule|Thunk|end_of_|ExecuteHelper|pjit|\[)')


def op_kind(name: str) -> str:
  """`transpose_copy_fusion.12` → `transpose_copy_fusion`."""
  return re.sub(r'(\.\d+)+$', '', name)


def summarise(trace_dir: str, steps: int, dots: dict[str, hlo_dots.Dot] | None = None
              ) -> list[tuple[str, float, float, float]]:
  """(op kind, share of op time, calls per step, ms per step) from the trace, largest first;
  the operations named in `dots` are kinds `<kind> (dot)` or `<kind> (batched dot)`."""
  dots = dots or {}
  files = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
  if not files:
    raise FileNotFoundError(f'No *.trace.json.gz under {trace_dir}; the profiler wrote nothing.')
  with gzip.open(max(files, key=os.path.getmtime), 'rt') as f:
    events = json.load(f)['traceEvents']
  total_us, calls = collections.Counter(), collections.Counter()
  for event in events:
    if event.get('ph') != 'X' or _SKIPPED.match(event.get('name', '')):
      continue
    kind = op_kind(event['name'])
    if event['name'] in dots:
      kind += ' (batched dot)' if dots[event['name']].batched else ' (dot)'
    total_us[kind] += event.get('dur', 0)
    calls[kind] += 1
  all_us = sum(total_us.values()) or 1
  return [(kind, us / all_us, calls[kind] / steps, us / 1e3 / steps)
          for kind, us in total_us.most_common()]


def main(argv):
  del argv
  xla_cpu.keep_convolutions_off_ynnpack()
  print(f'XLA_FLAGS: {os.environ["XLA_FLAGS"]}')
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  with tempfile.TemporaryDirectory() as workdir, tempfile.TemporaryDirectory() as tmp_trace:
    trace_dir = _TRACE_DIR.value or tmp_trace
    run = loop.setup(config, workdir)
    par = run.parallel
    state = par.to_run_layout(par.init_state(run.init_fn, run.rng))
    train_step = par.compile_train_step(run.train_step_fn(), par.abstract_state(run.init_fn, run.rng))
    batch = par.shard_batch(next(run.train_iterator()))
    # The compiled program's products (jit modes; a pmap step has no `lower`).
    lower = getattr(train_step, 'lower', None) or getattr(getattr(train_step, 'jitted', None),
                                                          'lower', None)
    dots = hlo_dots.dot_flops(lower(state, batch).compile().as_text()) if lower else {}
    # Each local device runs that program, and the trace holds every device's operations.
    traced_devices = sum(d.process_index == jax.process_index() for d in par.mesh.devices.flat)
    for _ in range(3):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.start_trace(trace_dir)
    for _ in range(_STEPS.value):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.stop_trace()
    run.lock.release()
    rows = summarise(trace_dir, _STEPS.value, dots)
  print(f'config: {config.data.name} / {config.model.name} ({config.model.get("dtype")}), '
        f'{_STEPS.value} traced steps')
  print(f'{"op kind":<40} {"share":>7} {"calls/step":>11} {"ms/step":>9}')
  for kind, share, per_step, ms in rows[:_TOP.value]:
    print(f'{kind:<40} {share:>7.1%} {per_step:>11.1f} {ms:>9.2f}')
  print(f'traced op time per step: {sum(r[3] for r in rows):.1f} ms')
  for label, batched in (('products', None), ('  without batch dimensions', False),
                         ('  with batch dimensions', True)):
    chosen = [d for d in dots.values() if batched is None or d.batched == batched]
    ms = sum(r[3] for r in rows if r[0].endswith(('(dot)', '(batched dot)')) and (
        batched is None or r[0].endswith('(batched dot)') == batched))
    flops = sum(d.flops for d in chosen) * traced_devices
    if chosen and ms:
      print(f'{label}: {len(chosen) * traced_devices} per step, {flops:.4g} FLOP, '
            f'{ms:.1f} ms traced ({flops / ms / 1e6:.1f} GFLOP/s while traced)')


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                  needs_workdir=False))
