"""benchmarks/hlo_dots.py reads every matrix product, with its FLOPs, from compiled HLO."""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import hlo_dots
from benchmarks.hlo_dots import Dot


def _loss(x_MxK, w_KxF, q_BxTxH, k_BxSxH):
  scores_BxTxS = jnp.einsum('bth,bsh->bts', q_BxTxH, k_BxSxH)
  return jnp.tanh(x_MxK @ w_KxF).sum() + jnp.sin(scores_BxTxS).sum()


def test_every_product_of_a_gradient_is_found_with_its_flops_and_batch_dimensions():
  M, K, F, B, T, S, H = 32, 16, 24, 3, 5, 7, 8
  args = [jnp.ones(shape) for shape in ((M, K), (K, F), (B, T, H), (B, S, H))]
  compiled = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1, 2, 3))).lower(*args).compile()
  text = compiled.as_text()
  dots = hlo_dots.dot_flops(text)
  # Forward x w and its two gradients x-side and w-side, each 2·M·K·F; the scores and their
  # two gradients, each 2·B·T·S·H with batch dimensions.
  assert sorted(dots.values()) == sorted([Dot(2 * M * K * F, False)] * 3 +
                                         [Dot(2 * B * T * S * H, True)] * 3)
  entry = text[text.index('ENTRY'):]
  for name in dots:  # top-level operations (what a profiler trace names), not fused inner dots
    assert re.search(rf'%{re.escape(name)} = ', entry), name


def test_products_carry_shapes_and_dimension_numbers_that_recompute_each_dot():
  M, K, F, B, T, S, H = 32, 16, 24, 3, 5, 7, 8
  args = [jnp.ones(shape) for shape in ((M, K), (K, F), (B, T, H), (B, S, H))]
  text = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1, 2, 3))).lower(*args).compile().as_text()
  products = hlo_dots.products(text)
  assert sorted(p.flops for p in products) == sorted([2 * M * K * F] * 3 + [2 * B * T * S * H] * 3)
  assert sorted(p.batched for p in products) == [False] * 3 + [True] * 3
  for p in products:
    (lhs_contracting, _), _ = p.dimension_numbers
    out = jax.eval_shape(lambda a, b, p=p: jax.lax.dot_general(a, b, p.dimension_numbers),
                         jax.ShapeDtypeStruct(p.lhs_shape, jnp.float32),
                         jax.ShapeDtypeStruct(p.rhs_shape, jnp.float32))
    contracted = np.prod([p.lhs_shape[d] for d in lhs_contracting])
    assert 2 * np.prod(out.shape) * contracted == p.flops, p
    assert p.dtype == p.out_dtype == 'f32'
  # The forward x w, as the program holds it.
  assert hlo_dots.Product((M, K), (K, F), (((1,), (0,)), ((), ())), 'f32', 'f32',
                          2 * M * K * F) in products


_COLUMN_MAJOR_LHS = '''HloModule m

ENTRY %main (a: f32[3,5], b: f32[2,5,7]) -> f32[2,3,7] {
  %a = f32[3,5]{0,1} parameter(0)
  %b = f32[2,5,7]{0,2,1} parameter(1)
  %dot.1 = f32[3,2,7]{2,1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  ROOT %t = f32[2,3,7]{2,1,0} transpose(%dot.1), dimensions={1,0,2}
}
'''


def test_operands_laid_out_otherwise_are_given_as_they_lie_in_memory():
  # a is [3, 5] stored column-major, so in memory it is aᵀ, [5, 3]; b is [2, 5, 7] stored with
  # its dims ordered 1, 2, 0 from major to minor, so in memory it is [5, 7, 2].
  (product,) = hlo_dots.products(_COLUMN_MAJOR_LHS)
  assert (product.lhs_shape, product.rhs_shape) == ((5, 3), (5, 7, 2))
  assert product.dimension_numbers == (((0,), (0,)), ((), ()))
  assert product.flops == 2 * 3 * 2 * 7 * 5
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(3, 5)), rng.normal(size=(2, 5, 7))
  got = jax.lax.dot_general(a.T, b.transpose(1, 2, 0), product.dimension_numbers)
  np.testing.assert_allclose(got, np.einsum('ik,bkj->ijb', a, b), rtol=1e-5, atol=1e-6)


