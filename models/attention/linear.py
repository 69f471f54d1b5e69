"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention weighs key j by exp(q_iᵀk_j/√H). Replacing that similarity by a
kernel φ(q_i)ᵀφ(k_j) with a positive feature map φ lets the sum over keys be
factored out of the query:

  out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j)
        = φ(q_i)ᵀ S / φ(q_i)ᵀ z,    S = Σ_j φ(k_j) v_jᵀ [M, H],  z = Σ_j φ(k_j) [M],

so the cost is O((T + S)·M·H) instead of O(T·S·H). Causal attention sums over j ≤ i:
S and z become prefix sums, the state of a recurrent network.

The feature maps live with their kinds: φ(x) = elu(x) + 1 here, the Performer's
positive random features in `performer.py`; both go through
`linear_attention_from_features`.
"""

import jax
import jax.numpy as jnp

DEFAULT_BLOCK = 64

# The denominator is a sum of non-negative terms; it is 0 only when the query has no
# allowed key (or every term underflowed), and such a query returns zeros.
_TINY = float(jnp.finfo(jnp.float32).tiny)


def elu_feature_map(x: jax.Array) -> jax.Array:
  """φ(x) = elu(x) + 1, positive so that the normaliser φ(q)ᵀz cannot vanish (Katharopoulos
  et al. 2020, §3.2.1)."""
  return jax.nn.elu(x) + 1


def linear_attention_from_features(phi_q_BxTxNxM, phi_k_BxSxNxM, v_BxSxNxH, *,
                                   causal: bool = False, key_valid_BxS=None,
                                   block: int = DEFAULT_BLOCK):
  """out_i = φq_iᵀ Σ_j φk_j v_jᵀ / φq_iᵀ Σ_j φk_j over the allowed keys j, from features
  φq [B, T, N, M] and φk [B, S, N, M] that are already mapped (M may differ from H).

  Non-causal: j runs over the valid keys (`key_valid_BxS`, True = real token). Causal
  (T == S): j ≤ i, computed block by block: a `lax.scan` over blocks of `block` positions
  carries S = Σ φk vᵀ [B, N, M, H] and z = Σ φk [B, N, M] from earlier blocks, and inside a
  block the masked [block, block] quadratic form adds the keys of the block itself. Memory
  is linear in T; [T, M, H] prefix sums are never formed. T need not divide by `block`.

  Sums are float32; the output has φq's dtype. A query with no allowed key returns zeros.
  """
  check_arguments(phi_q_BxTxNxM.shape, phi_k_BxSxNxM.shape, v_BxSxNxH.shape, causal=causal,
                  key_valid_BxS=key_valid_BxS, block=block)
  if key_valid_BxS is not None:
    # Zeroing the values as well keeps padding garbage (inf, nan) out of 0·v.
    valid_BxSx1x1 = key_valid_BxS[:, :, None, None]
    phi_k_BxSxNxM = jnp.where(valid_BxSx1x1, phi_k_BxSxNxM, 0)
    v_BxSxNxH = jnp.where(valid_BxSx1x1, v_BxSxNxH, 0)
  if causal:
    num_BxTxNxH, den_BxTxN = _causal_sums(phi_q_BxTxNxM, phi_k_BxSxNxM, v_BxSxNxH, block)
  else:
    state_BxNxMxH = jnp.einsum('bsnm,bsnh->bnmh', phi_k_BxSxNxM, v_BxSxNxH,
                               preferred_element_type=jnp.float32)
    z_BxNxM = jnp.sum(phi_k_BxSxNxM, axis=1, dtype=jnp.float32)
    num_BxTxNxH = jnp.einsum('btnm,bnmh->btnh', phi_q_BxTxNxM, state_BxNxMxH,
                             preferred_element_type=jnp.float32)
    den_BxTxN = jnp.einsum('btnm,bnm->btn', phi_q_BxTxNxM, z_BxNxM,
                           preferred_element_type=jnp.float32)
  has_keys_BxTxNx1 = (den_BxTxN > _TINY)[..., None]
  # The inner where keeps 1/0 out of the gradient of the rows the outer where drops.
  out_BxTxNxH = jnp.where(has_keys_BxTxNx1,
                          num_BxTxNxH / jnp.where(has_keys_BxTxNx1, den_BxTxN[..., None], 1), 0)
  return out_BxTxNxH.astype(phi_q_BxTxNxM.dtype)


def check_arguments(query_shape, key_shape, value_shape, *, causal, key_valid_BxS, block):
  """Raises ValueError unless queries [B, T, N, W], keys [B, S, N, W] and values [B, S, N, H]
  fit together (and T == S if `causal`), `key_valid_BxS` is [B, S] and `block` is positive."""
  if len(query_shape) != 4:
    raise ValueError(f'Queries of shape {tuple(query_shape)} must be [B, T, N, W].')
  batch, steps, heads, width = query_shape
  keys = key_shape[1]
  if tuple(key_shape) != (batch, keys, heads, width):
    raise ValueError(f'Keys of shape {tuple(key_shape)} do not match queries {tuple(query_shape)}; '
                     f'expected [B, S, N, W] = [{batch}, S, {heads}, {width}].')
  if tuple(value_shape[:3]) != (batch, keys, heads):
    raise ValueError(f'Values of shape {tuple(value_shape)} do not match keys; expected '
                     f'[B, S, N, H] = [{batch}, {keys}, {heads}, H].')
  if key_valid_BxS is not None and key_valid_BxS.shape != (batch, keys):
    raise ValueError(f'key_valid_BxS of shape {key_valid_BxS.shape} must be [B, S] = '
                     f'[{batch}, {keys}].')
  if causal and steps != keys:
    raise ValueError(f'Causal attention needs as many queries as keys, got T={steps} and '
                     f'S={keys}.')
  if not isinstance(block, int) or block < 1:
    raise ValueError(f'block={block!r} must be a positive integer.')


def _causal_sums(phi_q_BxTxNxM, phi_k_BxTxNxM, v_BxTxNxH, block):
  """Σ_{j≤i} (φq_i·φk_j) v_j [B, T, N, H] and Σ_{j≤i} φq_i·φk_j [B, T, N], block by block."""
  batch, steps, heads, width = phi_q_BxTxNxM.shape
  value_width = v_BxTxNxH.shape[-1]
  block = min(block, steps)
  num_blocks = -(-steps // block)
  padded = num_blocks * block

  def to_blocks(x):
    """[B, T, …] → [K, B, C, …], T padded with zeros to K·C."""
    # Padded positions have φk = 0 and v = 0, so they add nothing to the state.
    x = jnp.pad(x, [(0, 0), (0, padded - steps)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((batch, num_blocks, block) + x.shape[2:]), 1, 0)

  causal_CxC = jnp.tril(jnp.ones((block, block), bool))

  def step(carry, blocks):
    state_BxNxMxH, z_BxNxM = carry
    phi_q_BxCxNxM, phi_k_BxCxNxM, v_BxCxNxH = blocks
    scores_BxNxCxC = jnp.einsum('bcnm,bdnm->bncd', phi_q_BxCxNxM, phi_k_BxCxNxM,
                                preferred_element_type=jnp.float32)
    scores_BxNxCxC = jnp.where(causal_CxC, scores_BxNxCxC, 0)
    num_BxCxNxH = (jnp.einsum('bncd,bdnh->bcnh', scores_BxNxCxC, v_BxCxNxH,
                              preferred_element_type=jnp.float32)
                   + jnp.einsum('bcnm,bnmh->bcnh', phi_q_BxCxNxM, state_BxNxMxH,
                                preferred_element_type=jnp.float32))
    den_BxCxN = (jnp.sum(scores_BxNxCxC, axis=-1).transpose(0, 2, 1)
                 + jnp.einsum('bcnm,bnm->bcn', phi_q_BxCxNxM, z_BxNxM,
                              preferred_element_type=jnp.float32))
    state_BxNxMxH = state_BxNxMxH + jnp.einsum('bdnm,bdnh->bnmh', phi_k_BxCxNxM, v_BxCxNxH,
                                               preferred_element_type=jnp.float32)
    z_BxNxM = z_BxNxM + jnp.sum(phi_k_BxCxNxM, axis=1, dtype=jnp.float32)
    return (state_BxNxMxH, z_BxNxM), (num_BxCxNxH, den_BxCxN)

  initial = (jnp.zeros((batch, heads, width, value_width), jnp.float32),
             jnp.zeros((batch, heads, width), jnp.float32))
  _, (num_KxBxCxNxH, den_KxBxCxN) = jax.lax.scan(
      step, initial, (to_blocks(phi_q_BxTxNxM), to_blocks(phi_k_BxTxNxM), to_blocks(v_BxTxNxH)))
  num_BxTxNxH = jnp.moveaxis(num_KxBxCxNxH, 0, 1).reshape(batch, padded, heads, value_width)
  den_BxTxN = jnp.moveaxis(den_KxBxCxN, 0, 1).reshape(batch, padded, heads)
  return num_BxTxNxH[:, :steps], den_BxTxN[:, :steps]


def linear_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, causal: bool = False,
                     key_valid_BxS=None, block: int = DEFAULT_BLOCK):
  """Linear attention of Katharopoulos et al. 2020 with φ(x) = elu(x) + 1:

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j),

  j over the valid keys, and j ≤ i when `causal` (T == S; `block` positions per scan
  step, see `linear_attention_from_features`). No 1/√H: a kernel other than exp(qᵀk/√H)
  is not a scaled softmax. Returns q's dtype; a query with no valid key returns zeros.
  """
  check_arguments(q_BxTxNxH.shape, k_BxSxNxH.shape, v_BxSxNxH.shape, causal=causal,
                  key_valid_BxS=key_valid_BxS, block=block)
  return linear_attention_from_features(
      elu_feature_map(q_BxTxNxH), elu_feature_map(k_BxSxNxH), v_BxSxNxH, causal=causal,
      key_valid_BxS=key_valid_BxS, block=block).astype(q_BxTxNxH.dtype)
