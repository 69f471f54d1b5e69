"""Multi-layer perceptron in the notation of seed 001: x(l) = φ(W(l)ᵀ x(l-1) + b(l))."""

from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models import activations


class MLP(nn.Module):
  """Fully connected network; the last layer is linear (logits).

  Attributes:
    features: widths of every layer, the last one being the output size.
    activation: name in `models.activations.ACTIVATIONS` or a callable φ.
    dropout_rate: inverted dropout after every hidden activation.
    batch_norm: batch normalisation before every hidden activation.
    batch_norm_axis_name: mapped axis over which batch statistics are averaged
      (set by the train library under shard_map/pmap, `None` under jit).
  """
  features: Sequence[int]
  activation: str | Callable = 'relu'
  dropout_rate: float = 0.0
  batch_norm: bool = False
  batch_norm_axis_name: str | None = None

  @nn.compact
  def __call__(self, x_BxD: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    phi = activations.get(self.activation)
    x = x_BxD.reshape(x_BxD.shape[0], -1)
    for width in self.features[:-1]:
      x = nn.Dense(width)(x)
      if self.batch_norm:
        x = nn.BatchNorm(use_running_average=not train, axis_name=self.batch_norm_axis_name)(x)
      x = phi(x)
      if self.dropout_rate > 0:
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.features[-1])(x)