def test_groups_within_a_budget_keep_every_product_in_order():
  sizes = [(10, 10), (30, 10), (5, 5), (100, 10), (1, 1), (20, 10)]  # lhs shapes; rhs (1, 1)
  listed = [hlo_dots.Product(s, (1, 1), (((1,), (0,)), ((), ())), 'f32', 'f32', i)
            for i, s in enumerate(sizes)]
  budget = 4 * 420
  groups = hlo_dots.groups_within(listed, budget)
  assert [p for group in groups for p in group] == listed
  for group in groups:
    used = sum(4 * (np.prod(p.lhs_shape) + 1) for p in group)
    assert used <= budget or len(group) == 1
  # Each group is as long as the budget allows: the next product would not have fitted.
  for group, after in zip(groups, groups[1:]):
    assert sum(4 * (np.prod(p.lhs_shape) + 1) for p in group + after[:1]) > budget
  assert [[p.flops for p in g] for g in groups] == [[0, 1], [2], [3], [4, 5]]


def test_the_alone_program_computes_each_product_and_the_timing_covers_every_group(monkeypatch):
  M, K, F = 64, 32, 48
  listed = [hlo_dots.Product((M, K), (K, F), (((1,), (0,)), ((), ())), 'f32', 'f32', 2 * M * K * F),
            hlo_dots.Product((M, K), (M, F), (((0,), (0,)), ((), ())), 'f32', 'f32', 2 * M * K * F),
            hlo_dots.Product((2, M, K), (2, K, F), (((2,), (1,)), ((0,), (0,))), 'bf16', 'f32',
                             4 * M * K * F)]
  program, operands = hlo_dots.alone_program(listed, jax.random.PRNGKey(0))
  outputs = program(operands)
  for out, (lhs, rhs), spec in zip(outputs, operands, ('mk,kf->mf', 'mk,mf->kf', 'bmk,bkf->bmf')):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    assert out.dtype == jnp.float32 and np.std(lhs) > 0.5  # random operands, not zeros
    np.testing.assert_allclose(out, np.einsum(spec, lhs, rhs), rtol=1e-4, atol=1e-4)
  assert [o.shape for o in outputs] == [(M, F), (K, F), (2, M, F)]
  budget = 4 * 2 * M * (K + F)  # two groups: the first two products, then the third
  assert [len(g) for g in hlo_dots.groups_within(listed, budget)] == [2, 1]
  assert 0 < hlo_dots.products_alone_seconds(listed, budget_bytes=budget, repeats=3) < 10
  # On a clock whose calls last 1, 2, 3 s in the first group and 10, 30, 20 s in the second,
  # the time is the sum of the groups' medians: 2 + 20 s, every group's products compiled.
  ends = iter(np.cumsum([0, 1, 0, 2, 0, 3, 0, 10, 0, 30, 0, 20]))
  monkeypatch.setattr(hlo_dots, 'time', types.SimpleNamespace(perf_counter=lambda: next(ends)))
  timed = []
  alone_program = hlo_dots.alone_program
  monkeypatch.setattr(hlo_dots, 'alone_program',
                      lambda group, key: timed.append(group) or alone_program(group, key))
  assert hlo_dots.products_alone_seconds(listed, budget_bytes=budget, repeats=3) == 22
  assert timed == hlo_dots.groups_within(listed, budget)


def test_kinds_count_each_distinct_product_in_the_order_it_first_occurs():
  a = hlo_dots.Product((4, 3), (3, 2), (((1,), (0,)), ((), ())), 'f32', 'f32', 48)
  b = a._replace(dimension_numbers=(((0,), (0,)), ((), ())), lhs_shape=(3, 4))
  c = a._replace(dtype='bf16')  # same shapes, another type: another kind
  assert hlo_dots.kinds([b, a, b, c, b, a]) == [(b, 3), (a, 2), (c, 1)]
  assert hlo_dots.kinds([]) == []


def test_each_product_as_one_matrix_product_keeps_its_flops():
  M, K, F, B, T, S, H = 32, 16, 24, 3, 5, 7, 8
  args = [jnp.ones(shape) for shape in ((M, K), (K, F), (B, T, H), (B, S, H))]
  text = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1, 2, 3))).lower(*args).compile().as_text()
  for p in hlo_dots.products(text) + hlo_dots.products(_COLUMN_MAJOR_LHS):
    plain = hlo_dots.as_one_matrix_product(p)
    (rows, contracted), (contracted_too, columns) = plain.lhs_shape, plain.rhs_shape
    assert contracted == contracted_too and plain.dimension_numbers == (((1,), (0,)), ((), ()))
    assert 2 * rows * contracted * columns == p.flops == plain.flops, (p, plain)
    assert (plain.dtype, plain.out_dtype) == (p.dtype, p.out_dtype)
  # The attention's per-head scores: the 16 · 4 batches of [128, 64] · [64, 128] as one
  # [8192, 64] · [64, 128]; the column-major example, [5, 3]ᵀ · [5, 7, 2], as [3, 5] · [5, 14].
  scores = hlo_dots.Product((16, 4, 128, 64), (16, 4, 64, 128), (((3,), (2,)), ((0, 1), (0, 1))),
                            'f32', 'f32', 2 * 16 * 4 * 128 * 64 * 128)
  assert hlo_dots.as_one_matrix_product(scores)[:2] == ((8192, 64), (64, 128))
  (column_major,) = hlo_dots.products(_COLUMN_MAJOR_LHS)
  assert hlo_dots.as_one_matrix_product(column_major)[:2] == ((3, 5), (5, 14))
  # A plain product is its own: its operands are already [M, K] and [K, N].
  forward = hlo_dots.Product((M, K), (K, F), (((1,), (0,)), ((), ())), 'f32', 'f32', 2 * M * K * F)
  assert hlo_dots.as_one_matrix_product(forward) == forward


