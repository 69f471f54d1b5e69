"""Performer attention, FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

The softmax kernel SM(x, y) = exp(xᵀy) is an expectation over Gaussian ω ~ N(0, I_H),

  exp(xᵀy) = E_ω[exp(ωᵀx − ‖x‖²/2) exp(ωᵀy − ‖y‖²/2)],

so with M draws ω_1 … ω_M (the rows of W [M, H]) the positive random features

  φ(x) = exp(W x − ‖x‖²/2) / √M

give an unbiased estimate φ(x)ᵀφ(y) of exp(xᵀy) that, unlike sin/cos features, is never
negative, so the attention normaliser stays positive. Applied to q' = q / H^{1/4} and
k' = k / H^{1/4}, E[φ(q')ᵀφ(k')] = exp(qᵀk/√H), the weights of softmax attention, and
attention becomes linear attention with feature map φ (`linear.py`). Drawing the rows
orthogonal in blocks of H (their norms still χ_H-distributed, so each row is marginally
N(0, I_H)) keeps the estimate unbiased and lowers its variance.
"""

import math

import jax
import jax.numpy as jnp

from models.attention import linear


def draw_features(key: jax.Array, num_features: int, head_dim: int,
                  orthogonal: bool = True) -> jax.Array:
  """W [M, H] with rows ω_m ~ N(0, I_H); if `orthogonal`, the rows of each block of H are
  orthogonal: the Q of a Gaussian matrix's QR (sign-corrected, so Haar-distributed) scaled
  row by row by the norm of an independent Gaussian vector (χ_H-distributed)."""
  if not isinstance(num_features, int) or num_features < 1:
    raise ValueError(f'num_features={num_features!r} must be a positive integer.')
  if not isinstance(head_dim, int) or head_dim < 1:
    raise ValueError(f'head_dim={head_dim!r} must be a positive integer.')
  if not orthogonal:
    return jax.random.normal(key, (num_features, head_dim), jnp.float32)
  num_blocks = -(-num_features // head_dim)
  # One draw: K blocks to orthogonalise, and K·H vectors whose norms the rows take.
  gaussian_KxHxH, for_norms_KxHxH = jax.random.normal(
      key, (2, num_blocks, head_dim, head_dim), jnp.float32)
  q_KxHxH = _gram_schmidt(gaussian_KxHxH)
  directions_MxH = jnp.swapaxes(q_KxHxH, -1, -2).reshape(num_blocks * head_dim, head_dim)
  norms_M = jnp.linalg.norm(for_norms_KxHxH, axis=-1).reshape(num_blocks * head_dim)
  return (directions_MxH * norms_M[:, None])[:num_features]


def _gram_schmidt(a_KxHxH):
  """The Q of A = QR with R's diagonal positive (so Q is Haar-distributed for Gaussian A):
  Gram–Schmidt on the columns, each projection done twice ("twice is enough", Giraud et al.
  2005).

  Written with matrix products, not `jnp.linalg.qr`: on the CPU, two LAPACK QR calls that
  XLA runs at once (one per attention layer) can each wait for the other's thread and hang.
  """
  size = a_KxHxH.shape[-1]

  def add_column(j, q_KxHxH):
    v_KxH = jax.lax.dynamic_index_in_dim(a_KxHxH, j, axis=2, keepdims=False)
    for _ in range(2):  # columns not yet set are zero and project out nothing
      v_KxH = v_KxH - jnp.einsum('khj,kj->kh', q_KxHxH, jnp.einsum('khj,kh->kj', q_KxHxH, v_KxH))
    v_KxH = v_KxH / jnp.linalg.norm(v_KxH, axis=-1, keepdims=True)
    return jax.lax.dynamic_update_index_in_dim(q_KxHxH, v_KxH, j, axis=2)

  return jax.lax.fori_loop(0, size, add_column, jnp.zeros_like(a_KxHxH))


def _log_features(x_BxLxNxH, features_MxH):
  """log φ(x) = W x − ‖x‖²/2 − log √M [B, L, N, M], in float32."""
  x_BxLxNxH = x_BxLxNxH.astype(jnp.float32)
  projected_BxLxNxM = jnp.einsum('blnh,mh->blnm', x_BxLxNxH, features_MxH,
                                 preferred_element_type=jnp.float32)
  half_norm_BxLxNx1 = 0.5 * jnp.sum(x_BxLxNxH**2, axis=-1, keepdims=True)
  return projected_BxLxNxM - half_norm_BxLxNx1 - 0.5 * math.log(features_MxH.shape[0])


# Positions per step of the non-causal sums: the [chunk, M] features of a step stay in cache
# whatever the length.
CHUNK = 1024


def _chunks(x_BxLx, chunk, fill):
  """[C, B, chunk, …]: x cut along its length into C chunks, the last padded with `fill`."""
  length = x_BxLx.shape[1]
  count = -(-length // chunk)
  pad = [(0, 0), (0, count * chunk - length)] + [(0, 0)] * (x_BxLx.ndim - 2)
  x_BxLx = jnp.pad(x_BxLx, pad, constant_values=fill)
  return jnp.moveaxis(x_BxLx.reshape((x_BxLx.shape[0], count, chunk) + x_BxLx.shape[2:]), 1, 0)


def _non_causal(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, features_MxH, key_valid_BxS):
  """The non-causal sums of `performer_attention` (q, k already scaled by H^{-1/4}), `CHUNK`
  positions at a time: one scan over the key chunks for S = Σ φ(k) vᵀ and z = Σ φ(k), scaled
  by the largest log-feature of each (batch, head) so far, and the query chunks in turn. The
  same numbers as building every feature at once, in a working set that does not grow with
  the length."""
  batch, keys = k_BxSxNxH.shape[:2]
  valid_BxS = (jnp.ones((batch, keys), bool) if key_valid_BxS is None
               else jnp.asarray(key_valid_BxS, bool))
  chunk = min(CHUNK, keys)
  k_CxBxLxNxH, v_CxBxLxNxH = _chunks(k_BxSxNxH, chunk, 0), _chunks(v_BxSxNxH, chunk, 0)
  valid_CxBxL = _chunks(valid_BxS, chunk, False)

  def log_phi_k(k_BxLxNxH, valid_BxL):
    # Padding takes no part in the maximum, and exp(−inf) = 0 gives it no features.
    return jnp.where(valid_BxL[:, :, None, None], _log_features(k_BxLxNxH, features_MxH),
                     -jnp.inf)

  # Checkpointed: the backward pass recomputes a chunk's features instead of storing every
  # chunk's [chunk, M] arrays, so its working set does not grow with the length either.
  @jax.checkpoint
  def add_chunk(sums, a):
    k_BxLxNxH, v_BxLxNxH, valid_BxL = a
    state_BxNxMxH, z_BxNxM, old_max_BxN = sums
    log_phi_k_BxLxNxM = log_phi_k(k_BxLxNxH, valid_BxL)
    # The running maximum of the keys so far (see `performer_attention` for why one maximum
    # per (batch, head) cancels in the ratio): when a chunk raises it, the sums so far are
    # rescaled by exp(old − new), as in the online softmax of Milakov & Gimelshein 2018.
    max_BxN = jnp.maximum(old_max_BxN,
                          jax.lax.stop_gradient(jnp.max(log_phi_k_BxLxNxM, axis=(1, 3))))
    shift_BxN = jnp.where(jnp.isfinite(max_BxN), max_BxN, 0)  # −inf while only padding so far
    rescale_BxN = jnp.exp(old_max_BxN - shift_BxN)  # exp(−inf) = 0 before the first valid key
    phi_k_BxLxNxM = jnp.exp(log_phi_k_BxLxNxM - shift_BxN[:, None, :, None])
    # Zeroing the values as well keeps padding garbage (inf, nan) out of 0·v.
    v_BxLxNxH = jnp.where(valid_BxL[:, :, None, None], v_BxLxNxH, 0)
    state_BxNxMxH = rescale_BxN[:, :, None, None] * state_BxNxMxH + jnp.einsum(
        'blnm,blnh->bnmh', phi_k_BxLxNxM, v_BxLxNxH, preferred_element_type=jnp.float32)
    z_BxNxM = rescale_BxN[:, :, None] * z_BxNxM + jnp.sum(phi_k_BxLxNxM, axis=1)
    return (state_BxNxMxH, z_BxNxM, max_BxN), None

  heads, width, num_features = k_BxSxNxH.shape[2], v_BxSxNxH.shape[-1], features_MxH.shape[0]
  start = (jnp.zeros((batch, heads, num_features, width), jnp.float32),
           jnp.zeros((batch, heads, num_features), jnp.float32),
           jnp.full((batch, heads), -jnp.inf, jnp.float32))
  (state_BxNxMxH, z_BxNxM, _), _ = jax.lax.scan(add_chunk, start,
                                                (k_CxBxLxNxH, v_CxBxLxNxH, valid_CxBxL))

  @jax.checkpoint
  def attend(q_BxLxNxH):
    log_phi_q_BxLxNxM = _log_features(q_BxLxNxH, features_MxH)
    phi_q_BxLxNxM = jnp.exp(log_phi_q_BxLxNxM - jax.lax.stop_gradient(
        jnp.max(log_phi_q_BxLxNxM, axis=-1, keepdims=True)))
    num_BxLxNxH = jnp.einsum('blnm,bnmh->blnh', phi_q_BxLxNxM, state_BxNxMxH,
                             preferred_element_type=jnp.float32)
    den_BxLxN = jnp.einsum('blnm,bnm->bln', phi_q_BxLxNxM, z_BxNxM,
                           preferred_element_type=jnp.float32)
    return linear.ratio(num_BxLxNxH, den_BxLxN)

  queries = q_BxTxNxH.shape[1]
  out_CxBxLxNxH = jax.lax.map(attend, _chunks(q_BxTxNxH, min(CHUNK, queries), 0))
  out_BxTxNxH = jnp.moveaxis(out_CxBxLxNxH, 0, 1)
  out_BxTxNxH = out_BxTxNxH.reshape((batch, -1) + out_BxTxNxH.shape[3:])
  return out_BxTxNxH[:, :queries]


def softmax_kernel_features(x_BxLxNxH, features_MxH) -> jax.Array:
  """φ(x) = exp(W x − ‖x‖²/2) / √M [B, L, N, M], with E[φ(x)ᵀφ(y)] = exp(xᵀy) (Choromanski
  et al. 2021, Lemma 1). Unstabilised: for large ‖x‖ every feature underflows float32 to 0,
  which `performer_attention` avoids."""
  return jnp.exp(_log_features(x_BxLxNxH, features_MxH))


def performer_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, features_MxH, *, causal: bool = False,
                        key_valid_BxS=None, block: int = linear.DEFAULT_BLOCK):
  """FAVOR+ attention (Choromanski et al. 2021): softmax attention with exp(q_iᵀk_j/√H)
  replaced by its random-feature estimate φ(q_i')ᵀφ(k_j'), x' = x / H^{1/4}:

    out_i = φ(q_i')ᵀ Σ_j φ(k_j') v_jᵀ / φ(q_i')ᵀ Σ_j φ(k_j'),   φ(x) = exp(W x − ‖x‖²/2) / √M,

  j over the valid keys, and j ≤ i when `causal` (T == S, `block` positions per scan step).
  `features_MxH` is W, from `draw_features`. Returns q's dtype; a query with no valid key
  returns zeros.
  """
  linear.check_arguments(q_BxTxNxH.shape, k_BxSxNxH.shape, v_BxSxNxH.shape, causal=causal,
                         key_valid_BxS=key_valid_BxS, block=block)
  head_dim = q_BxTxNxH.shape[-1]
  if features_MxH.ndim != 2 or features_MxH.shape[1] != head_dim:
    raise ValueError(f'features_MxH of shape {features_MxH.shape} must be [M, H] with '
                     f'H={head_dim}, the head width of q.')
  scale = head_dim ** -0.25
  if not causal:
    return _non_causal(q_BxTxNxH.astype(jnp.float32) * scale,
                       k_BxSxNxH.astype(jnp.float32) * scale, v_BxSxNxH, features_MxH,
                       key_valid_BxS).astype(q_BxTxNxH.dtype)
  log_phi_q_BxTxNxM = _log_features(q_BxTxNxH.astype(jnp.float32) * scale, features_MxH)
  log_phi_k_BxSxNxM = _log_features(k_BxSxNxH.astype(jnp.float32) * scale, features_MxH)
  # Subtracting a constant c from the exponents multiplies numerator and denominator by the
  # same e^−c, so it cancels in the ratio, as long as c is shared by all the terms of one
  # ratio: one c per query over its features, and for keys one c per (batch, head) over all
  # keys and features (one per key would reweight the keys). The maxima keep exp ≤ 1. In
  # causal attention the key maximum includes later keys, so a key far above all earlier ones
  # can underflow the earlier queries' sums to 0.
  log_phi_q_BxTxNxM -= jax.lax.stop_gradient(jnp.max(log_phi_q_BxTxNxM, axis=-1, keepdims=True))
  if key_valid_BxS is not None:
    # Padding takes no part in the maximum, and exp(−inf) = 0 gives it no features.
    log_phi_k_BxSxNxM = jnp.where(key_valid_BxS[:, :, None, None], log_phi_k_BxSxNxM, -jnp.inf)
  key_max_Bx1xNx1 = jnp.max(log_phi_k_BxSxNxM, axis=(1, 3), keepdims=True)
  key_max_Bx1xNx1 = jnp.where(jnp.isfinite(key_max_Bx1xNx1), key_max_Bx1xNx1, 0)
  log_phi_k_BxSxNxM -= jax.lax.stop_gradient(key_max_Bx1xNx1)
  return linear.linear_attention_from_features(
      jnp.exp(log_phi_q_BxTxNxM), jnp.exp(log_phi_k_BxSxNxM), v_BxSxNxH, causal=causal,
      key_valid_BxS=key_valid_BxS, block=block).astype(q_BxTxNxH.dtype)
