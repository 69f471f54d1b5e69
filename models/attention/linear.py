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

Rotary positions (Su et al. 2021, §3.3, eq. 19) rotate the features, not q and k, and
only in the numerator, so that its scores depend on the offset between positions alone
(φ acts entry by entry, so φ(R_p q)ᵀφ(R_p′ k) would not) and the denominator stays positive:

  out_i = Σ_j (R_i φ(q_i))ᵀ(R_j φ(k_j)) v_j / Σ_j φ(q_i)ᵀφ(k_j).
"""

import jax
import jax.numpy as jnp

from models.attention import positions as positions_lib

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
                                   block: int = DEFAULT_BLOCK, numerator_features=None):
  """out_i = φq_iᵀ Σ_j φk_j v_jᵀ / φq_iᵀ Σ_j φk_j over the allowed keys j, from features
  φq [B, T, N, M] and φk [B, S, N, M] that are already mapped (M may differ from H).
  `numerator_features` (ψq, ψk), shaped as φq and φk, take their place in the numerator
  only: ψq_iᵀ Σ_j ψk_j v_jᵀ / φq_iᵀ Σ_j φk_j (the rotated features of eq. 19 above).

  Non-causal: j runs over the valid keys (`key_valid_BxS`, True = real token). Causal
  (T == S): j ≤ i, computed block by block: a `lax.scan` over blocks of `block` positions
  carries S = Σ φk vᵀ [B, N, M, H] and z = Σ φk [B, N, M] from earlier blocks, and inside a
  block the masked [block, block] quadratic form adds the keys of the block itself. Memory
  is linear in T; [T, M, H] prefix sums are never formed. T need not divide by `block`.

  Sums are float32; the output has φq's dtype. A query with no allowed key returns zeros.
  """
  check_arguments(phi_q_BxTxNxM.shape, phi_k_BxSxNxM.shape, v_BxSxNxH.shape, causal=causal,
                  key_valid_BxS=key_valid_BxS, block=block)
  psi_q_BxTxNxM, psi_k_BxSxNxM = numerator_features or (phi_q_BxTxNxM, phi_k_BxSxNxM)
  if psi_q_BxTxNxM.shape != phi_q_BxTxNxM.shape or psi_k_BxSxNxM.shape != phi_k_BxSxNxM.shape:
    raise ValueError(f'numerator_features of shapes {psi_q_BxTxNxM.shape} and '
                     f'{psi_k_BxSxNxM.shape} must be those of the features, '
                     f'{phi_q_BxTxNxM.shape} and {phi_k_BxSxNxM.shape}.')
  if key_valid_BxS is not None:
    # Zeroing the values as well keeps padding garbage (inf, nan) out of 0·v.
    valid_BxSx1x1 = key_valid_BxS[:, :, None, None]
    phi_k_BxSxNxM = jnp.where(valid_BxSx1x1, phi_k_BxSxNxM, 0)
    psi_k_BxSxNxM = jnp.where(valid_BxSx1x1, psi_k_BxSxNxM, 0)
    v_BxSxNxH = jnp.where(valid_BxSx1x1, v_BxSxNxH, 0)
  if causal:
    num_BxTxNxH, den_BxTxN = _causal_sums(
        phi_q_BxTxNxM, phi_k_BxSxNxM, v_BxSxNxH, block,
        None if numerator_features is None else (psi_q_BxTxNxM, psi_k_BxSxNxM))
  else:
    state_BxNxMxH = jnp.einsum('bsnm,bsnh->bnmh', psi_k_BxSxNxM, v_BxSxNxH,
                               preferred_element_type=jnp.float32)
    z_BxNxM = jnp.sum(phi_k_BxSxNxM, axis=1, dtype=jnp.float32)
    num_BxTxNxH = jnp.einsum('btnm,bnmh->btnh', psi_q_BxTxNxM, state_BxNxMxH,
                             preferred_element_type=jnp.float32)
    den_BxTxN = jnp.einsum('btnm,bnm->btn', phi_q_BxTxNxM, z_BxNxM,
                           preferred_element_type=jnp.float32)
  return ratio(num_BxTxNxH, den_BxTxN).astype(phi_q_BxTxNxM.dtype)


def ratio(num_BxTxNxH, den_BxTxN):
  """num / den [B, T, N, H], zeros where den ≤ _TINY (no allowed key), with finite gradients."""
  has_keys_BxTxNx1 = (den_BxTxN > _TINY)[..., None]
  # This where keeps 1/0 out of the gradient of the rows the last one drops.
  den_BxTxNx1 = jnp.where(has_keys_BxTxNx1, den_BxTxN[..., None], 1)
  # Both divided by den's value first: the gradient of num / den has a 1/den², which overflows
  # float32 for den < 1e-19 (the Performer's shifted features reach such sums) and gives inf
  # and NaN; that of (num/d) / (den/d) divides by den twice, one factor at a time.
  unit_BxTxNx1 = jax.lax.stop_gradient(den_BxTxNx1)
  return jnp.where(has_keys_BxTxNx1,
                   (num_BxTxNxH / unit_BxTxNx1) / (den_BxTxNx1 / unit_BxTxNx1), 0)


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


def _causal_sums(phi_q_BxTxNxM, phi_k_BxTxNxM, v_BxTxNxH, block, numerator_features=None):
  """Σ_{j≤i} (ψq_i·ψk_j) v_j [B, T, N, H] and Σ_{j≤i} φq_i·φk_j [B, T, N], block by block;
  ψ = φ unless `numerator_features` gives (ψq, ψk)."""
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

  scores = lambda a_BxCxNxM, b_BxCxNxM: jnp.where(causal_CxC, jnp.einsum(
      'bcnm,bdnm->bncd', a_BxCxNxM, b_BxCxNxM, preferred_element_type=jnp.float32), 0)

  def step(carry, blocks):
    state_BxNxMxH, z_BxNxM = carry
    phi_q_BxCxNxM, phi_k_BxCxNxM, v_BxCxNxH, *psi = blocks
    psi_q_BxCxNxM, psi_k_BxCxNxM = psi or (phi_q_BxCxNxM, phi_k_BxCxNxM)
    den_scores_BxNxCxC = scores(phi_q_BxCxNxM, phi_k_BxCxNxM)
    num_scores_BxNxCxC = scores(psi_q_BxCxNxM, psi_k_BxCxNxM) if psi else den_scores_BxNxCxC
    num_BxCxNxH = (jnp.einsum('bncd,bdnh->bcnh', num_scores_BxNxCxC, v_BxCxNxH,
                              preferred_element_type=jnp.float32)
                   + jnp.einsum('bcnm,bnmh->bcnh', psi_q_BxCxNxM, state_BxNxMxH,
                                preferred_element_type=jnp.float32))
    den_BxCxN = (jnp.sum(den_scores_BxNxCxC, axis=-1).transpose(0, 2, 1)
                 + jnp.einsum('bcnm,bnm->bcn', phi_q_BxCxNxM, z_BxNxM,
                              preferred_element_type=jnp.float32))
    state_BxNxMxH = state_BxNxMxH + jnp.einsum('bdnm,bdnh->bnmh', psi_k_BxCxNxM, v_BxCxNxH,
                                               preferred_element_type=jnp.float32)
    z_BxNxM = z_BxNxM + jnp.sum(phi_k_BxCxNxM, axis=1, dtype=jnp.float32)
    return (state_BxNxMxH, z_BxNxM), (num_BxCxNxH, den_BxCxN)

  initial = (jnp.zeros((batch, heads, width, value_width), jnp.float32),
             jnp.zeros((batch, heads, width), jnp.float32))
  blocks = (phi_q_BxTxNxM, phi_k_BxTxNxM, v_BxTxNxH) + tuple(numerator_features or ())
  _, (num_KxBxCxNxH, den_KxBxCxN) = jax.lax.scan(step, initial, tuple(map(to_blocks, blocks)))
  num_BxTxNxH = jnp.moveaxis(num_KxBxCxNxH, 0, 1).reshape(batch, padded, heads, value_width)
  den_BxTxN = jnp.moveaxis(den_KxBxCxN, 0, 1).reshape(batch, padded, heads)
  return num_BxTxNxH[:, :steps], den_BxTxN[:, :steps]


def linear_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, causal: bool = False,
                     key_valid_BxS=None, block: int = DEFAULT_BLOCK, rotary=None):
  """Linear attention of Katharopoulos et al. 2020 with φ(x) = elu(x) + 1:

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j),

  j over the valid keys, and j ≤ i when `causal` (T == S; `block` positions per scan
  step, see `linear_attention_from_features`). No 1/√H: a kernel other than exp(qᵀk/√H)
  is not a scaled softmax. `rotary` (query positions [T], key positions [S], base) rotates
  the features of the numerator as in eq. 19 of the module doc. Returns q's dtype; a query
  with no valid key returns zeros.
  """
  check_arguments(q_BxTxNxH.shape, k_BxSxNxH.shape, v_BxSxNxH.shape, causal=causal,
                  key_valid_BxS=key_valid_BxS, block=block)
  phi_q_BxTxNxH, phi_k_BxSxNxH = elu_feature_map(q_BxTxNxH), elu_feature_map(k_BxSxNxH)
  numerator_features = None
  if rotary is not None:
    q_positions_T, k_positions_S, base = rotary
    numerator_features = (positions_lib.rotate(phi_q_BxTxNxH, q_positions_T, base),
                          positions_lib.rotate(phi_k_BxSxNxH, k_positions_S, base))
  return linear_attention_from_features(
      phi_q_BxTxNxH, phi_k_BxSxNxH, v_BxSxNxH, causal=causal, key_valid_BxS=key_valid_BxS,
      block=block, numerator_features=numerator_features).astype(q_BxTxNxH.dtype)
