"""LeNet-5, LeCun, Bottou, Bengio & Haffner 1998, "Gradient-Based Learning Applied to
Document Recognition" (Proc. IEEE 86(11)), §II.B and Fig. 2."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models import layers
from models.vision import pooling

ACTIVATIONS = {'tanh': jnp.tanh, 'relu': nn.relu}


class LeNet5(nn.Module):
  """LeNet-5 (LeCun et al. 1998, Fig. 2) on images x_BxHxWxC, channels last.

  On a 32×32 input, with φ the activation and every convolution 'VALID':

    C1 = φ(conv5×5(x) → 6 maps)          28×28×6
    S2 = avgpool2×2(C1)                   14×14×6
    C3 = φ(conv5×5(S2) → 16 maps)         10×10×16
    S4 = avgpool2×2(C3)                    5×5×16
    C5 = φ(conv5×5(S4) → 120 maps)         1×1×120   (fully connected to S4)
    F6 = φ(W₆ C5 + b₆)                    84
    logits = W₇ F6 + b₇                   num_classes

  which has 61,706 parameters for 1 input channel and 10 classes. Three
  simplifications, all standard today: C3 connects to all six S2 maps (the paper
  uses the sparse table I, 1,516 weights instead of 2,416); S2 and S4 are plain
  averages (the paper scales the sum by a trained coefficient, adds a trained bias
  and applies a sigmoid); the output layer is linear (the paper uses Euclidean RBF
  units). The paper's squashing function is the scaled 1.7159·tanh(2a/3); 'tanh'
  here is the plain tanh.

  Attributes:
    num_classes: number K of logits.
    activation: φ, 'tanh' (as the paper) or 'relu'.
    padding: zeros added on every side of the image before C1; 2 makes a 28×28
      image (MNIST) behave as the paper's 32×32 one. After padding the image must
      be 32×32, so that C5 sees a 5×5 map.
    dtype: compute dtype (a dtype or its name); parameters and logits are float32.
  """
  num_classes: int
  activation: str = 'tanh'
  padding: int = 0
  dtype: Any = jnp.float32

  def __post_init__(self):
    if not isinstance(self.num_classes, int) or self.num_classes < 1:
      raise ValueError(f'LeNet5 num_classes must be a positive integer, got {self.num_classes!r}.')
    if self.activation not in ACTIVATIONS:
      raise ValueError(f'LeNet5 activation must be one of {", ".join(ACTIVATIONS)}, got {self.activation!r}.')
    if not isinstance(self.padding, int) or self.padding < 0:
      raise ValueError(f'LeNet5 padding must be a non-negative integer, got {self.padding!r}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxHxWxC: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    del train  # No dropout or batch statistics.
    if x_BxHxWxC.ndim != 4:
      raise ValueError(f'LeNet5 needs images of shape (B, H, W, C), got shape {x_BxHxWxC.shape}.')
    p = self.padding
    x_BxHxWxC = jnp.pad(x_BxHxWxC, ((0, 0), (p, p), (p, p), (0, 0)))
    if x_BxHxWxC.shape[1:3] != (32, 32):
      raise ValueError(f'LeNet5 needs 32×32 images after padding by {p}, got '
                       f'{x_BxHxWxC.shape[1]}×{x_BxHxWxC.shape[2]}; set padding=2 for 28×28 images.')
    layers.check_input_width(self, 'Conv_0', x_BxHxWxC.shape[-1], 'LeNet5')
    phi = ACTIVATIONS[self.activation]
    conv = lambda features: nn.Conv(features, (5, 5), padding='VALID', dtype=self.dtype,
                                    param_dtype=jnp.float32)
    pool = lambda h: pooling.avg_pool(h, (2, 2), strides=(2, 2))
    c1_Bx28x28x6 = phi(conv(6)(x_BxHxWxC))
    s2_Bx14x14x6 = pool(c1_Bx28x28x6)
    c3_Bx10x10x16 = phi(conv(16)(s2_Bx14x14x6))
    s4_Bx5x5x16 = pool(c3_Bx10x10x16)
    c5_Bx120 = phi(conv(120)(s4_Bx5x5x16)).reshape(x_BxHxWxC.shape[0], 120)
    f6_Bx84 = phi(nn.Dense(84, dtype=self.dtype, param_dtype=jnp.float32)(c5_Bx120))
    logits_BxK = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32)(f6_Bx84)
    return logits_BxK.astype(jnp.float32)
