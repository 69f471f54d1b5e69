"""benchmarks/profile_step.py sums a trace's device operations by kind."""

import gzip
import json
import os

import pytest

from benchmarks import profile_step
from benchmarks.hlo_dots import Dot


def _write_trace(trace_dir, events):
  os.makedirs(os.path.join(trace_dir, 'plugins', 'profile', 'run'))
  path = os.path.join(trace_dir, 'plugins', 'profile', 'run', 'host.trace.json.gz')
  with gzip.open(path, 'wt') as f:
    json.dump({'traceEvents': events}, f)


def test_operations_are_summed_by_kind_per_step_and_runtime_events_are_left_out(tmp_path):
  op = lambda name, dur: {'ph': 'X', 'name': name, 'dur': dur, 'pid': 1, 'tid': 1}
  events = [op('transpose_copy_fusion.12', 300), op('transpose_copy_fusion.7', 100),
            op('ynn_fusion.3', 400), op('ynn_fusion.4.1', 200), op('ynn_fusion.5', 800),
            # Runtime bookkeeping around the program, and a non-duration event.
            op('CommonPjRtLoadedExecutable::Execute (jit_train_step)', 5000),
            op('ThunkExecutor::Execute', 3000), op('$builtins isinstance', 50),
            {'ph': 'i', 'name': 'ynn_fusion.3', 'pid': 1, 'tid': 1}]
  _write_trace(str(tmp_path), events)
  dots = {'ynn_fusion.5': Dot(flops=10**6, batched=False),
          'ynn_fusion.4.1': Dot(flops=10**5, batched=True)}
  rows = profile_step.summarise(str(tmp_path), steps=2, dots=dots)
  # 1,800 µs of device operations over 2 steps.
  assert [(kind, calls) for kind, _, calls, _ in rows] == [
      ('ynn_fusion (dot)', 0.5), ('transpose_copy_fusion', 1.0), ('ynn_fusion', 0.5),
      ('ynn_fusion (batched dot)', 0.5)]
  shares = {kind: share for kind, share, _, _ in rows}
  ms = {kind: ms for kind, _, _, ms in rows}
  assert shares == pytest.approx({'ynn_fusion (dot)': 800 / 1800,
                                  'transpose_copy_fusion': 400 / 1800, 'ynn_fusion': 400 / 1800,
                                  'ynn_fusion (batched dot)': 200 / 1800})
  assert ms == pytest.approx({'ynn_fusion (dot)': 0.4, 'transpose_copy_fusion': 0.2,
                              'ynn_fusion': 0.2, 'ynn_fusion (batched dot)': 0.1})


def test_an_empty_trace_folder_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='trace.json.gz'):
    profile_step.summarise(str(tmp_path), steps=1)
