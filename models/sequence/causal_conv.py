"""Causal dilated convolutions and a WaveNet-style language model.

van den Oord et al. 2016, "WaveNet: A Generative Model for Raw Audio"
(arXiv:1609.03499), applied to token sequences.
"""

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp


class CausalConv1D(nn.Module):
  """Causal dilated 1-D convolution (van den Oord et al. 2016, "WaveNet", §2.1):

    y_t = Σ_{j=0}^{k−1} W_j x_{t−j·d} + b,   with x_s = 0 for s < 0,

  so y_t sees only x_{≤t}. The input is left-padded with (k−1)·d zeros and fed
  to `nn.Conv` with 'VALID' padding and kernel dilation d. Flax stores the
  kernel as [k, C_in, features] and computes a cross-correlation, so kernel tap
  i multiplies x_{t−(k−1−i)·d}: W_j = kernel[k−1−j], the last tap sees x_t.

  Decoding follows the flax lm1b cache protocol. With `decode=True`, the first
  call (inside `model.init`, when the 'cache' collection is still empty)
  creates a zero buffer of the last (k−1)·d inputs and computes on the full
  input. Later calls take the next S ≥ 1 inputs x_BxSxC, put the buffer where
  the zero padding would go and keep the last (k−1)·d inputs as the new buffer;
  apply them with `mutable=['cache']`.

  Attributes:
    features: output channels.
    kernel_size: number k of taps.
    dilation: spacing d between taps.
    dtype: compute dtype (a dtype or its name); parameters stay float32.
    use_bias: add the bias b.
  """
  features: int
  kernel_size: int
  dilation: int = 1
  dtype: Any = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxTxC: jnp.ndarray, *, decode: bool = False) -> jnp.ndarray:
    for option in ('features', 'kernel_size', 'dilation'):
      if getattr(self, option) < 1:
        raise ValueError(f'CausalConv1D {option} must be a positive integer, got {getattr(self, option)}.')
    context = (self.kernel_size - 1) * self.dilation
    batch, steps, channels = x_BxTxC.shape
    if decode:
      is_initialized = self.has_variable('cache', 'inputs')
      cache = self.variable('cache', 'inputs', jnp.zeros, (batch, context, channels), x_BxTxC.dtype)
    if decode and is_initialized:
      x_BxPTxC = jnp.concatenate([cache.value, x_BxTxC], axis=1)
      # Slicing from `steps` rather than from −context keeps this right for k = 1.
      cache.value = x_BxPTxC[:, steps:]
    else:
      x_BxPTxC = jnp.pad(x_BxTxC, ((0, 0), (context, 0), (0, 0)))
    conv = nn.Conv(self.features, (self.kernel_size,), padding='VALID', kernel_dilation=self.dilation,
                   use_bias=self.use_bias, dtype=self.dtype, param_dtype=jnp.float32)
    return conv(x_BxPTxC)


class CausalConvLM(nn.Module):
  """WaveNet (van den Oord et al. 2016) over tokens x_1 … x_T.

  With C channels and residual blocks l = 1 … L (the dilations, repeated
  `num_stacks` times):

    h⁰_t = E[x_t]                                       (token embedding)
    [f^l, g^l] = W^l ∗_{d_l} h^{l−1}                     (causal dilated conv, 2C outputs)
    z^l = tanh(f^l) ⊙ σ(g^l)                             (gated activation, eq. 2)
    s^l = V^l z^l,   h^l = h^{l−1} + s^l                 (1×1 conv; residual, §2.4)
    logits_t = W_out ReLU(W_1 ReLU(Σ_l s^l_t) + b_1) + b_out   (skip connections, Fig. 4)

  logits_t depends on x_{t−R+1} … x_t only, with receptive field
  R = num_stacks · Σ_l (k−1)·d_l + 1, so it parameterises p(x_{t+1} | x_{≤t})
  once the targets are shifted by one.

  Attributes:
    vocab_size: number V of tokens.
    channels: width C of the residual stream.
    kernel_size: taps k of every dilated convolution.
    dilations: d_l of the blocks of one stack.
    num_stacks: how often the dilation pattern repeats.
    dropout_rate: inverted dropout on the gated activation z^l during training.
    dtype: compute dtype (a dtype or its name, e.g. 'bfloat16'); parameters and
      logits are float32.
  """
  vocab_size: int
  channels: int = 128
  kernel_size: int = 2
  dilations: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)
  num_stacks: int = 1
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def __post_init__(self):
    # Checked at construction, so a bad config fails before any tracing.
    for option in ('vocab_size', 'channels', 'kernel_size', 'num_stacks'):
      value = getattr(self, option)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'CausalConvLM {option} must be a positive integer, got {value!r}.')
    if not self.dilations or not all(isinstance(d, int) and d >= 1 for d in self.dilations):
      raise ValueError(f'CausalConvLM dilations must be a non-empty sequence of positive integers, '
                       f'got {self.dilations!r}.')
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'CausalConvLM dropout_rate must lie in [0, 1), got {self.dropout_rate}.')
    super().__post_init__()

  @property
  def receptive_field(self) -> int:
    """R = num_stacks · Σ_l (k−1)·d_l + 1 tokens."""
    return self.num_stacks * sum((self.kernel_size - 1) * d for d in self.dilations) + 1

  @nn.compact
  def __call__(self, tokens_BxT: jnp.ndarray, *, train: bool = False, decode: bool = False) -> jnp.ndarray:
    # A 1×1 convolution is a Dense layer over the channel axis. Flax layers take a dtype
    # or its name ('bfloat16'), so `dtype` passes through; registry.build checks a config's.
    dense = lambda features: nn.Dense(features, dtype=self.dtype, param_dtype=jnp.float32)
    h_BxTxC = nn.Embed(self.vocab_size, self.channels, dtype=self.dtype, param_dtype=jnp.float32)(tokens_BxT)
    skip_BxTxC = jnp.zeros_like(h_BxTxC)
    for dilation in tuple(self.dilations) * self.num_stacks:
      conv = CausalConv1D(2 * self.channels, self.kernel_size, dilation, dtype=self.dtype)
      fg_BxTx2C = conv(h_BxTxC, decode=decode)
      f_BxTxC, g_BxTxC = jnp.split(fg_BxTx2C, 2, axis=-1)
      z_BxTxC = jnp.tanh(f_BxTxC) * nn.sigmoid(g_BxTxC)
      if self.dropout_rate > 0:
        z_BxTxC = nn.Dropout(self.dropout_rate, deterministic=not train)(z_BxTxC)
      s_BxTxC = dense(self.channels)(z_BxTxC)
      h_BxTxC = h_BxTxC + s_BxTxC
      skip_BxTxC = skip_BxTxC + s_BxTxC
    out_BxTxC = nn.relu(dense(self.channels)(nn.relu(skip_BxTxC)))
    return dense(self.vocab_size)(out_BxTxC).astype(jnp.float32)
