"""Linear attention (Katharopoulos et al. 2020) against the quadratic form written out here in
float64 numpy: out_i = Σ_j (φq_i·φk_j) v_j / Σ_j φq_i·φk_j over the allowed keys j (j ≤ i when
causal), φ(x) = elu(x) + 1; padding, fully padded rows, gradients, bfloat16 and memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import linear
from tests.models.test_attention import causal_allowed, draw, padding_allowed

B, N, H = 3, 2, 4


def elu_plus_one(x):
  x = np.asarray(x, np.float64)
  return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def quadratic_form(phi_q_BxTxNxM, phi_k_BxSxNxM, v_BxSxNxH, allowed):
  """float64: out[b, t, n] = Σ_s a[b, n, t, s] (φq_t·φk_s) v_s / Σ_s a[b, n, t, s] φq_t·φk_s,
  zeros where no key is allowed; `allowed` broadcasts to [B, N, T, S]."""
  phi_q, phi_k, v = (np.asarray(a, np.float64) for a in (phi_q_BxTxNxM, phi_k_BxSxNxM, v_BxSxNxH))
  scores = np.einsum('btnm,bsnm->bnts', phi_q, phi_k) * np.broadcast_to(
      allowed, (phi_q.shape[0], phi_q.shape[2], phi_q.shape[1], phi_k.shape[1]))
  num = np.einsum('bnts,bsnh->btnh', scores, v)
  den = scores.sum(-1).transpose(0, 2, 1)[..., None]
  return np.where(den > 0, num / np.where(den > 0, den, 1), 0)


def _qkv(steps, keys, seed=0):
  return (draw((B, steps, N, H), seed), draw((B, keys, N, H), seed + 1),
          draw((B, keys, N, H), seed + 2))


# Lengths 12, 7 and 0: a full row, a padded one and one with no valid key at all.
LENGTHS = [12, 7, 0]


def test_causal_equals_the_masked_quadratic_form():
  q, k, v = _qkv(12, 12)
  valid_BxS = padding_allowed(LENGTHS, 12)[:, 0, 0]
  allowed = causal_allowed(12, 12)[None, None] & padding_allowed(LENGTHS, 12)
  expected = quadratic_form(elu_plus_one(q), elu_plus_one(k), v, allowed)
  # 4 divides T = 12, 5 does not, 1 is a pure recurrence and 64 > T a single block.
  blocks = (1, 4, 5, 64)
  outs = jax.jit(lambda q, k, v, valid: [linear.linear_attention(
      q, k, v, causal=True, key_valid_BxS=valid, block=block) for block in blocks])(
          q, k, v, valid_BxS)
  for block, out in zip(blocks, outs):
    assert out.shape == q.shape and out.dtype == jnp.float32
    # float32 sums of 12 positive terms: the largest difference measured is 1.2e-7.
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6, err_msg=f'block={block}')
    np.testing.assert_array_equal(out[2], 0.0)


def test_non_causal_equals_the_quadratic_form_over_valid_keys():
  q, k, v = _qkv(5, 7, seed=3)
  lengths = [7, 3, 0]
  valid_BxS = padding_allowed(lengths, 7)[:, 0, 0]
  expected = quadratic_form(elu_plus_one(q), elu_plus_one(k), v, padding_allowed(lengths, 7))
  out, unpadded = jax.jit(lambda q, k, v, valid: (
      linear.linear_attention(q, k, v, key_valid_BxS=valid),
      linear.linear_attention(q, k, v)))(q, k, v, valid_BxS)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  np.testing.assert_array_equal(out[2], 0.0)
  # Without a padding mask every key counts.
  np.testing.assert_allclose(unpadded, quadratic_form(elu_plus_one(q), elu_plus_one(k), v, True),
                             rtol=1e-5, atol=2e-6)


def test_features_of_another_width_go_through_the_core():
  # M = 6 features for H = 4 values; the features' own values, not elu + 1 of them.
  rng = np.random.default_rng(5)
  phi_q, phi_k = (rng.uniform(0.1, 2.0, size=(B, 9, N, 6)).astype(np.float32) for _ in range(2))
  v = draw((B, 9, N, H), 6)
  outs = jax.jit(lambda *args: [linear.linear_attention_from_features(*args, causal=causal, block=4)
                                 for causal in (False, True)])(phi_q, phi_k, v)
  for out, allowed in zip(outs, (True, causal_allowed(9, 9)[None, None])):
    np.testing.assert_allclose(out, quadratic_form(phi_q, phi_k, v, allowed), rtol=1e-5, atol=2e-6)
  # bfloat16 features with float32 values: the output has the features' dtype (outputs up to
  # 0.66, whose bfloat16 rounding alone is up to 2⁻⁹ ≈ 2e-3; measured 1.9e-3).
  phi_q16, phi_k16 = (jnp.asarray(a, jnp.bfloat16) for a in (phi_q, phi_k))
  out16 = jax.jit(linear.linear_attention_from_features)(phi_q16, phi_k16, v)
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out16, np.float64), quadratic_form(
      *(np.asarray(a, np.float64) for a in (phi_q16, phi_k16)), v, True), rtol=0, atol=5e-3)


def check_padding_garbage_stays_out(attend, q, k, v, valid_BxS):
  """Puts garbage (1e30, nan) in the padded keys and values, and checks that attend(q, k, v) and
  the gradients of Σ out² are finite and that padding gets no gradient. Returns both."""
  k, v = k.copy(), v.copy()
  k[~valid_BxS], v[~valid_BxS] = 1e30, np.nan
  out, grads = jax.jit(lambda q, k, v: (attend(q, k, v), jax.grad(
      lambda *qkv: jnp.sum(attend(*qkv) ** 2), argnums=(0, 1, 2))(q, k, v)))(q, k, v)
  assert np.isfinite(out).all()
  for name, grad in zip('qkv', grads):
    assert np.isfinite(grad).all(), name
  for name, grad in zip('kv', grads[1:]):
    np.testing.assert_array_equal(np.asarray(grad)[~valid_BxS], 0.0, err_msg=name)
  return np.asarray(out), [np.asarray(grad) for grad in grads]


@pytest.mark.parametrize('causal', [False, True])
def test_gradients_are_finite_and_padding_gets_none(causal):
  q, k, v = _qkv(12, 12, seed=7)
  valid_BxS = padding_allowed(LENGTHS, 12)[:, 0, 0]
  attend = lambda q, k, v: linear.linear_attention(q, k, v, causal=causal,
                                                   key_valid_BxS=valid_BxS, block=5)
  _, grads = check_padding_garbage_stays_out(attend, q, k, v, valid_BxS)
  # Every real key does receive a gradient.
  assert (np.abs(grads[2][valid_BxS]).sum(-1) > 0).all()


def test_tiny_denominators_leave_the_gradients_exact():
  # Features of 1e-13 (as the Performer's shifted ones can be): φq·φk = 4e-26, whose square
  # underflows float32; the gradient of num / den, which has 1/den² in it, was NaN. With one key
  # the output is its value whatever the features are, so the gradients of Σ out² are 0 for φq
  # and φk and 2v for v.
  phi = np.full((1, 1, 1, H), 1e-13, np.float32)
  v = draw((1, 1, 1, H), 1)
  # Causal and non-causal sums end in the same division; the Performer's tests take the other.
  grad_q, grad_k, grad_v = jax.jit(jax.grad(lambda *args: jnp.sum(
      linear.linear_attention_from_features(*args, causal=True) ** 2), argnums=(0, 1, 2)))(
          phi, phi, v)
  # The features' gradients are rounding of the order of 1e-7 / den · φ ≈ 1e6.
  np.testing.assert_allclose(grad_q * 1e-13, 0, atol=1e-6)
  np.testing.assert_allclose(grad_k * 1e-13, 0, atol=1e-6)
  np.testing.assert_allclose(grad_v, 2 * v, rtol=1e-6)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float64():
  q, k, v = _qkv(12, 12, seed=9)
  as_bf16 = lambda a: jnp.asarray(a, jnp.bfloat16)
  out = jax.jit(lambda q, k, v: linear.linear_attention(q, k, v, causal=True, block=5))(
      as_bf16(q), as_bf16(k), as_bf16(v))
  rounded = [np.asarray(as_bf16(a), np.float64) for a in (q, k, v)]
  expected = quadratic_form(elu_plus_one(rounded[0]), elu_plus_one(rounded[1]), rounded[2],
                            causal_allowed(12, 12)[None, None])
  assert out.dtype == jnp.bfloat16
  # Sums in float32; only the features (8 bits) and the output are rounded: measured 3.6e-3.
  np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=1e-2, rtol=0)


def test_causal_memory_is_linear_in_length():
  # The compiled program's scratch memory grows at most linearly in T (measured 0.34 → 0.93 MB
  # for T = 128 → 512), far below the [B, T, N, H, H] prefix sums of outer products (32 KiB
  # per position here; measured 1.8 KiB per position at T = 512).
  width, block = 64, 16
  temp = {}
  for steps in (128, 512):
    x = jax.ShapeDtypeStruct((1, steps, 2, width), jnp.float32)
    compiled = jax.jit(lambda q, k, v: linear.linear_attention(q, k, v, causal=True, block=block)
                       ).lower(x, x, x).compile()
    temp[steps] = compiled.memory_analysis().temp_size_in_bytes
  outer_products_per_position = 2 * width * width * 4
  assert temp[512] / temp[128] < 4.5, temp
  assert temp[512] / 512 < outer_products_per_position / 4, temp


def test_bad_arguments_raise_before_compiling():
  q = jnp.zeros((1, 4, 2, 3))
  cases = [(dict(k=jnp.zeros((1, 5, 2, 3)), v=jnp.zeros((1, 5, 2, 3)), causal=True),
            'T=4 and S=5'),
           (dict(block=0), 'block=0'),
           (dict(key_valid_BxS=jnp.ones((1, 5), bool)), r'key_valid_BxS of shape \(1, 5\)'),
           (dict(v=jnp.zeros((1, 5, 2, 3))), r'Values of shape \(1, 5, 2, 3\)')]
  for kwargs, message in cases:
    k, v = kwargs.pop('k', q), kwargs.pop('v', q)
    with pytest.raises(ValueError, match=message):
      linear.linear_attention(q, k, v, **kwargs)
  with pytest.raises(ValueError, match=r'Keys of shape \(1, 4, 2, 5\)'):
    linear.linear_attention_from_features(q, jnp.zeros((1, 4, 2, 5)), q)


def rotate_numpy(x_BxTxNxH, positions_T, base=10_000.0):
  """float64 rotary rotation written out: pair (x_2j, x_2j+1) at position p turned by p·θ_j,
  θ_j = base^(−2j/H) (Su et al. 2021, eq. 34)."""
  x = np.asarray(x_BxTxNxH, np.float64)
  theta = base ** (-np.arange(0, x.shape[-1], 2) / x.shape[-1])
  angle = np.asarray(positions_T, np.float64)[None, :, None, None] * theta
  out = np.empty_like(x)
  out[..., 0::2] = x[..., 0::2] * np.cos(angle) - x[..., 1::2] * np.sin(angle)
  out[..., 1::2] = x[..., 0::2] * np.sin(angle) + x[..., 1::2] * np.cos(angle)
  return out


def rotary_quadratic_form(q, k, v, allowed, q_positions, k_positions, base):
  """float64 RoFormer eq. 19: Σ_j (R_i φq_i·R_j φk_j) v_j / Σ_j φq_i·φk_j over allowed j."""
  phi_q, phi_k = elu_plus_one(q), elu_plus_one(k)
  shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
  allowed = np.broadcast_to(allowed, shape)
  num_scores = np.einsum('btnm,bsnm->bnts', rotate_numpy(phi_q, q_positions, base),
                         rotate_numpy(phi_k, k_positions, base)) * allowed
  den = (np.einsum('btnm,bsnm->bnts', phi_q, phi_k) * allowed).sum(-1).transpose(0, 2, 1)
  num = np.einsum('bnts,bsnh->btnh', num_scores, np.asarray(v, np.float64))
  den = den[..., None]
  return np.where(den > 0, num / np.where(den > 0, den, 1), 0)


@pytest.mark.parametrize('causal', [False, True])
def test_rotary_positions_rotate_the_numerators_features_as_roformer_eq_19(causal):
  # Rotating q and k before φ = elu + 1 made the scores depend on the positions themselves,
  # not on their offset alone; eq. 19 rotates φ(q) and φ(k) in the numerator only.
  q, k, v = _qkv(12, 12, seed=5)
  positions, base = np.arange(12) + 3, 100.0
  valid_BxS = padding_allowed(LENGTHS, 12)[:, 0, 0]
  allowed = padding_allowed(LENGTHS, 12) & (causal_allowed(12, 12)[None, None] if causal else True)
  expected = rotary_quadratic_form(q, k, v, allowed, positions, positions, base)
  for block in (4, 5):
    out = jax.jit(lambda q, k, v, valid: linear.linear_attention(
        q, k, v, causal=causal, key_valid_BxS=valid, block=block,
        rotary=(positions, positions, base)))(q, k, v, valid_BxS)
    # Measured: 3.1e-7 at most.
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6, err_msg=f'block={block}')
    np.testing.assert_array_equal(out[2], 0.0)
  # Without rotation the result is the plain quadratic form, so the rotation changed it.
  assert np.abs(expected - quadratic_form(elu_plus_one(q), elu_plus_one(k), v, allowed)).max() > 0.05


def test_rotary_scores_depend_on_the_offset_alone():
  # The same query and key at every position: eq. 19's numerator scores are equal along each
  # diagonal (one offset), and the layer's output does not depend on where the text starts.
  q = np.broadcast_to(draw((1, 1, 1, H), 7), (1, 9, 1, H))
  k = np.broadcast_to(draw((1, 1, 1, H), 8), (1, 9, 1, H))
  phi_q, phi_k = elu_plus_one(q), elu_plus_one(k)
  scores = np.einsum('btnm,bsnm->bts', rotate_numpy(phi_q, np.arange(9), 10.0),
                     rotate_numpy(phi_k, np.arange(9), 10.0))[0]
  for offset in (-2, 0, 3):
    diagonal = np.diagonal(scores, offset)
    np.testing.assert_allclose(diagonal, diagonal[0], rtol=1e-12)
  v = draw((1, 9, 1, H), 9)
  run = lambda start: linear.linear_attention(
      jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), v, causal=True, block=4,
      rotary=(np.arange(9) + start, np.arange(9) + start, 10.0))
  np.testing.assert_allclose(run(0), run(5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('steps, keys', [(6, 6), (5, 7)])
def test_rotary_queries_and_keys_turn_by_their_own_positions(steps, keys):
  # Queries at 20, 21, … and keys at 0, 1, …: R_i turns φ(q_i) by the query's position and R_j
  # turns φ(k_j) by the key's. Turning the keys by the queries' positions (or the other way
  # round) goes unseen when both lists are equal, as in self-attention.
  q, k, v = _qkv(steps, keys, seed=11)
  q_positions, k_positions, base = np.arange(steps) + 20, np.arange(keys), 100.0
  expected = rotary_quadratic_form(q, k, v, True, q_positions, k_positions, base)
  out = jax.jit(lambda q, k, v: linear.linear_attention(
      q, k, v, rotary=(q_positions, k_positions, base)))(q, k, v)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  # The positions matter: with both at 0, 1, … the result differs.
  same = rotary_quadratic_form(q, k, v, True, np.arange(steps), k_positions, base)
  assert np.abs(expected - same).max() > 0.05


@pytest.mark.parametrize('causal', [False, True])
def test_rotated_numerator_features_keep_padding_garbage_out(causal):
  # The rotated key features ψk enter the numerator through their own sum Σ ψk vᵀ: padded
  # keys must be zeroed there too, or a NaN key reaches every row (NaN·0 is NaN).
  q, k, v = _qkv(12, 12, seed=9)
  positions, base = np.arange(12), 100.0
  valid_BxS = padding_allowed(LENGTHS, 12)[:, 0, 0]
  k[~valid_BxS], v[~valid_BxS] = np.nan, np.nan
  out = jax.jit(lambda q, k, v: linear.linear_attention(
      q, k, v, causal=causal, key_valid_BxS=valid_BxS, block=5,
      rotary=(positions, positions, base)))(q, k, v)
  allowed = padding_allowed(LENGTHS, 12) & (causal_allowed(12, 12)[None, None] if causal else True)
  valid = valid_BxS[..., None, None]
  clean_k, clean_v = np.where(valid, k, 0), np.where(valid, v, 0)
  np.testing.assert_allclose(out, rotary_quadratic_form(q, clean_k, clean_v, allowed, positions,
                                                        positions, base), rtol=1e-5, atol=2e-6)
