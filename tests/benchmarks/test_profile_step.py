"""benchmarks/profile_step.py sums a trace's device operations by kind, with the products'
FLOPs of every traced call."""

import gzip
import json
import os

import jax
import jax.numpy as jnp
import pytest

from benchmarks import hlo_dots
from benchmarks import profile_step
from benchmarks.hlo_dots import Dot
from tests.subprocess_util import run_python


def _write_trace(trace_dir, events):
  os.makedirs(os.path.join(trace_dir, 'plugins', 'profile', 'run'))
  path = os.path.join(trace_dir, 'plugins', 'profile', 'run', 'host.trace.json.gz')
  with gzip.open(path, 'wt') as f:
    json.dump({'traceEvents': events}, f)


def _op(name, dur, tid=1):
  return {'ph': 'X', 'name': name, 'dur': dur, 'pid': 1, 'tid': tid}


def test_operations_are_summed_by_kind_per_step_and_runtime_events_are_left_out(tmp_path):
  events = [_op('transpose_copy_fusion.12', 300), _op('transpose_copy_fusion.7', 100),
            _op('ynn_fusion.3', 400), _op('ynn_fusion.4.1', 200), _op('ynn_fusion.5', 800),
            # Runtime bookkeeping around the program, XLA:CPU's waits and ends within an
            # operation, and a non-duration event.
            _op('CommonPjRtLoadedExecutable::Execute (jit_train_step)', 5000),
            _op('ThunkExecutor::Execute', 3000), _op('$builtins isinstance', 50),
            _op('SlinkyThreadPool::Await', 700), _op('end: ynn_fusion', 1),
            _op('ThreadpoolListener::Record', 0),
            {'ph': 'i', 'name': 'ynn_fusion.3', 'pid': 1, 'tid': 1}]
  _write_trace(str(tmp_path), events)
  dots = {'ynn_fusion.5': Dot(flops=10**6, batched=False),
          'ynn_fusion.4.1': Dot(flops=10**5, batched=True)}
  rows = profile_step.summarise(str(tmp_path), steps=2, dots=dots)
  # 1,800 µs of device operations over 2 steps.
  assert [(row.kind, row.calls) for row in rows] == [
      ('ynn_fusion (dot)', 0.5), ('transpose_copy_fusion', 1.0), ('ynn_fusion', 0.5),
      ('ynn_fusion (batched dot)', 0.5)]
  assert {row.kind: row.share for row in rows} == pytest.approx({
      'ynn_fusion (dot)': 800 / 1800, 'transpose_copy_fusion': 400 / 1800,
      'ynn_fusion': 400 / 1800, 'ynn_fusion (batched dot)': 200 / 1800})
  assert {row.kind: row.ms for row in rows} == pytest.approx({
      'ynn_fusion (dot)': 0.4, 'transpose_copy_fusion': 0.2, 'ynn_fusion': 0.2,
      'ynn_fusion (batched dot)': 0.1})
  assert {row.kind: row.flops for row in rows} == {
      'ynn_fusion (dot)': 5e5, 'transpose_copy_fusion': 0, 'ynn_fusion': 0,
      'ynn_fusion (batched dot)': 5e4}


def test_a_loop_counts_each_products_flops_per_traced_call_and_not_its_own_span(tmp_path):
  # A loop of 3 iterations per step, each a dot (100 µs) and a tanh (20 µs) on other threads,
  # inside the span of the loop's own event (400 µs); 2 steps traced.
  events = []
  for _ in range(2):
    events.append(_op('while.5', 400, tid=1))
    for _ in range(3):
      events += [_op('ynn_fusion.2', 100, tid=2), _op('wrapped_tanh', 20, tid=3)]
  _write_trace(str(tmp_path), events)
  dots = {'ynn_fusion.2': Dot(flops=2 * 64 * 64 * 64, batched=False)}
  rows = profile_step.summarise(str(tmp_path), steps=2, dots=dots, control_flow={'while.5'})
  assert [row.kind for row in rows] == ['ynn_fusion (dot)', 'wrapped_tanh']
  assert sum(row.ms for row in rows) == pytest.approx(3 * 0.12)  # the loop's span left out
  assert profile_step.products(rows) == [
      ('products', 3, 3 * 2 * 64**3, pytest.approx(0.3)),
      ('  without batch dimensions', 3, 3 * 2 * 64**3, pytest.approx(0.3))]


