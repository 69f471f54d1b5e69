"""The matrix products of a compiled XLA program, read from its HLO text.

`dot_flops(compiled.as_text())` maps the name of every top-level operation that
computes a dot (a `dot` itself, or a fusion whose computation holds one, such as
XLA:CPU's YNNPACK fusions) to its FLOPs, 2 · (output elements) · (contracted
length), and whether it has batch dimensions (the attention's per-head
products do; the dense layers' do not). Profiler traces name operations the
same way, so `benchmarks/profile_step.py` can tell the products' time from the
rest and give their achieved FLOP/s.

`products(compiled.as_text())` lists the same dots one by one, each with its
operands' shapes as they lie in memory and its dimension numbers, and
`products_alone_seconds` runs them in a program that holds nothing else:
`benchmarks/train_step.py` gives their speed there, what the step would reach
if it were only its products.
"""

import collections
import math
import re
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp

# `  ROOT %name = f32[2,3]{1,0} opcode(operands), attributes`
_INSTRUCTION = re.compile(
    r'^\s+(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\](?:\{([\d,]*)[^}]*\})?\S* ([\w\-]+)\((.*)$')
_HEADER = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) ')
_OPERANDS = re.compile(r'\s*%?([\w.\-]+)\s*,\s*%?([\w.\-]+)\s*\)')


class Dot(NamedTuple):
  flops: int
  batched: bool


class Product(NamedTuple):
  """One dot, with its operands laid out row-major as they lie in memory in the program.

  `dimension_numbers` are `lax.dot_general`'s, ((lhs contracting, rhs contracting),
  (lhs batch, rhs batch)), for operands of shapes `lhs_shape` and `rhs_shape`.
  """
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  dimension_numbers: tuple[tuple[tuple[int, ...], tuple[int, ...]],
                           tuple[tuple[int, ...], tuple[int, ...]]]
  dtype: str      # the operands' HLO element type, e.g. 'f32' or 'bf16'
  out_dtype: str
  flops: int

  @property
  def batched(self) -> bool:
    return bool(self.dimension_numbers[1][0])


def _dims(rest: str, attribute: str) -> tuple[int, ...]:
  found = re.search(attribute + r'=\{([\d,]*)\}', rest)
  return tuple(int(i) for i in found.group(1).split(',') if i) if found else ()


def _in_memory(shape: list[int], layout: tuple[int, ...] | None):
  """The row-major shape of an array as it lies in memory, and where each logical dim went."""
  if not layout or len(layout) != len(shape):
    return tuple(shape), list(range(len(shape)))
  major_to_minor = list(reversed(layout))
  position = [major_to_minor.index(d) for d in range(len(shape))]
  return tuple(shape[d] for d in major_to_minor), position


def _products_by_operation(hlo_text: str) -> dict[str, list[Product]]:
  """{top-level operation name: the products it computes}, in the order of the text."""
  arrays: dict[tuple[str, str], tuple[str, list[int], tuple[int, ...] | None]] = {}
  in_computation: dict[str, list[Product]] = {}  # a computation's own products
  own: dict[str, Product] = {}                   # 'computation/name' of a dot → its product
  calls: dict[tuple[str, str], str] = {}         # (computation, fusion name) → called computation
  order: list[tuple[str, str]] = []              # every (computation, instruction), in text order
  computation = None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():
      header = _HEADER.match(line)
      computation = header.group(1) if header and line.rstrip().endswith('{') else None
      continue
    match = _INSTRUCTION.match(line)
    if not match or computation is None:
      continue
    name, dtype, dims, layout, opcode, rest = match.groups()
    shape = [int(d) for d in dims.split(',') if d]
    layout = tuple(int(d) for d in layout.split(',') if d) if layout is not None else None
    arrays[computation, name] = (dtype, shape, layout)
    order.append((computation, name))
    if opcode == 'dot':
      lhs, rhs = _OPERANDS.match(rest).groups()
      (lhs_dtype, lhs_logical, lhs_layout), (_, rhs_logical, rhs_layout) = (
          arrays[computation, lhs], arrays[computation, rhs])
      lhs_shape, lhs_at = _in_memory(lhs_logical, lhs_layout)
      rhs_shape, rhs_at = _in_memory(rhs_logical, rhs_layout)
      contracting = _dims(rest, 'lhs_contracting_dims')
      numbers = ((tuple(lhs_at[d] for d in contracting),
                  tuple(rhs_at[d] for d in _dims(rest, 'rhs_contracting_dims'))),
                 (tuple(lhs_at[d] for d in _dims(rest, 'lhs_batch_dims')),
                  tuple(rhs_at[d] for d in _dims(rest, 'rhs_batch_dims'))))
      flops = 2 * math.prod(shape) * math.prod(lhs_logical[d] for d in contracting)
      product = Product(lhs_shape, rhs_shape, numbers, lhs_dtype, dtype, flops)
      own[f'{computation}/{name}'] = product
      in_computation.setdefault(computation, []).append(product)
    called = re.search(r'calls=%?([\w.\-]+)', rest)
    if opcode == 'fusion' and called:
      calls[computation, name] = called.group(1)
  fused = set(calls.values())  # computations inside a fusion: their dots are the fusion's
  result = {}
  for computation, name in order:
    if (computation, name) in calls and calls[computation, name] in in_computation:
      result[name] = in_computation[calls[computation, name]]
    elif computation not in fused and f'{computation}/{name}' in own:
      result[name] = [own[f'{computation}/{name}']]
  return result


