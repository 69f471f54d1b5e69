"""Performer FAVOR+ attention (Choromanski et al. 2021): the positive random features estimate
exp(qᵀk/√H) without bias, the attention output approaches exact softmax attention (the float64
reference of test_attention.py) like 1/√M, the causal and padded forms equal the quadratic form
with the same features written out here in float64, and the orthogonal features are orthogonal
in blocks of H and marginally N(0, I_H)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import performer
from tests.models.test_attention import causal_allowed, draw, padding_allowed, reference_attention
from tests.models.test_attention_linear import check_padding_garbage_stays_out

H = 4
QUERIES_3xH = np.array([[0.8, -0.4, 0.6, 0.2], [0.1, 0.5, -0.3, 0.4], [-0.6, 0.2, 0.1, -0.5]],
                       np.float32)
KEYS_3xH = np.array([[0.5, 0.3, 0.9, -0.6], [0.4, -0.7, 0.2, 0.3], [-0.2, 0.1, -0.8, 0.4]],
                    np.float32)
DRAWS = 20_000


def rng_key(seed):
  # The rbg generator: threefry's takes ~1 s of CPU to compile into each program, about half
  # of this file's budget.
  return jax.random.key(seed, impl='rbg')


@functools.cache
def features_10xH():
  """One draw of M = 10 orthogonal features: blocks of H = 4, 4 and 2 rows."""
  draw = jax.jit(performer.draw_features, static_argnums=(1, 2))
  return np.asarray(draw(rng_key(3), 10, H))


@jax.jit
def _kernel_estimates(keys):
  """φ(q')ᵀφ(k') for every pair of QUERIES × KEYS (x' = x / H^{1/4}), orthogonal and iid
  features, M = H, one W per key: ([D, 3, 3], [D, 3, 3], the orthogonal W [D, M, H])."""
  def one(key, orthogonal):
    features_MxH = performer.draw_features(key, H, H, orthogonal=orthogonal)
    phi = lambda x_LxH: performer.softmax_kernel_features(
        x_LxH[None, :, None] * H**-0.25, features_MxH)[0, :, 0]
    return phi(QUERIES_3xH) @ phi(KEYS_3xH).T, features_MxH

  orthogonal, features_DxMxH = jax.vmap(lambda key: one(key, True))(keys)
  iid, _ = jax.vmap(lambda key: one(key, False))(keys)
  return orthogonal, iid, features_DxMxH


def test_features_estimate_the_softmax_kernel_without_bias():
  orthogonal, iid, features_DxMxH = (np.asarray(a, np.float64) for a in _kernel_estimates(
      jax.random.split(rng_key(0), DRAWS)))
  exact_3x3 = np.exp(QUERIES_3xH.astype(np.float64) @ KEYS_3xH.T / math.sqrt(H))
  for name, estimates in (('orthogonal', orthogonal), ('iid', iid)):
    standard_error = estimates.std(axis=0) / math.sqrt(DRAWS)
    assert (standard_error < 0.012 * exact_3x3).all(), name  # measured: at most 0.92%
    # Forgetting −‖x‖²/2, the 1/√M, the χ norms or the sign fix of the QR (which biases the
    # directions) moves the mean by tens of standard errors.
    gap = np.abs(estimates.mean(axis=0) - exact_3x3)
    assert (gap < 4 * standard_error).all(), (name, gap / standard_error)
  # Orthogonal rows lower the variance at equal M (Choromanski et al. 2021), most
  # where ‖q' + k'‖ is large; measured 0.86–0.98 of the iid variance, 0.88 summed over pairs.
  assert orthogonal.var(axis=0).sum() < 0.95 * iid.var(axis=0).sum()
  # Each row ω ~ N(0, I_H): mean 0 and second moment I (standard errors ≈ 0.004 and 0.005).
  omega_RxH = features_DxMxH.reshape(-1, H)
  np.testing.assert_allclose(omega_RxH.mean(axis=0), 0, atol=0.02)
  np.testing.assert_allclose(omega_RxH.T @ omega_RxH / len(omega_RxH), np.eye(H), atol=0.03)


def test_softmax_kernel_features_are_the_formula_with_m_other_than_h():
  # φ(x) = exp(W x − ‖x‖²/2) / √M for M = 10 features of width H = 4: 1/√M, not 1/√H (the two
  # agree where the estimate above is checked, M = H).
  features_MxH = features_10xH()
  x = draw((2, 3, 2, H), 5)
  w, x64 = features_MxH.astype(np.float64), x.astype(np.float64)
  expected = np.exp(np.einsum('blnh,mh->blnm', x64, w) - 0.5 * (x64**2).sum(-1, keepdims=True)
                    ) / math.sqrt(10)
  np.testing.assert_allclose(jax.jit(performer.softmax_kernel_features)(x, features_MxH),
                             expected, rtol=1e-5)


def test_orthogonal_features_are_orthogonal_within_blocks_of_h():
  features_MxH = features_10xH().astype(np.float64)
  assert features_MxH.shape == (10, H)
  for start in (0, 4, 8):
    block = features_MxH[start:start + H]
    gram = block @ block.T
    norms = np.sqrt(np.diag(gram))
    np.testing.assert_allclose(gram / np.outer(norms, norms), np.eye(len(block)), atol=1e-5)
  # Independent blocks: rows of different blocks are not orthogonal, and the norms vary.
  assert np.abs(features_MxH[:4] @ features_MxH[4:8].T).max() > 0.1
  assert np.ptp(np.linalg.norm(features_MxH, axis=1)) > 0.1


NUM_FEATURES = (16, 64, 256, 1024)


def test_output_error_falls_like_one_over_sqrt_m():
  # Small scores (q, k ~ N(0, 0.5²)) keep the estimator's relative variance e^{‖q'+k'‖²} − 1
  # moderate, where the error is in its 1/√M regime; larger norms give heavy tails and a
  # shallower slope at these M.
  q, k, v = (draw((1, 16, 2, H), seed, scale) for seed, scale in ((1, 0.5), (2, 0.5), (3, 1.0)))
  exact, _ = reference_attention(q, k, v)

  @jax.jit
  def mean_errors(keys):
    def one(key):
      # Nested prefixes of one draw: W[:M] is itself a draw of M orthogonal features.
      features_MxH = performer.draw_features(key, NUM_FEATURES[-1], H)
      return jnp.stack([jnp.mean(jnp.abs(performer.performer_attention(
          q, k, v, features_MxH[:m]) - exact)) for m in NUM_FEATURES])
    return jnp.mean(jax.vmap(one)(keys), axis=0)

  errors = np.asarray(mean_errors(jax.random.split(rng_key(1), 16)))
  slope = np.polyfit(np.log(NUM_FEATURES), np.log(errors), 1)[0]
  assert -0.75 <= slope <= -0.3, (slope, errors)  # measured: −0.43
  # Better than ignoring the scores: the uniform average over the keys is off by 0.036, the
  # estimate with M = 1024 by 0.0064.
  uniform_error = np.abs(v.mean(axis=1, keepdims=True) - exact).mean()
  assert errors[-1] < 0.25 * uniform_error, (errors, uniform_error)


def log_features(x_BxLxNxH, features_MxH):
  """float64: log φ(x') = W x' − ‖x'‖²/2 − log √M, x' = x / H^{1/4}."""
  x = np.asarray(x_BxLxNxH, np.float64) / H**0.25
  w = np.asarray(features_MxH, np.float64)
  return (np.einsum('blnh,mh->blnm', x, w) - 0.5 * (x**2).sum(-1, keepdims=True)
          - 0.5 * math.log(len(w)))


def quadratic_form(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, features_MxH, allowed):
  """float64: out_t = Σ_s a_ts K_ts v_s / Σ_s a_ts K_ts with K_ts = φ(q_t')·φ(k_s') (zeros where
  no key is allowed); log K_ts = log Σ_m exp(log φ_m(q_t') + log φ_m(k_s')) by log-sum-exp,
  so that inputs far outside exp's range still have exact weights."""
  log_q, log_k = log_features(q_BxTxNxH, features_MxH), log_features(k_BxSxNxH, features_MxH)
  pair_BxNxTxSxM = (log_q.transpose(0, 2, 1, 3)[:, :, :, None]
                    + log_k.transpose(0, 2, 1, 3)[:, :, None])
  top = pair_BxNxTxSxM.max(-1)
  log_kernel_BxNxTxS = top + np.log(np.exp(pair_BxNxTxSxM - top[..., None]).sum(-1))
  allowed = np.broadcast_to(allowed, log_kernel_BxNxTxS.shape)
  masked = np.where(allowed, log_kernel_BxNxTxS, -np.inf)
  row_max = np.where(allowed.any(-1, keepdims=True), masked.max(-1, keepdims=True), 0)
  weights = np.exp(masked - row_max)
  weights = weights / np.where(allowed.any(-1, keepdims=True), weights.sum(-1, keepdims=True), 1)
  return np.einsum('bnts,bsnh->btnh', weights, np.asarray(v_BxSxNxH, np.float64))


def _scaled_qkv(steps):
  """q, k, v [3, T, 2, H]; batch row 1 has ‖q‖ = ‖k‖ = 30, where every unstabilised float32
  feature exp(ωᵀx' − ‖x'‖²/2) underflows to 0, and row 2 mixes norms from 0.25 to 30, where
  one maximum shared by all queries underflows the large ones."""
  q, k, v = draw((3, steps, 2, H), 11), draw((3, steps, 2, H), 12), draw((3, steps, 2, H), 13)
  for x in (q, k):
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    x[1] *= 30
    x[2] *= np.geomspace(0.25, 30, steps)[:, None, None].astype(np.float32)
  return q, k, v


def test_causal_and_padded_forms_equal_the_quadratic_form():
  q, k, v = _scaled_qkv(12)
  features_MxH = features_10xH()
  lengths = [12, 7, 12]
  valid_BxS = padding_allowed(lengths, 12)[:, 0, 0]
  # Zero padding has the largest exponents of row 1 (−log √M against about −200): it must not
  # set the keys' maximum.
  k[~valid_BxS] = 0
  blocks = (4, 5)  # 5 does not divide T = 12
  outs_causal, out_padded, out_bf16 = jax.jit(lambda q, k, v, valid: (
      [performer.performer_attention(q, k, v, features_MxH, causal=True, key_valid_BxS=valid,
                                     block=block) for block in blocks],
      performer.performer_attention(q, k, v, features_MxH, key_valid_BxS=valid),
      performer.performer_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v,
                                    features_MxH)))(q, k, v, valid_BxS)
  causal_and_padded = causal_allowed(12, 12)[None, None] & padding_allowed(lengths, 12)
  expected_causal = quadratic_form(q, k, v, features_MxH, causal_and_padded)
  for block, out in zip(blocks, outs_causal):
    # Exponents reach −280; float32 rounds them by up to 1.5e-5 (measured error 9.3e-6).
    np.testing.assert_allclose(out, expected_causal, rtol=0, atol=5e-5, err_msg=f'block={block}')
  np.testing.assert_allclose(out_padded, quadratic_form(q, k, v, features_MxH,
                                                        padding_allowed(lengths, 12)),
                             rtol=0, atol=5e-5)
  assert out_bf16.dtype == jnp.bfloat16
  rounded = [np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (q, k)]
  expected_bf16 = quadratic_form(*rounded, v, features_MxH, np.ones((1, 1, 12, 12), bool))
  # bfloat16 queries and keys, every key allowed: only the inputs and the output are rounded
  # (outputs up to 0.79; measured error 1.9e-3).
  np.testing.assert_allclose(np.asarray(out_bf16, np.float64), expected_bf16, atol=1e-2, rtol=0)


def test_values_of_another_width_and_queries_scaled_by_their_own_width():
  # Values 6 wide, queries and keys H = 4: x' = x / H^{1/4} with H the queries' width.
  q, k, v = draw((2, 6, 2, H), 1), draw((2, 6, 2, H), 2), draw((2, 6, 2, 6), 3)
  features_MxH = features_10xH()
  outs = jax.jit(lambda q, k, v: [performer.performer_attention(
      q, k, v, features_MxH, causal=causal, block=4) for causal in (False, True)])(q, k, v)
  for out, allowed in zip(outs, (True, causal_allowed(6, 6)[None, None])):
    assert out.shape == v.shape
    np.testing.assert_allclose(out, quadratic_form(q, k, v, features_MxH, allowed), rtol=0,
                               atol=5e-5)


@pytest.mark.parametrize('causal', [True, False])
def test_gradients_are_finite_with_padding_and_large_inputs(causal):
  # The non-causal sums have their own padding code (`_non_causal`): a NaN value there left
  # in Σ φ(k) vᵀ as 0·NaN reaches every query of the row.
  q, k, v = _scaled_qkv(8)
  features_MxH = features_10xH()
  valid_BxS = padding_allowed([8, 5, 0], 8)[:, 0, 0]

  def attend(q, k, v):
    return performer.performer_attention(q, k, v, features_MxH, causal=causal,
                                         key_valid_BxS=valid_BxS, block=3)

  out, _ = check_padding_garbage_stays_out(attend, q, k, v, valid_BxS)
  np.testing.assert_array_equal(out[2], 0.0)


def test_tiny_denominators_leave_the_gradients_exact():
  # W = [e_1; −e_1], q = −k = 42 e_1: after the shifts log φ(q') = (0, −59.4) and log φ(k') =
  # (−59.4, 0) (+ constants), so φ(q')·φ(k') ≈ 3e-26, whose square underflows float32; the
  # gradient of num / den, which has 1/den² in it, was NaN. With one key the output is its value
  # whatever q and k are, so the gradients of Σ out² are 0 for q and k and 2v for v.
  features_MxH = np.array([[1, 0, 0, 0], [-1, 0, 0, 0]], np.float32)
  q = np.array([42, 0, 0, 0], np.float32).reshape(1, 1, 1, H)
  v = draw((1, 1, 1, H), 1)
  # Non-causal: its own sums (`_non_causal`); the causal ones are linear attention's, tested there.
  grad_q, grad_k, grad_v = jax.jit(jax.grad(lambda *qkv: jnp.sum(performer.performer_attention(
      *qkv, features_MxH) ** 2), argnums=(0, 1, 2)))(q, -q, v)
  # Rounding through exponents of 60: measured 4.8e-6.
  np.testing.assert_allclose(grad_q, 0, atol=1e-4)
  np.testing.assert_allclose(grad_k, 0, atol=1e-4)
  np.testing.assert_allclose(grad_v, 2 * v, rtol=1e-6)


def test_bad_arguments_raise_before_compiling():
  q = np.zeros((1, 4, 2, H), np.float32)
  with pytest.raises(ValueError, match=r'features_MxH of shape \(8, 3\)'):
    performer.performer_attention(q, q, q, np.zeros((8, 3), np.float32))
  with pytest.raises(ValueError, match='num_features=0'):
    performer.draw_features(rng_key(0), 0, H)
  with pytest.raises(ValueError, match='T=4 and S=3'):
    performer.performer_attention(q, q[:, :3], q[:, :3], features_10xH(), causal=True)


def test_orthogonalisation_is_the_q_of_qr_with_a_positive_diagonal():
  # The Q that draw_features uses against LAPACK's QR in float64, signs fixed so that R's
  # diagonal is positive (the Haar-distributed Q); measured 1.9e-7.
  a_KxHxH = jax.random.normal(jax.random.PRNGKey(0), (3, 32, 32))
  q_ref, r_ref = np.linalg.qr(np.asarray(a_KxHxH, np.float64))
  q_ref = q_ref * np.sign(np.diagonal(r_ref, axis1=-2, axis2=-1))[:, None, :]
  np.testing.assert_allclose(jax.jit(performer._gram_schmidt)(a_KxHxH), q_ref, atol=2e-6)


def test_non_causal_sums_over_chunks_equal_the_quadratic_form(monkeypatch):
  # Chunks of 5 positions over 12 (the last one padded): the key maximum, the sums and the
  # queries are gathered across chunks; a lost or double-counted chunk, or padding counted as
  # keys, or a running maximum raised without rescaling the sums so far, breaks the equality.
  # Measured 9.3e-6, as in one chunk.
  monkeypatch.setattr(performer, 'CHUNK', 5)
  q, k, v = _scaled_qkv(12)
  features_MxH = features_10xH()
  lengths = [12, 7, 3]
  valid_BxS = padding_allowed(lengths, 12)[:, 0, 0]
  k[~valid_BxS] = 0
  out, grads = jax.jit(lambda q, k, v: (
      performer.performer_attention(q, k, v, features_MxH, key_valid_BxS=valid_BxS),
      jax.grad(lambda *qkv: (performer.performer_attention(
          *qkv, features_MxH, key_valid_BxS=valid_BxS) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
  ))(q, k, v)
  np.testing.assert_allclose(out, quadratic_form(q, k, v, features_MxH,
                                                 padding_allowed(lengths, 12)),
                             rtol=0, atol=5e-5)
  assert all(np.isfinite(g).all() for g in grads)
