"""Chunked exact attention (Rabe & Staats 2021; Dao et al. 2022) against the float64 reference
of test_attention.py with a brute-force mask, its gradients against the float64 softmax
backward formula (itself checked against autodiff of `core.dot_product_attention`), a bfloat16
golden value, argument errors, and the compiled memory of forward + backward against exact
attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import chunked
from models.attention import core
from models.attention.chunked import chunked_attention
from tests.models.test_attention import causal_allowed, draw, reference_attention

B, N, H = 2, 2, 4


def _valid(keys, invalid_prefix, lengths):
  """[B, S]: row b keeps keys invalid_prefix[b] ≤ s < lengths[b] (left and right padding)."""
  return np.array([[start <= s < end for s in range(keys)]
                   for start, end in zip(invalid_prefix, lengths)])


# name: (T, S, causal, key_valid or None, query_block, key_block). Blocks that do not divide the
# lengths, and query and key blocks of different sizes, put block edges inside masked regions.
CASES = {
    'one_block': (8, 8, False, None, 512, 512),
    'uneven_blocks_left_and_right_padding': (13, 11, False, _valid(11, [0, 5], [9, 11]), 4, 3),
    'causal_unequal_blocks': (16, 16, True, None, 6, 4),
    'causal_padding_empty_rows': (16, 16, True, _valid(16, [0, 7], [0, 16]), 4, 8),
    'causal_more_queries_than_keys': (10, 6, True, _valid(6, [0, 1], [6, 5]), 3, 4),
    'blocks_of_one': (5, 5, True, _valid(5, [0, 2], [4, 5]), 1, 1),
}


def _inputs(name):
  steps, keys, causal, valid, query_block, key_block = CASES[name]
  q, k, v = draw((B, steps, N, H), 1), draw((B, keys, N, H), 2), draw((B, keys, N, H), 3)
  cotangent = draw((B, steps, N, H), 4)
  allowed_BxNxTxS = np.ones((B, N, steps, keys), bool)
  if valid is not None:
    allowed_BxNxTxS &= valid[:, None, None, :]
  if causal:
    allowed_BxNxTxS &= causal_allowed(steps, keys)
  options = dict(causal=causal, query_block=query_block, key_block=key_block)
  return (q, k, v, cotangent, valid), options, allowed_BxNxTxS


def reference_gradients(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, dout_BxTxNxH, allowed_BxNxTxS):
  """float64 gradients of Σ out ∘ dout through the softmax: with W the reference weights,
  dV = Wᵀ dO, dW = dO Vᵀ, dZ = W ∘ (dW − rowsum(W ∘ dW)), dQ = dZ K/√H, dK = dZᵀ Q/√H."""
  q, k, v, dout = (np.asarray(a, np.float64) for a in (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH,
                                                        dout_BxTxNxH))
  _, w_BxNxTxS = reference_attention(q, k, v, allowed=allowed_BxNxTxS)
  dw_BxNxTxS = np.einsum('btnh,bsnh->bnts', dout, v)
  dz_BxNxTxS = w_BxNxTxS * (dw_BxNxTxS - (w_BxNxTxS * dw_BxNxTxS).sum(-1, keepdims=True))
  scale = 1 / np.sqrt(q.shape[-1])
  return (np.einsum('bnts,bsnh->btnh', dz_BxNxTxS, k) * scale,
          np.einsum('bnts,btnh->bsnh', dz_BxNxTxS, q) * scale,
          np.einsum('bnts,btnh->bsnh', w_BxNxTxS, dout))


def test_reference_gradients_match_autodiff_of_exact_attention():
  (q, k, v, cotangent, valid), options, allowed_BxNxTxS = _inputs('causal_padding_empty_rows')
  exact = lambda q, k, v: core.dot_product_attention(q, k, v, mask=core.key_mask(valid),
                                                     causal=options['causal'])
  grads = jax.jit(lambda q, k, v: jax.vjp(exact, q, k, v)[1](cotangent))(q, k, v)
  for argument, grad, expected in zip(
      'qkv', grads, reference_gradients(q, k, v, cotangent, allowed_BxNxTxS)):
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=2e-6, err_msg=argument)


@pytest.mark.parametrize('name', sorted(CASES))
def test_outputs_and_gradients_equal_the_reference(name):
  (q, k, v, cotangent, valid), options, allowed_BxNxTxS = _inputs(name)

  @jax.jit
  def outputs_and_gradients(q, k, v, cotangent, valid):
    out, attend_vjp = jax.vjp(
        lambda q, k, v: chunked_attention(q, k, v, key_valid_BxS=valid, **options), q, k, v)
    return out, attend_vjp(cotangent)

  out, grads = jax.tree_util.tree_map(np.asarray,
                                      outputs_and_gradients(q, k, v, cotangent, valid))
  expected, _ = reference_attention(q, k, v, allowed=allowed_BxNxTxS)
  assert out.shape == q.shape and out.dtype == np.float32
  # Largest differences measured: 2.4e-7 (outputs), 6.0e-7 (gradients up to 4.1).
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  for argument, grad, expected_grad in zip(
      'qkv', grads, reference_gradients(q, k, v, cotangent, allowed_BxNxTxS)):
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=2e-6, err_msg=argument)
  # Queries with no allowed key: exact zeros, and nothing NaN anywhere.
  empty_BxTxN = ~allowed_BxNxTxS.any(-1).transpose(0, 2, 1)
  np.testing.assert_array_equal(out[empty_BxTxN], 0.0)
  np.testing.assert_array_equal(grads[0][empty_BxTxN], 0.0)
  assert all(np.isfinite(g).all() for g in grads)


def test_the_cases_have_empty_rows_and_rows_empty_in_their_first_key_block():
  # Keeps the zero-row checks above from passing vacuously, and keeps a row whose running
  # maximum is still −∞ when its first allowed key arrives (e^{−∞ − (−∞)} = NaN if mishandled).
  for name in ('causal_padding_empty_rows', 'blocks_of_one'):
    assert (~_inputs(name)[2].any(-1)).any(), name
  allowed_BxNxTxS = _inputs('uneven_blocks_left_and_right_padding')[2]
  assert not allowed_BxNxTxS[1, :, :, :3].any() and allowed_BxNxTxS[1].any(-1).all()


def test_bfloat16_scores_are_float32():
  # Scores 100 and 100.25, one per key block: weights σ(∓0.25) = (0.4378, 0.5622). Scores
  # rounded to bfloat16 (steps of 0.5 near 100) would give (0.5, 0.5).
  q = jnp.array([16, 16, 0, 0], jnp.bfloat16).reshape(1, 1, 1, 4)
  k = jnp.array([[12.5, 0, 0, 0], [12.5, 0.03125, 0, 0]], jnp.bfloat16).reshape(1, 2, 1, 4)
  v = jnp.array([[0.0] * 4, [1.0] * 4], jnp.bfloat16).reshape(1, 2, 1, 4)
  out = jax.jit(lambda q, k, v: chunked_attention(q, k, v, key_block=1))(q, k, v)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), 1 / (1 + np.exp(-0.25)), atol=4e-3)


def test_scores_far_below_zero_keep_their_softmax():
  # Scores −200 and −199 (e^−200 underflows float32): weights σ(∓1) = (0.2689, 0.7311), the
  # softmax being invariant to a shift. A running maximum started at 0 instead of −∞ shifts
  # by 0, so every e^s and the denominator underflow to 0 and the row came out as zeros.
  q = jnp.array([20.0, 0, 0, 0]).reshape(1, 1, 1, 4)
  k = jnp.array([[-20.0, 0, 0, 0], [-19.9, 0, 0, 0]]).reshape(1, 2, 1, 4)
  v = jnp.array([[0.0] * 4, [1.0] * 4]).reshape(1, 2, 1, 4)
  out = jax.jit(lambda q, k, v: chunked_attention(q, k, v, key_block=1))(q, k, v)
  np.testing.assert_allclose(out, np.full((1, 1, 1, 4), 1 / (1 + np.exp(-1))), rtol=1e-5)


def test_bfloat16_inputs_give_bfloat16_outputs_and_gradients_near_the_reference():
  (q, k, v, cotangent, valid), options, allowed_BxNxTxS = _inputs('causal_padding_empty_rows')
  q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))

  @jax.jit
  def outputs_and_gradients(q, k, v):
    out, attend_vjp = jax.vjp(
        lambda q, k, v: chunked_attention(q, k, v, key_valid_BxS=valid, **options), q, k, v)
    return out, attend_vjp(jnp.asarray(cotangent, out.dtype))

  out, grads = outputs_and_gradients(q, k, v)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  q, k, v, cotangent = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
                        for a in (q, k, v, cotangent))
  expected, _ = reference_attention(q, k, v, allowed=allowed_BxNxTxS)
  # bfloat16 keeps 8 significant bits: 2⁻⁸ ≈ 4e-3 relative. Largest differences measured:
  # 3.3e-3 (outputs up to 1.6); 0.3%, 0.5% and 0.3% of the largest q, k and v gradient.
  np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=0, atol=1e-2)
  for argument, grad, expected_grad in zip(
      'qkv', grads, reference_gradients(q, k, v, cotangent, allowed_BxNxTxS)):
    np.testing.assert_allclose(np.asarray(grad, np.float32), expected_grad, rtol=0,
                               atol=2e-2 * np.abs(expected_grad).max(), err_msg=argument)


@pytest.mark.parametrize('arguments, message', [
    (dict(query_block=0), 'query_block=0'),
    (dict(key_block=2.5), 'key_block=2.5'),
    (dict(key_valid_BxS=np.ones((2, 6), bool)), r'key_valid_BxS has shape \(2, 6\)'),
    (dict(key_valid_BxS=np.ones((2, 5), np.int32)), 'dtype int32'),
    (dict(k_BxSxNxH=np.zeros((2, 5, 2, 3))), 'must agree'),
    (dict(q_BxTxNxH=np.zeros((2, 4, 8))), r'q has shape \(2, 4, 8\)'),
])
def test_bad_arguments_raise_a_value_error_naming_them(arguments, message):
  inputs = dict(q_BxTxNxH=np.zeros((2, 4, 2, 4)), k_BxSxNxH=np.zeros((2, 5, 2, 4)),
                v_BxSxNxH=np.zeros((2, 5, 2, 4)))
  inputs.update(arguments)
  with pytest.raises(ValueError, match=message):
    chunked_attention(**inputs)


def test_lengths_are_cut_into_the_fewest_blocks_of_at_most_block_positions():
  # ceil(L / block) blocks of equal size ceil(L / number of blocks): no block larger than
  # `block` (which sets the memory of the [C, K] scores), and under one padded position per
  # block. Blocks of `block` positions would pad 600 to 1024, and floor(L / block) blocks of
  # 13 / 4 would be 5 positions long; both give the same values, so no comparison above sees them.
  assert chunked._block_size(600, 512) == (300, 600)  # the docstring's example
  for length in range(1, 41):
    for block in range(1, 13):
      size, padded = chunked._block_size(length, block)
      num_blocks = -(-length // block)
      assert size <= block and padded == num_blocks * size, (length, block, size, padded)
      assert 0 <= padded - length < num_blocks, (length, block, size, padded)


def test_default_blocks_are_at_most_512_positions(monkeypatch):
  # The default block sets memory and speed, not values, so no comparison above sees another.
  # 600 queries at most 512 per block: two blocks of 300; 1100 keys: three blocks of 367.
  sizes = []
  monkeypatch.setattr(chunked, '_attention', lambda q, k, v, valid, causal, query_size, key_size:
                      sizes.append((query_size, key_size)) or q)
  keys_BxSxNxH = jnp.zeros((1, 1100, 1, 2))
  chunked_attention(jnp.zeros((1, 600, 1, 2)), keys_BxSxNxH, keys_BxSxNxH)
  assert sizes == [(300, 367)]


def _forward_backward_temp_bytes(attend, length):
  """XLA's temporary memory for the value and q, k, v gradients of sum(attend(q, k, v) ∘ c) at
  batch 1, one head, width 64; compiled, not run."""
  spec = jax.ShapeDtypeStruct((1, length, 1, 64), jnp.float32)

  def loss_and_grads(q, k, v, cotangent):
    return jax.value_and_grad(lambda q, k, v: (attend(q, k, v) * cotangent).sum(),
                              argnums=(0, 1, 2))(q, k, v)

  compiled = jax.jit(loss_and_grads).lower(spec, spec, spec, spec).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_forward_and_backward_memory_is_linear_in_length():
  chunked_2048 = _forward_backward_temp_bytes(chunked_attention, 2048)
  chunked_4096 = _forward_backward_temp_bytes(chunked_attention, 4096)
  exact_2048 = _forward_backward_temp_bytes(core.dot_product_attention, 2048)
  # Measured on CPU: chunked 7.6 MB and 9.3 MB, exact 101 MB at 2048 (exact stores [T, S]
  # scores and probabilities for the backward pass: quadratic, ×2.7 from 2048 to 4096).
  # Autodiff through the block loop, which keeps every block's probabilities, measured
  # 55 MB and 180 MB and fails both.
  assert exact_2048 >= 4 * chunked_2048, (exact_2048, chunked_2048)
  assert chunked_4096 < 2.5 * chunked_2048, (chunked_4096, chunked_2048)