def test_control_flow_ops_are_the_programs_loop_and_conditional():
  def f(h, w, p):
    h = jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), h, None, length=5)[0]
    return jax.lax.cond(p > 0, lambda h: jnp.sin(h @ w), lambda h: h * 2, h)

  text = jax.jit(f).lower(jnp.ones((16, 16)), jnp.ones((16, 16)), 1.0).compile().as_text()
  names = hlo_dots.control_flow_ops(text)
  opcodes = sorted(re.search(rf'%{re.escape(name)} = .*? (\w+)\(', text).group(1)
                   for name in names)
  assert opcodes == ['conditional', 'while']


# A fusion computing two products (a plain one first, then one with batch dimensions), a call
# of a computation holding a product, and a product whose left operand keeps its batch
# dimension between its free and contracted ones in memory. The called computation's
# parameters have no layouts: such arrays are row-major.
_FUSION_CALL_AND_LAYOUT = '''HloModule m

%fused_products (p0: f32[8,6], p1: f32[6,5], p2: f32[2,4,3], p3: f32[2,3,5]) -> f32[2,4,5] {
  %p0 = f32[8,6]{1,0} parameter(0)
  %p1 = f32[6,5]{1,0} parameter(1)
  %dot.0 = f32[8,5]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bitcast.0 = f32[2,4,5]{2,1,0} bitcast(%dot.0)
  %p2 = f32[2,4,3]{2,1,0} parameter(2)
  %p3 = f32[2,3,5]{2,1,0} parameter(3)
  %dot.1 = f32[2,4,5]{2,1,0} dot(%p2, %p3), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %add.0 = f32[2,4,5]{2,1,0} add(%bitcast.0, %dot.1)
}

%callee (c0: f32[8,6], c1: f32[6,5]) -> f32[8,5] {
  %c0 = f32[8,6] parameter(0)
  %c1 = f32[6,5] parameter(1)
  ROOT %dot.2 = f32[8,5]{1,0} dot(%c0, %c1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[8,6], b: f32[6,5], q: f32[2,4,3], k: f32[2,3,5], t: f32[3,2,4], u: f32[2,4,5]) -> f32[2,3,5] {
  %a = f32[8,6] parameter(0)
  %b = f32[6,5] parameter(1)
  %q = f32[2,4,3] parameter(2)
  %k = f32[2,3,5] parameter(3)
  %products_fusion = f32[2,4,5]{2,1,0} fusion(%a, %b, %q, %k), kind=kOutput, calls=%fused_products
  %call.1 = f32[8,5]{1,0} call(%a, %b), to_apply=%callee
  %t = f32[3,2,4]{2,0,1} parameter(4)
  %u = f32[2,4,5]{1,0,2} parameter(5)
  ROOT %dot.3 = f32[2,3,5]{2,1,0} dot(%t, %u), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}
'''


def test_a_fusion_of_two_products_counts_both_and_is_batched_if_either_is():
  dots = hlo_dots.dot_flops(_FUSION_CALL_AND_LAYOUT)
  # [8, 6]·[6, 5]: 2·8·5·6 = 480; 2 batches of [4, 3]·[3, 5]: 2·2·4·5·3 = 240.
  assert dots['products_fusion'] == Dot(480 + 240, True)
  assert dots['dot.2'] == Dot(480, False)  # the called computation's own product
  assert dots['dot.3'] == Dot(2 * 2 * 3 * 5 * 4, True)
  assert 'dot.0' not in dots and 'dot.1' not in dots  # inside the fusion: the fusion's


