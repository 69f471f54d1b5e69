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
fusions of reductions and elementwise work; each traced call of a product counts
its FLOPs (so a loop body's products count once per iteration run), and the
products' FLOPs over their traced time give the FLOP/s they ran at. Loops,
conditionals and calls are left out of the table: their events span their
bodies' operations, which are counted themselves (a pmap step's program is not
read, so there they stay in, and there are no products). XLA:CPU runs independent
operations side by side, so traced times can overlap: their sum may exceed the
step's. Over several devices, calls, times and FLOPs are summed over the devices.
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
from typing import Collection, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from benchmarks import hlo_dots
from benchmarks import runs
from experiments import command_line
from train import xla_cpu

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
command_line.load_config_files_with('config')  # a bad --config is one sentence, at once
_STEPS = flags.DEFINE_integer('steps', 10, 'Traced train steps.', lower_bound=1)
_TOP = flags.DEFINE_integer('top', 15, 'Op kinds to print.', lower_bound=1)
_TRACE_DIR = flags.DEFINE_string('trace_dir', None, 'Where to keep the trace (default: a '
                                 'temporary folder, removed afterwards).')
flags.mark_flags_as_required(['config'])

# Trace events that are not device operations (Python, runtime bookkeeping, and XLA:CPU's
# thread-pool waits and op ends, which lie within an operation's event).
_SKIPPED = re.compile(r'^(\$|PjitFunction|CommonPjRt|ThunkExecutor|TfrtCpu|Execute|jit_|'
                      r'ProcessInputs|XlaModule|Thunk|end_of_|ExecuteHelper|pjit|\[|'
                      r'SlinkyThreadPool|ThreadpoolListener|end: |Wait for |Allocate|Handle |'
                      r'ParseArguments|PythonRefManager)')
_PRODUCT_KINDS = (' (dot)', ' (batched dot)')


class Row(NamedTuple):
  """One op kind of a trace, per traced step: its share of the traced op time, its calls, its
  milliseconds and the FLOPs of its calls (of products; 0 for other kinds)."""
  kind: str
  share: float
  calls: float
  ms: float
  flops: float


def op_kind(name: str) -> str:
  """`transpose_copy_fusion.12` → `transpose_copy_fusion`."""
  return re.sub(r'(\.\d+)+$', '', name)


def summarise(trace_dir: str, steps: int, dots: dict[str, hlo_dots.Dot] | None = None,
              control_flow: Collection[str] = ()) -> list[Row]:
  """The trace's operations by kind, largest time first; the operations named in `dots` are
  kinds `<kind> (dot)` or `<kind> (batched dot)`, each call counted with its dot's FLOPs (a
  loop body's products once per iteration run). The operations named in `control_flow` (see
  `hlo_dots.control_flow_ops`) are left out: their events span their bodies' operations,
  which are counted themselves."""
  dots = dots or {}
  files = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
  if not files:
    raise FileNotFoundError(f'No *.trace.json.gz under {trace_dir}; the profiler wrote nothing.')
  with gzip.open(max(files, key=os.path.getmtime), 'rt') as f:
    events = json.load(f)['traceEvents']
  total_us, calls, flops = collections.Counter(), collections.Counter(), collections.Counter()
  for event in events:
    name = event.get('name', '')
    if event.get('ph') != 'X' or _SKIPPED.match(name) or name in control_flow:
      continue
    kind = op_kind(name)
    if name in dots:
      kind += _PRODUCT_KINDS[dots[name].batched]
      flops[kind] += dots[name].flops
    total_us[kind] += event.get('dur', 0)
    calls[kind] += 1
  all_us = sum(total_us.values()) or 1
  return [Row(kind, us / all_us, calls[kind] / steps, us / 1e3 / steps, flops[kind] / steps)
          for kind, us in total_us.most_common()]


def products(rows: list[Row]) -> list[tuple[str, float, float, float]]:
  """(label, calls, FLOPs, ms) per step of the products among `rows`: all of them, those
  without batch dimensions and those with; a group with no calls is left out."""
  groups = (('products', _PRODUCT_KINDS), ('  without batch dimensions', _PRODUCT_KINDS[:1]),
            ('  with batch dimensions', _PRODUCT_KINDS[1:]))
  found = []
  for label, kinds in groups:
    chosen = [row for row in rows if row.kind.endswith(kinds)]
    if chosen:
      found.append((label, sum(r.calls for r in chosen), sum(r.flops for r in chosen),
                    sum(r.ms for r in chosen)))
  return found


def gflops_per_second(flops: float, ms: float) -> float:
  """GFLOP/s of `flops` FLOPs in `ms` milliseconds."""
  return flops / ms / 1e6


def main(argv):
  del argv
  xla_cpu.keep_convolutions_off_ynnpack()
  xla_cpu.keep_freed_host_memory()
  print(f'XLA_FLAGS: {os.environ["XLA_FLAGS"]}')
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if _TRACE_DIR.value:  # else the profiler fails only after the step is compiled and traced
    why = command_line.unwritable(os.path.join(_TRACE_DIR.value, 'trace'))
    if why:
      raise app.UsageError(f'--trace_dir={_TRACE_DIR.value} cannot hold the trace: {why}.')
  with tempfile.TemporaryDirectory() as workdir, tempfile.TemporaryDirectory() as tmp_trace:
    trace_dir = _TRACE_DIR.value or tmp_trace
    run = runs.setup(config, workdir)
    par = run.parallel
    state = par.to_run_layout(par.init_state(run.init_fn, run.rng))
    train_step = par.compile_train_step(run.train_step_fn(), par.abstract_state(run.init_fn, run.rng))
    batch = par.shard_batch(next(run.train_iterator()))
    # The compiled program's products (jit modes; a pmap step has no `lower`).
    lower = getattr(train_step, 'lower', None) or getattr(getattr(train_step, 'jitted', None),
                                                          'lower', None)
    text = lower(state, batch).compile().as_text() if lower else ''
    dots, control_flow = hlo_dots.dot_flops(text), hlo_dots.control_flow_ops(text)
    for _ in range(3):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.start_trace(trace_dir)
    for _ in range(_STEPS.value):
      state, metrics = train_step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.stop_trace()
    run.lock.release()
    rows = summarise(trace_dir, _STEPS.value, dots, control_flow)
  print(f'config: {config.data.name} / {config.model.name} ({config.model.get("dtype")}), '
        f'{_STEPS.value} traced steps')
  print(f'{"op kind":<40} {"share":>7} {"calls/step":>11} {"ms/step":>9}')
  for row in rows[:_TOP.value]:
    print(f'{row.kind:<40} {row.share:>7.1%} {row.calls:>11.1f} {row.ms:>9.2f}')
  print(f'traced op time per step: {sum(row.ms for row in rows):.1f} ms')
  for label, calls, flops, ms in products(rows):
    if ms:
      print(f'{label}: {calls:.1f} calls per step, {flops:.4g} FLOP per step, {ms:.1f} ms '
            f'traced per step ({gflops_per_second(flops, ms):.1f} GFLOP/s while traced)')


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                  needs_workdir=False))
