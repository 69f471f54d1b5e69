"""Attention of a decoder state over encoder states (Bahdanau et al. 2015; Luong et al. 2015).

At decoder step t, with the previous decoder state s_{t−1} and encoder states
h_1 … h_S (positions where `mask` is false are padding):

  e_{t,i} = score(s_{t−1}, h_i)
  α_{t,i} = exp(e_{t,i}) / Σ_{j valid} exp(e_{t,j})    (α_{t,i} = 0 at padding)
  c_t = Σ_i α_{t,i} h_i                                 (the context vector)

with the scores
  'dot'       e = s_{t−1}ᵀ h_i                          (Luong et al. 2015, "dot")
  'additive'  e = vᵀ tanh(W s_{t−1} + U h_i)            (Bahdanau et al. 2015, eq. 6 and App. A.1.2)

A row with no valid position gets α = 0 and c = 0, never NaN.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

SCORES = ('dot', 'additive')


def masked_softmax(scores_BxS: jnp.ndarray, mask_BxS: jnp.ndarray | None) -> jnp.ndarray:
  """softmax over the valid positions of each row, 0 at masked ones (all 0 if none is valid)."""
  scores_BxS = scores_BxS.astype(jnp.float32)
  if mask_BxS is None:
    return nn.softmax(scores_BxS, axis=-1)
  mask_BxS = jnp.asarray(mask_BxS, bool)
  scores_BxS = jnp.where(mask_BxS, scores_BxS, -jnp.inf)
  # The row maximum over valid positions keeps exp() in range; an empty row uses 0.
  max_Bx1 = jnp.max(scores_BxS, axis=-1, keepdims=True)
  max_Bx1 = jnp.where(jnp.isfinite(max_Bx1), max_Bx1, 0.0)
  exp_BxS = jnp.where(mask_BxS, jnp.exp(scores_BxS - max_Bx1), 0.0)
  total_Bx1 = jnp.sum(exp_BxS, axis=-1, keepdims=True)
  return exp_BxS / jnp.where(total_Bx1 > 0, total_Bx1, 1.0)


class EncoderAttention(nn.Module):
  """(s_{t−1} [B, D], h [B, S, H], mask [B, S]) → (context c_t [B, H], weights α_t [B, S]).

  Attributes:
    score: 'dot' (needs D = H) or 'additive'.
    features: width of the additive score's hidden layer (W, U: → features; v: features → 1).
    dtype: compute dtype; the weights are float32.
  """
  score: str = 'additive'
  features: int = 128
  dtype: Any = jnp.float32

  def __post_init__(self):
    if self.score not in SCORES:
      raise ValueError(f'Attention score {self.score!r} is unknown; allowed: {", ".join(SCORES)}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, query_BxD, keys_BxSxH, mask_BxS=None):
    if self.score == 'dot':
      if query_BxD.shape[-1] != keys_BxSxH.shape[-1]:
        raise ValueError(f'Dot-product attention needs the decoder state ({query_BxD.shape[-1]}) '
                         f'and the encoder states ({keys_BxSxH.shape[-1]}) to have one width.')
      scores_BxS = jnp.einsum('bd,bsd->bs', query_BxD.astype(self.dtype),
                              keys_BxSxH.astype(self.dtype))
    else:
      dense = lambda name, bias: nn.Dense(self.features, use_bias=bias, dtype=self.dtype,
                                          param_dtype=jnp.float32, name=name)
      # U h_i does not depend on the decoder step; inside a scan over steps XLA
      # hoists it out of the loop (loop-invariant code motion).
      hidden_BxSxA = jnp.tanh(dense('query', True)(query_BxD)[:, None, :]
                              + dense('key', False)(keys_BxSxH))
      scores_BxS = nn.Dense(1, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32,
                            name='energy')(hidden_BxSxA)[..., 0]
    weights_BxS = masked_softmax(scores_BxS, mask_BxS)
    context_BxH = jnp.einsum('bs,bsh->bh', weights_BxS.astype(self.dtype),
                             keys_BxSxH.astype(self.dtype))
    return context_BxH, weights_BxS