def dot_flops(hlo_text: str) -> dict[str, Dot]:
  """{operation name: Dot(flops, batched)} for the operations that compute matrix products."""
  return {name: Dot(sum(p.flops for p in found), any(p.batched for p in found))
          for name, found in _products_by_operation(hlo_text).items()}


_CONTROL_FLOW = re.compile(r'^\s+(?:ROOT )?%?([\w.\-]+) = .*? (?:while|conditional|call)\(')


def control_flow_ops(hlo_text: str) -> set[str]:
  """Names of the program's `while`, `conditional` and `call` operations: each runs other
  computations, whose operations a profiler trace holds as events of their own, within the
  span of its event."""
  return {match.group(1) for match in map(_CONTROL_FLOW.match, hlo_text.splitlines()) if match}


def products(hlo_text: str) -> list[Product]:
  """Every matrix product the program computes (a loop body's once), in the order of the text."""
  return [p for found in _products_by_operation(hlo_text).values() for p in found]


HLO_DTYPES = {'f32': jnp.float32, 'bf16': jnp.bfloat16, 'f16': jnp.float16, 'f64': jnp.float64}


def _operand_bytes(product: Product) -> int:
  itemsize = jnp.dtype(HLO_DTYPES[product.dtype]).itemsize
  return (math.prod(product.lhs_shape) + math.prod(product.rhs_shape)) * itemsize


def groups_within(product_list: list[Product], budget_bytes: int) -> list[list[Product]]:
  """`product_list` cut, in order, into groups whose operands take at most `budget_bytes` together
  (a product whose operands alone exceed it is a group of its own)."""
  groups, used = [], budget_bytes + 1
  for product in product_list:
    size = _operand_bytes(product)
    if used + size > budget_bytes:
      groups.append([])
      used = 0
    groups[-1].append(product)
    used += size
  return groups


def alone_program(group: list[Product], key: jax.Array):
  """A function computing the products of `group` and nothing else, and random operands for it."""
  operands = []
  for product in group:
    key, lhs_key, rhs_key = jax.random.split(key, 3)
    dtype = HLO_DTYPES[product.dtype]
    operands.append((jax.random.normal(lhs_key, product.lhs_shape, dtype),
                     jax.random.normal(rhs_key, product.rhs_shape, dtype)))

  def program(operands):
    return [jax.lax.dot_general(lhs, rhs, p.dimension_numbers,
                                preferred_element_type=HLO_DTYPES[p.out_dtype])
            for p, (lhs, rhs) in zip(group, operands)]

  return program, operands


def products_alone_seconds(product_list: list[Product], budget_bytes: int = 1 << 30,
                           repeats: int = 5) -> float:
  """Seconds to compute `product_list` (floating point) in jitted programs that
  hold nothing else, on fresh random operands: each program the median of `repeats` calls,
  one program per group of products whose operands fit in `budget_bytes`, summed."""
  total = 0.0
  for i, group in enumerate(groups_within(product_list, budget_bytes)):
    program, operands = alone_program(group, jax.random.PRNGKey(i))
    compiled = jax.jit(program).lower(operands).compile()
    jax.block_until_ready(compiled(operands))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(operands))
      times.append(time.perf_counter() - start)
    total += sorted(times)[len(times) // 2]
  return total


def kinds(product_list: list[Product]) -> list[tuple[Product, int]]:
  """The distinct products of `product_list` (same operands in memory, dimension numbers and
  types), each with how often it occurs, in the order each first occurs."""
  return list(collections.Counter(product_list).items())


def as_one_matrix_product(product: Product) -> Product:
  """`product` as one row-major [M, K] · [K, N] matrix product with its FLOPs: M the left
  operand's batch and free dimensions, K the contracted ones, N the right operand's free ones.

  The speed of that product is what `product` would reach without batch dimensions or
  transposed operands: for the attention's per-head products (64 batches of 128 × 64 × 128,
  say) it is that of [8192, 64] · [64, 128].
  """
  (lhs_contracting, rhs_contracting), (_, rhs_batch) = product.dimension_numbers
  contracted = math.prod(product.lhs_shape[d] for d in lhs_contracting)
  rows = math.prod(product.lhs_shape) // contracted
  columns = math.prod(size for d, size in enumerate(product.rhs_shape)
                      if d not in rhs_contracting and d not in rhs_batch)
  return Product((rows, contracted), (contracted, columns), (((1,), (0,)), ((), ())),
                 product.dtype, product.out_dtype, product.flops)
