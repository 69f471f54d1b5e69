"""The matrix products of a compiled XLA program, read from its HLO text.

`dot_flops(compiled.as_text())` maps the name of every top-level operation that
computes a dot (a `dot` itself, or a fusion whose computation holds one, such as
XLA:CPU's YNNPACK fusions) to its FLOPs, 2 · (output elements) · (contracted
length), and whether it has batch dimensions (the attention's per-head
products do; the dense layers' do not). Profiler traces name operations the
same way, so `benchmarks/profile_step.py` can tell the products' time from the
rest and give their achieved FLOP/s.
"""

import math
import re
from typing import NamedTuple

# `  ROOT %name = f32[2,3]{1,0} opcode(operands), attributes`
_INSTRUCTION = re.compile(r'^\s+(?:ROOT )?%?([\w.\-]+) = (?:\w+)\[([\d,]*)\]\S* ([\w\-]+)\((.*)$')
_HEADER = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) ')


class Dot(NamedTuple):
  flops: int
  batched: bool


def dot_flops(hlo_text: str) -> dict[str, Dot]:
  """{operation name: Dot(flops, batched)} for the operations that compute matrix products."""
  shapes: dict[tuple[str, str], list[int]] = {}
  in_computation: dict[str, Dot] = {}    # a computation's own products, summed
  calls: dict[tuple[str, str], str] = {}  # (computation, fusion name) → called computation
  order: list[tuple[str, str]] = []      # every (computation, instruction), in text order
  computation = None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():
      header = _HEADER.match(line)
      computation = header.group(1) if header and line.rstrip().endswith('{') else None
      continue
    match = _INSTRUCTION.match(line)
    if not match or computation is None:
      continue
    name, dims, opcode, rest = match.groups()
    shapes[computation, name] = [int(d) for d in dims.split(',') if d]
    order.append((computation, name))
    if opcode == 'dot':
      lhs = re.match(r'\s*%?([\w.\-]+)', rest).group(1)
      contracting = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', rest).group(1)
      lhs_dims = shapes[computation, lhs]
      length = math.prod(lhs_dims[int(i)] for i in contracting.split(',') if i)
      dot = Dot(2 * math.prod(shapes[computation, name]) * length, 'lhs_batch_dims=' in rest)
      in_computation[f'{computation}/{name}'] = dot
      total = in_computation.get(computation, Dot(0, False))
      in_computation[computation] = Dot(total.flops + dot.flops, total.batched or dot.batched)
    called = re.search(r'calls=%?([\w.\-]+)', rest)
    if opcode == 'fusion' and called:
      calls[computation, name] = called.group(1)
  fused = set(calls.values())  # computations inside a fusion: their dots are the fusion's
  result = {}
  for computation, name in order:
    if (computation, name) in calls and calls[computation, name] in in_computation:
      result[name] = in_computation[calls[computation, name]]
    elif computation not in fused and f'{computation}/{name}' in in_computation:
      result[name] = in_computation[f'{computation}/{name}']
  return result