def test_products_are_grouped_with_and_without_batch_dimensions_and_rated_in_gflops():
  row = profile_step.Row
  rows = [row('ynn_fusion (dot)', 0.5, 4, 2.0, 8e9), row('copy', 0.2, 9, 1.0, 0),
          row('dot (batched dot)', 0.2, 2, 1.0, 1e9), row('dot (dot)', 0.1, 1, 0.5, 2e9)]
  assert profile_step.products(rows) == [('products', 7, 11e9, 3.5),
                                         ('  without batch dimensions', 5, 10e9, 2.5),
                                         ('  with batch dimensions', 2, 1e9, 1.0)]
  # 11e9 FLOPs in 3.5 ms: 3,142.9 GFLOP/s.
  assert profile_step.gflops_per_second(11e9, 3.5) == pytest.approx(11 / 3.5 * 1e3)


def test_a_traced_scan_of_matrix_products_counts_every_iterations_flops(tmp_path):
  # The compiled program holds the product once, in the loop's body; the trace holds it once
  # per iteration.
  iterations, steps, n = 6, 2, 64

  def f(h, w):
    return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), h, None, length=iterations)[0]

  h, w = jnp.ones((n, n)), jnp.full((n, n), 0.01)
  compiled = jax.jit(f).lower(h, w).compile()
  text = compiled.as_text()
  dots, control_flow = hlo_dots.dot_flops(text), hlo_dots.control_flow_ops(text)
  assert list(dots.values()) == [Dot(2 * n**3, False)]
  assert any(name.startswith('while') for name in control_flow)
  jax.block_until_ready(compiled(h, w))
  jax.profiler.start_trace(str(tmp_path))
  for _ in range(steps):
    jax.block_until_ready(compiled(h, w))
  jax.profiler.stop_trace()
  rows = profile_step.summarise(str(tmp_path), steps, dots, control_flow)
  assert not [row.kind for row in rows if row.kind == 'while']
  (label, calls, flops, ms), _ = profile_step.products(rows)
  assert (label, calls, flops) == ('products', iterations, iterations * 2 * n**3) and ms > 0


def test_an_empty_trace_folder_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='trace.json.gz'):
    profile_step.summarise(str(tmp_path), steps=1)


def test_the_newest_trace_in_the_folder_is_summarised(tmp_path):
  # A --trace_dir kept from an earlier run holds its trace too: the summary is of this run's.
  for run, (name, mtime) in enumerate((('old_fusion.1', 1_000_000), ('new_fusion.1', 2_000_000))):
    folder = tmp_path / 'plugins' / 'profile' / f'run{run}'
    folder.mkdir(parents=True)
    path = folder / 'host.trace.json.gz'
    with gzip.open(path, 'wt') as f:
      json.dump({'traceEvents': [_op(name, 100)]}, f)
    os.utime(path, (mtime, mtime))
  # Listed newest first as well as last, so that neither order of the listing decides it.
  os.utime(tmp_path / 'plugins' / 'profile' / 'run0' / 'host.trace.json.gz', (3_000_000,) * 2)
  assert [row.kind for row in profile_step.summarise(str(tmp_path), steps=1)] == ['old_fusion']
  os.utime(tmp_path / 'plugins' / 'profile' / 'run1' / 'host.trace.json.gz', (4_000_000,) * 2)
  assert [row.kind for row in profile_step.summarise(str(tmp_path), steps=1)] == ['new_fusion']


