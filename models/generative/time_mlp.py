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

from models.generative.unet import sinusoidal_embedding


class TimeMLP(nn.Module):
  """`model(x [B, D], t [B]) → [B, D]` (`out_features` to change the output width)."""
  hidden: Sequence[int] = (128, 128, 128)
  embed_dim: int = 32
  time_scale: float = 1.0
  out_features: int | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxD: jax.Array, t_B: jax.Array, *, train: bool = False) -> jax.Array:
    del train
    if x_BxD.ndim != 2:
      raise ValueError(f'TimeMLP takes points [B, D], got shape {tuple(x_BxD.shape)}.')
    t_B = jnp.broadcast_to(jnp.asarray(t_B, jnp.float32), x_BxD.shape[:1])
    e_BxE = sinusoidal_embedding(t_B * self.time_scale, self.embed_dim).astype(self.dtype)
    h = x_BxD.astype(self.dtype)
    for width in self.hidden:
      h = nn.silu(nn.Dense(width, dtype=self.dtype)(h) + nn.Dense(width, dtype=self.dtype)(e_BxE))
    return nn.Dense(self.out_features or x_BxD.shape[-1], dtype=self.dtype)(h)
