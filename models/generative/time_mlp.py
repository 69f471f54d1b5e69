"""A time-conditioned MLP for low-dimensional data: the noise or score network of the 2-D
diffusion experiments (the toy networks of Song & Ermon 2019 and Song et al. 2021 are alike).

  e = PE(s·t)                                        sinusoidal embedding (Vaswani et al. 2017)
  h⁰ = x;  hˡ = SiLU(Dense(hˡ⁻¹) + Dense(e)),  l = 1 … L
  out = Dense(h^L)                                   the shape of x

t is a step (ddpm, d3pm) or a time in [0, 1] (score SDEs, with `time_scale` s = 1,000) or a
noise level; the network sees it only through the embedding.
"""

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.generative.unet import sinusoidal_embedding


class TimeMLP(nn.Module):
  """`model(x [B, D], t [B]) → [B, D]` (`out_features` to change the output width).

  Attributes:
    hidden: the widths of the L ≥ 1 hidden layers, each of which adds Dense(e): t reaches
      the output through them only.
    embed_dim: the width of PE, an even number (sines and cosines).
    time_scale: s, the factor on t before the embedding.
    out_features: the output width (None: D).
    dtype: compute dtype; parameters are float32.
  """
  hidden: Sequence[int] = (128, 128, 128)
  embed_dim: int = 32
  time_scale: float = 1.0
  out_features: int | None = None
  dtype: Any = jnp.float32

  def __post_init__(self):
    if not self.hidden or not all(isinstance(w, int) and w > 0 for w in self.hidden):
      raise ValueError(f'TimeMLP hidden must be a non-empty sequence of positive integers (t '
                       f'enters through the hidden layers), got {self.hidden!r}.')
    if not isinstance(self.embed_dim, int) or self.embed_dim < 2 or self.embed_dim % 2:
      raise ValueError(f'TimeMLP embed_dim must be a positive even integer (sines and cosines), '
                       f'got {self.embed_dim!r}.')
    if self.out_features is not None and (not isinstance(self.out_features, int)
                                          or self.out_features < 1):
      raise ValueError(f'TimeMLP out_features must be None or a positive integer, '
                       f'got {self.out_features!r}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxD: jax.Array, t_B: jax.Array, *, train: bool = False) -> jax.Array:
    del train
    if x_BxD.ndim != 2:
      raise ValueError(f'TimeMLP takes points [B, D], got shape {tuple(x_BxD.shape)}.')
    if jnp.shape(t_B) not in ((), x_BxD.shape[:1]):
      raise ValueError(f'TimeMLP times of shape {jnp.shape(t_B)} must be one time () or one per '
                       f'point [B] = ({x_BxD.shape[0]},).')
    layers.check_input_width(self, 'Dense_0', x_BxD.shape[-1], 'TimeMLP', 'features')
    t_B = jnp.broadcast_to(jnp.asarray(t_B, jnp.float32), x_BxD.shape[:1])
    e_BxE = sinusoidal_embedding(t_B * self.time_scale, self.embed_dim).astype(self.dtype)
    h = x_BxD.astype(self.dtype)
    for width in self.hidden:
      h = nn.silu(nn.Dense(width, dtype=self.dtype)(h) + nn.Dense(width, dtype=self.dtype)(e_BxE))
    return nn.Dense(self.out_features or x_BxD.shape[-1], dtype=self.dtype)(h)