@pytest.mark.parametrize('name', [
    '$builtins len', 'PjitFunction(train_step)', 'CommonPjRtBuffer::Delete',
    'ThunkExecutor::Execute', 'TfrtCpuExecutable::ExecuteHelper', 'Execute', 'jit_train_step',
    'ProcessInputs', 'XlaModule:#hlo_module=jit_train_step#', 'Thunk:#name=dot.1#',
    'end_of_step', 'ExecuteHelper', 'pjit_call', '[1] ynn_fusion', 'SlinkyThreadPool::Await',
    'ThreadpoolListener::Record', 'end: ynn_fusion', 'Wait for ready', 'Allocate buffers',
    'Handle inputs', 'ParseArguments', 'PythonRefManager::CollectGarbage'])
def test_runtime_events_are_not_device_operations(tmp_path, name):
  _write_trace(str(tmp_path), [_op('wrapped_tanh.3', 100), _op(name, 5000)])
  rows = profile_step.summarise(str(tmp_path), steps=1)
  assert [(row.kind, row.share, row.ms) for row in rows] == [('wrapped_tanh', 1.0, 0.1)]


def test_the_script_traces_its_steps_and_rates_the_products_read_from_the_compiled_step(
    tmp_path):
  # A made-up run whose step is a loop of 3 products of 2·32³ FLOPs, traced over 2 steps: the
  # table has --top rows, and the products line counts 3 calls and their FLOPs per step. In
  # its own process: the script parses the process's flags.
  iterations, n = 3, 32
  printed = run_python(f'''
      import contextlib, io, json, types
      from absl import flags
      import jax, jax.numpy as jnp
      from benchmarks import profile_step

      def step(state, batch):
        h = jax.lax.scan(lambda h, _: (jnp.tanh(h @ batch), None), state, None,
                         length={iterations})[0]
        return h, {{'loss': h.sum()}}

      par = types.SimpleNamespace(
          init_state=lambda init_fn, rng: jnp.ones(({n}, {n})), to_run_layout=lambda s: s,
          abstract_state=lambda init_fn, rng: None, shard_batch=lambda b: b,
          compile_train_step=lambda fn, abstract: jax.jit(step))
      run = types.SimpleNamespace(
          parallel=par, init_fn=None, rng=None, train_step_fn=lambda: step,
          lock=types.SimpleNamespace(release=lambda: None),
          train_iterator=lambda: iter([jnp.full(({n}, {n}), 0.01)]))
      profile_step.runs = types.SimpleNamespace(setup=lambda c, w: run)
      # XLA's flags and malloc's settings are this process's, its backend already started.
      profile_step.xla_cpu = types.SimpleNamespace(keep_convolutions_off_ynnpack=lambda: None,
                                                   keep_freed_host_memory=lambda: None)
      printed = {{}}
      for top in (1, 100):
        flags.FLAGS(['profile_step.py', '--config=experiments/configs/digits_mlp.py',
                     '--steps=2', f'--top={{top}}', f'--trace_dir={tmp_path}/{{top}}'])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
          profile_step.main([])
        flags.FLAGS.unparse_flags()
        printed[top] = out.getvalue().splitlines()
      print(json.dumps(printed))
      ''')
  for top, lines in printed.items():
    header = lines.index(next(line for line in lines if line.startswith('op kind')))
    end = lines.index(next(line for line in lines if line.startswith('traced op time per step')))
    rows = lines[header + 1:end]
    assert len(rows) == 1 if top == '1' else len(rows) > 1
    # The loop's own event, which spans its body's operations, is no row.
    assert not [row for row in rows if row.startswith('while')], rows
    products = next(line for line in lines if line.startswith('products: '))
    assert products.startswith(f'products: {iterations}.0 calls per step, '
                               f'{iterations * 2 * n**3:.4g} FLOP per step, '), products