def test_a_batch_dimension_stored_between_others_is_given_where_it_lies_in_memory():
  products = hlo_dots.products(_FUSION_CALL_AND_LAYOUT)
  # The called computation's product (operands without a layout: row-major), then the fusion's.
  assert [(p.lhs_shape, p.rhs_shape) for p in products[:3]] == [
      ((8, 6), (6, 5)), ((8, 6), (6, 5)), ((2, 4, 3), (2, 3, 5))]
  assert products[0].dimension_numbers == (((1,), (0,)), ((), ()))
  # t is [3, 2, 4] stored with its dims ordered 1, 0, 2 from major to minor: in memory it is
  # [2, 3, 4], batch dimension first; u is [2, 4, 5] stored in the order 2, 0, 1: in memory it
  # is [5, 2, 4], batch dimension in the middle.
  last = products[-1]
  assert (last.lhs_shape, last.rhs_shape) == ((2, 3, 4), (5, 2, 4))
  assert last.dimension_numbers == (((2,), (2,)), ((0,), (1,)))
  rng = np.random.default_rng(0)
  t, u = rng.normal(size=(3, 2, 4)), rng.normal(size=(2, 4, 5))
  got = jax.lax.dot_general(t.transpose(1, 0, 2), u.transpose(2, 0, 1), last.dimension_numbers)
  np.testing.assert_allclose(got, np.einsum('tbh,bhs->bts', t, u), rtol=1e-5, atol=1e-6)


def test_control_flow_ops_include_a_call():
  assert hlo_dots.control_flow_ops(_FUSION_CALL_AND_LAYOUT) == {'call.1'}


def test_a_group_may_fill_the_budget_exactly_and_an_oversized_first_product_stands_alone():
  def product(rows):  # operands of 4 · (rows + 1) bytes
    return hlo_dots.Product((rows, 1), (1, 1), (((1,), (0,)), ((), ())), 'f32', 'f32', rows)

  # 4 · (9 + 1) + 4 · (14 + 1) = 100 bytes: exactly the budget, one group.
  assert [[p.flops for p in g] for g in hlo_dots.groups_within(
      [product(9), product(14), product(1)], 100)] == [[9, 14], [1]]
  # A first product over the budget is a group of its own, with no empty group before it.
  assert [[p.flops for p in g] for g in hlo_dots.groups_within(
      [product(99), product(1)], 100)] == [[99], [1]]


def test_the_alone_program_takes_operands_of_each_hlo_element_type():
  for hlo_type, dtype in (('f16', jnp.float16), ('bf16', jnp.bfloat16), ('f32', jnp.float32)):
    listed = [hlo_dots.Product((4, 3), (3, 2), (((1,), (0,)), ((), ())), hlo_type, hlo_type, 48)]
    program, ((lhs, rhs),) = hlo_dots.alone_program(listed, jax.random.PRNGKey(0))
    (out,) = program([(lhs, rhs)])
    assert lhs.dtype == rhs.dtype == out.dtype == dtype, hlo_type


# bf16 operands into an f32 result, as `preferred_element_type=jnp.float32` compiles.
_BF16_INTO_F32 = '''HloModule m

ENTRY %main (a: bf16[4,3], b: bf16[2,3]) -> f32[4,2] {
  %a = bf16[4,3]{1,0} parameter(0)
  %b = bf16[2,3]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}
'''


def test_a_product_keeps_its_operands_type_and_its_results_apart():
  (product,) = hlo_dots.products(_BF16_INTO_F32)
  assert (product.dtype, product.out_dtype) == ('bf16', 'f32')
  assert product == hlo_dots.Product((4, 3), (2, 3), (((1,), (1,)), ((), ())), 'bf16', 'f32',
                                     2 * 4 * 2 * 3)
  # Alone, it is timed on bf16 operands into an f32 result, as the step computes it.
  program, ((lhs, rhs),) = hlo_dots.alone_program([product], jax.random.PRNGKey(0))
  (out,) = program([(lhs, rhs)])
  assert (lhs.dtype, rhs.dtype, out.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)


# A batched product whose right operand is stored with its batch dimension last.
_RHS_BATCH_LAST = '''HloModule m

ENTRY %main (q: f32[2,4,3], k: f32[2,3,5]) -> f32[2,4,5] {
  %q = f32[2,4,3]{2,1,0} parameter(0)
  %k = f32[2,3,5]{0,2,1} parameter(1)
  ROOT %dot.1 = f32[2,4,5]{2,1,0} dot(%q, %k), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}
'''


def test_the_right_operands_dimensions_are_given_where_they_lie_in_its_own_memory():
  # k is [2, 3, 5] stored with its dims ordered 1, 2, 0 from major to minor: in memory it is
  # [3, 5, 2], contracted dimension first and batch dimension last.
  (product,) = hlo_dots.products(_RHS_BATCH_LAST)
  assert (product.lhs_shape, product.rhs_shape) == ((2, 4, 3), (3, 5, 2))
  assert product.dimension_numbers == (((2,), (0,)), ((0,), (2,)))
  assert product.flops == 2 * 2 * 4 * 5 * 3
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 3, 5))
  got = jax.lax.dot_general(q, k.transpose(1, 2, 0), product.dimension_numbers)
  np.testing.assert_allclose(got, np.einsum('bth,bhs->bts', q, k), rtol=1e-5, atol=1e-6)
