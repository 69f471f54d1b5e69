"""Block-sparse attention (Child et al. 2019) against the float64 reference attention with each
pattern's set A_i built by loops from its definition; padding, bfloat16, argument errors, and
the compiled cost of 'local' growing linearly with the length."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import core, sparse
from tests.models.test_attention import draw, reference_attention
from tests.models.test_attention_chunked import reference_gradients


def pattern_allowed(pattern, steps, block, causal, summary=1):
  """[T, T] True where query i may attend to key j, by loops over the definitions."""
  allowed = np.zeros((steps, steps), bool)
  for i in range(steps):
    for j in range(steps):
      if pattern == 'local':
        neighbours = (-1, 0) if causal else (-1, 0, 1)
        ok = j // block - i // block in neighbours
      elif pattern == 'strided':
        ok = abs(i - j) < block or (i - j) % block == 0
      else:
        ok = j // block == i // block or j % block >= block - summary
      allowed[i, j] = ok and (j <= i or not causal)
  return allowed


CASES = {
    # name: (pattern, T, block, causal, summary, key lengths or None)
    'local': ('local', 24, 4, False, 1, None),
    'local_causal': ('local', 24, 4, True, 1, None),
    'strided': ('strided', 24, 4, False, 1, None),
    'strided_causal': ('strided', 24, 4, True, 1, None),
    'fixed': ('fixed', 24, 4, False, 2, None),
    'fixed_causal': ('fixed', 24, 4, True, 2, None),
    # T = 22 is not a multiple of the block (padded inside); a row of length 0 gives zeros.
    'local_causal_padding': ('local', 22, 4, True, 1, [22, 9, 0]),
    'strided_padding': ('strided', 22, 4, False, 1, [22, 13, 0]),
    'fixed_causal_padding': ('fixed', 22, 5, True, 3, [22, 7, 0]),
}
B, N, H = 3, 2, 4


def _case(name):
  pattern, steps, block, causal, summary, lengths = CASES[name]
  q, k, v = (draw((B, steps, N, H), seed, scale=1.5) for seed in (1, 2, 3))
  valid_BxT = None if lengths is None else np.arange(steps)[None, :] < np.array(lengths)[:, None]
  allowed_BxTxT = np.broadcast_to(pattern_allowed(pattern, steps, block, causal, summary),
                                  (B, steps, steps))
  if valid_BxT is not None:
    allowed_BxTxT = allowed_BxTxT & valid_BxT[:, None, :]
  kwargs = dict(pattern=pattern, block=block, causal=causal, summary=summary)
  return (q, k, v), valid_BxT, kwargs, allowed_BxTxT[:, None]


@pytest.mark.parametrize('query_blocks', [8, 4, 2])
@pytest.mark.parametrize('name', sorted(CASES))
def test_sparse_attention_and_its_gradients_are_exact_attention_over_the_pattern(
    name, query_blocks):
  # 5 or 6 blocks: all in one group (8), a group of 4 and a padded one (4), or three groups
  # whose halos carry neighbours across group boundaries (2).
  (q, k, v), valid_BxT, kwargs, allowed_Bx1xTxT = _case(name)
  cotangent = draw(q.shape, 4)
  expected, _ = reference_attention(q, k, v, allowed=allowed_Bx1xTxT)
  expected_grads = reference_gradients(q, k, v, cotangent, allowed_Bx1xTxT)

  @jax.jit
  def outputs_and_gradients(q, k, v, valid):
    out, attend_vjp = jax.vjp(lambda q, k, v: sparse.sparse_attention(
        q, k, v, key_valid_BxS=valid, query_blocks=query_blocks, **kwargs), q, k, v)
    return out, attend_vjp(cotangent)

  out, grads = outputs_and_gradients(q, k, v, valid_BxT)
  assert out.shape == q.shape and out.dtype == jnp.float32
  # The pattern leaves keys out, so attending to all of them would fail the comparison.
  assert not allowed_Bx1xTxT.all()
  # float32 against float64: the largest difference measured is 6.7e-7.
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  # Keys and values reached only through a halo, or (strided, fixed) only through the keys
  # every block shares, would have wrong or zero gradients here.
  for argument, grad, expected_grad in zip('qkv', grads, expected_grads):
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=5e-6, err_msg=argument)


def test_rows_without_keys_are_zeros_with_finite_gradients():
  # Length 9 with causal local blocks of 4: queries from 16 on see blocks past the keys.
  (q, k, v), valid_BxT, kwargs, allowed_Bx1xTxT = _case('local_causal_padding')
  empty_BxT = ~allowed_Bx1xTxT[:, 0].any(-1)
  assert empty_BxT[1].any() and empty_BxT[2].all()
  attend = lambda q, k, v: sparse.sparse_attention(q, k, v, key_valid_BxS=valid_BxT, **kwargs)
  out, grads = jax.jit(lambda q, k, v: (
      attend(q, k, v), jax.grad(lambda *qkv: (attend(*qkv) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
  ))(q, k, v)
  np.testing.assert_array_equal(np.asarray(out)[empty_BxT], 0.0)
  for argument, grad in zip('qkv', grads):
    assert np.isfinite(grad).all(), argument


def test_huge_logits_of_masked_keys_leave_outputs_and_gradients_exact():
  # Padded keys of 1e30 give logits far above the allowed ones: exp of them, masked only
  # afterwards, is inf and its gradient inf·0 = NaN.
  (q, k, v), valid_BxT, kwargs, allowed_Bx1xTxT = _case('strided_padding')
  k = k.copy()
  k[~valid_BxT] = 1e30
  expected, _ = reference_attention(q, np.where(valid_BxT[..., None, None], k, 0), v,
                                    allowed=allowed_Bx1xTxT)
  attend = lambda q, k, v: sparse.sparse_attention(q, k, v, key_valid_BxS=valid_BxT, **kwargs)
  out, grads = jax.jit(lambda q, k, v: (
      attend(q, k, v), jax.grad(lambda *qkv: (attend(*qkv) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
  ))(q, k, v)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  for argument, grad in zip('qkv', grads):
    assert np.isfinite(grad).all(), argument
  np.testing.assert_array_equal(np.asarray(grads[1])[~valid_BxT], 0.0)


@pytest.mark.parametrize('pattern, block, summary', [('fixed', 4, 4), ('local', 1, 1)])
def test_edge_arguments_summary_equal_to_block_and_block_of_one(pattern, block, summary):
  # summary = block makes every position a summary ('fixed' sees all keys); blocks of one
  # position are allowed too. Values 6 wide, queries and keys 4: the scale is 1/√4.
  q, k, v = draw((2, 7, N, H), 1), draw((2, 7, N, H), 2), draw((2, 7, N, 6), 3)
  allowed = pattern_allowed(pattern, 7, block, False, summary)
  out = jax.jit(lambda q, k, v: sparse.sparse_attention(q, k, v, pattern=pattern, block=block,
                                                         summary=summary))(q, k, v)
  assert out.shape == (2, 7, N, 6)
  expected, _ = reference_attention(q, k, v, allowed=allowed)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_the_reference():
  (q, k, v), valid_BxT, kwargs, allowed_Bx1xTxT = _case('strided_causal')
  q16, k16, v16 = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
  # The reference sees the same rounded inputs, so only the computation's rounding remains.
  expected, _ = reference_attention(*(np.asarray(a, np.float32) for a in (q16, k16, v16)),
                                    allowed=allowed_Bx1xTxT)
  out = jax.jit(lambda q, k, v: sparse.sparse_attention(q, k, v, **kwargs))(q16, k16, v16)
  assert out.dtype == jnp.bfloat16
  # bfloat16 rounds outputs up to 3.8 by up to 2⁻⁸·4 ≈ 1.6e-2 alone; measured 1.5e-2.
  np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=3e-2, rtol=0)


@pytest.mark.parametrize('pattern, steps, block, summary, query, keys', [
    ('local', 4, 2, 1, 3, (0, 3)),     # both keys in the query's neighbour blocks
    ('strided', 8, 2, 1, 7, (7, 1)),   # key 1: the stride's keys, (7 − 1) mod 2 = 0
    ('fixed', 8, 4, 1, 7, (7, 3))])    # key 3: the summary position of block 0
def test_bfloat16_scores_of_every_part_are_float32(pattern, steps, block, summary, query, keys):
  # Query `query` scores 100 and 100.25 on the two keys, −100 on every other: weights
  # σ(∓0.25) = (0.4378, 0.5622) on values 0 and 1. The second key lies in the part named:
  # its score rounded to bfloat16 (steps of 1 near 200 before the scale 1/√4) moves the weight
  # to 0.5 or 0.68.
  allowed = pattern_allowed(pattern, steps, block, True, summary)
  assert allowed[query, list(keys)].all()
  q = np.zeros((1, steps, 1, 4), np.float32)
  q[0, query, 0] = [16, 16, 0, 0]
  k = np.tile(np.float32([-12.5, 0, 0, 0]), (1, steps, 1, 1))
  k[0, keys[0], 0], k[0, keys[1], 0] = [12.5, 0, 0, 0], [12.5, 0.03125, 0, 0]
  v = np.full((1, steps, 1, 4), 0.5, np.float32)
  v[0, keys[0], 0], v[0, keys[1], 0] = 0, 1
  out = jax.jit(lambda q, k, v: sparse.sparse_attention(
      q, k, v, pattern=pattern, block=block, causal=True, summary=summary))(
          *(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32)[0, query, 0], 1 / (1 + np.exp(-0.25)),
                             atol=4e-3)


def test_bad_arguments_raise_before_compiling():
  x = jnp.zeros((1, 8, 1, 4))
  cases = [(dict(pattern='dilated', block=4), "pattern='dilated'; allowed: local, strided, fixed"),
           (dict(pattern='local', block=0), 'block=0; allowed: a positive integer'),
           (dict(pattern='fixed', block=4, summary=5), 'summary=5 .* from 1 to block=4'),
           (dict(pattern='fixed', block=4, summary=0), 'summary=0'),
           (dict(pattern='local', block=4, query_blocks=0), 'query_blocks=0; allowed: a positive')]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      sparse.sparse_attention(x, x, x, **kwargs)
  with pytest.raises(ValueError, match='8 queries need 8 keys'):
    sparse.sparse_attention(x, x[:, :6], x[:, :6], pattern='local', block=4)


def _compiled_flops(attend, steps):
  x = jax.ShapeDtypeStruct((1, steps, 1, 16), jnp.float32)
  cost = jax.jit(attend).lower(x, x, x).compile().cost_analysis()
  return (cost[0] if isinstance(cost, (list, tuple)) else cost)['flops']


def test_local_attention_flops_grow_linearly_with_length():
  # All query blocks in one group: XLA's cost analysis counts a loop's body once, whatever
  # its trip count, so the default grouping would show a constant cost.
  local = lambda q, k, v: sparse.sparse_attention(q, k, v, pattern='local', block=32, causal=True,
                                                  query_blocks=2048 // 32)
  exact = lambda q, k, v: core.dot_product_attention(q, k, v, causal=True)
  local_ratio = _compiled_flops(local, 2048) / _compiled_flops(local, 1024)
  exact_ratio = _compiled_flops(exact, 2048) / _compiled_flops(exact, 1024)
  # Measured: local 2.00, exact 4.00.
  assert local_ratio < 2.3
  assert exact_ratio > 3.5
