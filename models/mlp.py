"""Multi-layer perceptron: x(l) = φ(W(l)ᵀ x(l−1) + b(l)), the last layer linear (logits)."""

import numbers
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models import activations
from models import layers


class MLP(nn.Module):
  """Fully connected network; the last layer is linear (logits).

  A hidden layer is Dense → normalisation (optional) → φ → dropout (optional).
  The parameters are always named `Dense_0 … Dense_L` (plus `BatchNorm_l` or
  `LayerNorm_l`), whatever the options, so `models.backprop` can read them (given
  the same `activation` and `residual`, which the names do not record).

  Attributes:
    features: widths of every layer, the last one being the output size.
    activation: an elementwise φ, by name ('relu', 'leaky_relu(0.2)', 'elu(0.5)', …: see
      `models.activations.get`) or as a callable; or 'maxout(k)': every hidden unit the
      largest of k affine pieces (Goodfellow et al. 2013, `models.layers.Maxout`), its
      `Dense_l` then `width · k` wide, unit j owning columns j·k … j·k + k − 1, and a
      normalisation applied to the pieces.
    dropout_rate: inverted dropout after every hidden activation.
    batch_norm: batch normalisation before every hidden activation.
    batch_norm_axis_name: mapped axis over which batch statistics are averaged
      (set by the train library under shard_map/pmap, `None` under jit).
    layer_norm: layer normalisation over the features before every hidden
      activation (exclusive with `batch_norm`).
    residual: wrap every hidden layer whose input and output widths agree in a
      skip connection, x + layer(x).
    dtype: the compute dtype (e.g. bfloat16); parameters stay float32.
  """
  features: Sequence[int]
  activation: str | Callable = 'relu'
  dropout_rate: float = 0.0
  batch_norm: bool = False
  batch_norm_axis_name: str | None = None
  layer_norm: bool = False
  residual: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxD: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    if isinstance(self.features, str) or not isinstance(self.features, Sequence):
      raise ValueError(f'MLP features must be a sequence of layer widths, the last one the output '
                       f'width, got {self.features!r}.')
    if not self.features:
      raise ValueError('MLP features must name at least the output width, got an empty sequence.')
    # numbers.Integral takes NumPy integers (a width from np.arange) too, but not True or False.
    if not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w > 0
               for w in self.features):
      raise ValueError(f'MLP features must be positive integers, got {tuple(self.features)}.')
    if not (isinstance(self.dropout_rate, numbers.Real) and 0 <= self.dropout_rate < 1):
      raise ValueError(f'MLP dropout_rate must lie in [0, 1), got {self.dropout_rate!r}.')
    if self.batch_norm and self.layer_norm:
      raise ValueError('MLP takes batch_norm or layer_norm, not both.')
    pieces = activations.maxout_pieces(self.activation)
    if pieces is None:
      phi = activations.get(self.activation)
    else:
      phi = lambda z: z.reshape(*z.shape[:-1], -1, pieces).max(axis=-1)
    x = x_BxD.reshape(x_BxD.shape[0], -1)
    layers.check_input_width(self, 'Dense_0', x.shape[-1], 'MLP', 'features (after flattening)')
    for width in self.features[:-1]:
      # The submodules are created here, in the MLP's scope, so that wrapping
      # the layer in a Residual does not move their parameters.
      # A bias before batch norm is cancelled by its mean subtraction.
      dense = nn.Dense(width * (pieces or 1), use_bias=not self.batch_norm, dtype=self.dtype)
      if self.batch_norm:
        norm = nn.BatchNorm(use_running_average=not train, axis_name=self.batch_norm_axis_name,
                            dtype=self.dtype)
      elif self.layer_norm:
        norm = nn.LayerNorm(dtype=self.dtype)
      else:
        norm = None
      dropout = nn.Dropout(self.dropout_rate, deterministic=not train) if self.dropout_rate > 0 else None

      def hidden(h, dense=dense, norm=norm, dropout=dropout):
        h = dense(h)
        if norm is not None:
          h = norm(h)
        h = phi(h)
        return dropout(h) if dropout is not None else h

      if self.residual and x.shape[-1] == width:
        x = layers.Residual(hidden)(x)
      else:
        x = hidden(x)
    return nn.Dense(self.features[-1], dtype=self.dtype)(x)
