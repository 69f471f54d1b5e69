"""Linformer attention, Wang et al. 2020 ("Linformer: Self-Attention with Linear Complexity").

Keys and values are projected along the length by learned E, F ∈ R^{k×L} before attention:

  out = softmax(Q (E K)ᵀ / √H) (F V)

so each query scores k projected keys instead of S keys, and the cost is O(S·k) rather than
O(S²). L is the longest input the projections were made for; a shorter input of length S uses
their first S columns. Non-causal only: every projected key mixes all positions, future ones
included.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp


def linformer_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, proj_e_KxL, proj_f_KxL, *,
                        causal: bool = False, key_valid_BxS=None):
  """Linformer attention (Wang et al. 2020, §4), every head sharing E and F:

    out = softmax(Q (E_S K)ᵀ / √H) (F_S V),   E_S, F_S = the first S columns of E, F

  Padded keys (`key_valid_BxS` False) and their values are zeroed before the projection, so
  they add nothing to E K and F V; a padded position still takes part in the projection as a
  zero token, which exact attention's mask would hide entirely. A row whose keys are all
  padded has F V = 0 and returns zeros.

  `causal=True` and S > L raise ValueError (both known from static shapes, before any
  compilation).
  """
  if causal:
    raise ValueError('Linformer attention cannot be causal (each projected key mixes every '
                     'position, future ones included); use causal=False.')
  if proj_e_KxL.shape != proj_f_KxL.shape:
    raise ValueError(f'Linformer projections E {proj_e_KxL.shape} and F {proj_f_KxL.shape} '
                     f'must have the same shape [k, max_length].')
  keys, max_length = k_BxSxNxH.shape[1], proj_e_KxL.shape[1]
  if keys > max_length:
    raise ValueError(f"sequence length S={keys} exceeds the Linformer's max_length "
                     f'L={max_length}; inputs may have at most {max_length} positions.')
  if key_valid_BxS is not None:
    valid_BxSx1x1 = jnp.asarray(key_valid_BxS, bool)[:, :, None, None]
    k_BxSxNxH = jnp.where(valid_BxSx1x1, k_BxSxNxH, 0)
    v_BxSxNxH = jnp.where(valid_BxSx1x1, v_BxSxNxH, 0)
  e_KxS = proj_e_KxL[:, :keys].astype(k_BxSxNxH.dtype)
  f_KxS = proj_f_KxL[:, :keys].astype(v_BxSxNxH.dtype)
  # E K and F V: sums over up to L positions, accumulated in float32.
  k_BxKxNxH = jnp.einsum('ks,bsnh->bknh', e_KxS, k_BxSxNxH,
                         preferred_element_type=jnp.float32).astype(k_BxSxNxH.dtype)
  v_BxKxNxH = jnp.einsum('ks,bsnh->bknh', f_KxS, v_BxSxNxH,
                         preferred_element_type=jnp.float32).astype(v_BxSxNxH.dtype)
  logits_BxNxTxK = jnp.einsum('btnh,bknh->bntk', q_BxTxNxH, k_BxKxNxH,
                              preferred_element_type=jnp.float32) / jnp.sqrt(q_BxTxNxH.shape[-1])
  weights_BxNxTxK = jax.nn.softmax(logits_BxNxTxK, axis=-1)
  out_BxTxNxH = jnp.einsum('bntk,bknh->btnh', weights_BxNxTxK.astype(v_BxKxNxH.dtype), v_BxKxNxH,
                           preferred_element_type=jnp.float32)
  return out_BxTxNxH.astype(q_BxTxNxH.dtype)


class LinformerProjections(nn.Module):
  """The Linformer's projections E, F ∈ R^{k×L} (Wang et al. 2020, §4); returns (E, F).

  With `share_kv` one matrix serves as both (the paper's key-value sharing, §4).

  Initialised N(0, 1/L) (LeCun normal with the length as fan-in), as a Dense layer applied
  along the length would be: a projected key (E K)_i = Σ_j E_ij k_j then has the variance of
  one key, so the scores start at the scale of exact attention's. The JL scale N(0, 1/k) of
  the paper's Theorem 1 would multiply the projected keys, and so the scores, by √(L/k).

  Attributes:
    max_length: L, the longest input.
    k: the projected length.
    share_kv: F = E.
  """
  max_length: int
  k: int
  share_kv: bool = False

  @nn.compact
  def __call__(self):
    init = nn.initializers.lecun_normal(in_axis=-1, out_axis=-2)
    proj_e_KxL = self.param('proj_e', init, (self.k, self.max_length))
    if self.share_kv:
      return proj_e_KxL, proj_e_KxL
    return proj_e_KxL, self.param('proj_f', init, (self.k, self.max_length))
