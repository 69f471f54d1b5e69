"""Causal convolutional forecasters of a real-valued series, naive baselines, and
autoregressive multi-step forecasts.

The networks are WaveNet's gated residual stacks of dilated causal convolutions
(van den Oord et al. 2016, "WaveNet: A Generative Model for Raw Audio",
arXiv:1609.03499) over real values instead of tokens, used as forecasters the way
temporal convolutional networks are (Bai, Kolter & Koltun 2018, "An Empirical
Evaluation of Generic Convolutional and Recurrent Networks for Sequence
Modeling", arXiv:1803.01271): the feature at time t sees x_{≤t} only.

Two heads:
  `PooledConvForecaster`   features pooled over the window → Dense → the next H
                           values (a direct multi-horizon forecast);
  `ShiftedConvForecaster`  Dense at every position → the next value, trained on
                           targets shifted by one like a language model.

Both read the series in the scaled unit (`data.series`) and, with
`predict_change` (the default), read first differences and predict the change
from the last value (see `_difference_inputs`), so a forecast moves with the
level of its history: the rising CO2 of the test years is no harder than that
of the training years.

Every model has `next_value(x_BxT) → [B, T]`, position t's forecast of x_{t+1}
from x_{≤t}; `forecast` feeds it its own predictions to forecast many steps.
"""

import functools
import numbers
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.sequence.causal_conv import CausalConv1D

POOLINGS = ('mean', 'max', 'last')


def _check_stack_options(name: str, module) -> None:
  for option in ('channels', 'kernel_size', 'num_stacks'):
    value = getattr(module, option)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f'{name} {option} must be a positive integer, got {value!r}.')
  if not module.dilations or not all(isinstance(d, int) and d >= 1 for d in module.dilations):
    raise ValueError(f'{name} dilations must be a non-empty sequence of positive integers, '
                     f'got {module.dilations!r}.')
  if not 0 <= module.dropout_rate < 1:
    raise ValueError(f'{name} dropout_rate must lie in [0, 1), got {module.dropout_rate!r}.')


class CausalConvStack(nn.Module):
  """WaveNet's residual stack (van den Oord et al. 2016, §2.3–2.4, Fig. 4) over real inputs.

  With C channels and blocks l = 1 … L (the dilations, repeated `num_stacks` times):

    h⁰_t = W_in u_t + b_in                               (1×1 convolution of the F inputs)
    [f^l, g^l] = W^l ∗_{d_l} h^{l−1}                     (causal dilated conv, 2C outputs)
    z^l = tanh(f^l) ⊙ σ(g^l)                             (gated activation, eq. 2)
    s^l = V^l z^l,   h^l = h^{l−1} + s^l                 (1×1 conv; residual)
    e_t = ReLU(W_1 ReLU(Σ_l s^l_t) + b_1)                (skip connections)

  e_t depends on u_{t−R+1} … u_t only, R = num_stacks · Σ_l (k−1)·d_l + 1.
  """
  channels: int
  kernel_size: int
  dilations: Sequence[int]
  num_stacks: int = 1
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, u_BxTxF: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    dense = lambda features: nn.Dense(features, dtype=self.dtype, param_dtype=jnp.float32)
    h_BxTxC = dense(self.channels)(u_BxTxF)
    skip_BxTxC = jnp.zeros_like(h_BxTxC)
    for dilation in tuple(self.dilations) * self.num_stacks:
      conv = CausalConv1D(2 * self.channels, self.kernel_size, dilation, dtype=self.dtype)
      f_BxTxC, g_BxTxC = jnp.split(conv(h_BxTxC), 2, axis=-1)
      z_BxTxC = jnp.tanh(f_BxTxC) * nn.sigmoid(g_BxTxC)
      if self.dropout_rate > 0:
        z_BxTxC = nn.Dropout(self.dropout_rate, deterministic=not train)(z_BxTxC)
      s_BxTxC = dense(self.channels)(z_BxTxC)
      h_BxTxC = h_BxTxC + s_BxTxC
      skip_BxTxC = skip_BxTxC + s_BxTxC
    return nn.relu(dense(self.channels)(nn.relu(skip_BxTxC)))


def _difference_inputs(x_BxT: jnp.ndarray, predict_change: bool) -> jnp.ndarray:
  """The stack's input u_BxTx1: Δx_t = x_t − x_{t−1} (Δx_0 = 0) with `predict_change`, else x_t.

  Δx_t uses x_t and x_{t−1} only, so the stack stays causal, and adding a
  constant to the whole history leaves it unchanged.
  """
  x_BxT = jnp.asarray(x_BxT, jnp.float32)
  if not predict_change:
    return x_BxT[..., None]
  delta_BxT = jnp.concatenate([jnp.zeros_like(x_BxT[:, :1]), jnp.diff(x_BxT, axis=1)], axis=1)
  return delta_BxT[..., None]


class PooledConvForecaster(nn.Module):
  """Direct multi-horizon forecaster: causal conv features pooled over time, then Dense.

  For a window x_1 … x_T (its last value at the forecast origin T) and the
  stack's features e_t (`CausalConvStack`, WaveNet blocks as in a TCN, Bai et
  al. 2018 §3):

    p = pool(e_1, …, e_T)                    (mean, max, or the last e_T)
    ŷ_{T+h} = x_T + (W p + b)_h              (h = 1 … H; with predict_change)
    ŷ_{T+h} = (W p + b)_h                    (without)

  `per_position(x_BxT)` gives the same forecast from every origin t ≤ T with
  the pooling over e_1 … e_t only (running mean or maximum), so position t
  depends on x_{≤t} only and its last position is `__call__`'s forecast.

  Attributes:
    horizon: H, values forecast from the origin (the data's horizon when a
      config leaves it out).
    channels, kernel_size, dilations, num_stacks, dropout_rate: the stack's.
    pooling: 'mean', 'max' or 'last'.
    predict_change: read first differences and forecast the change from the
      last value (see the module docstring).
    dtype: compute dtype (a dtype or its name); parameters and outputs are float32.
  """
  horizon: int = 1
  channels: int = 32
  kernel_size: int = 2
  dilations: Sequence[int] = (1, 2, 4, 8, 16)
  num_stacks: int = 1
  pooling: str = 'mean'
  predict_change: bool = True
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def __post_init__(self):
    # Checked at construction, so a bad config fails before any tracing.
    if not isinstance(self.horizon, int) or isinstance(self.horizon, bool) or self.horizon < 1:
      raise ValueError(f'PooledConvForecaster horizon must be a positive integer, got '
                       f'{self.horizon!r}.')
    _check_stack_options('PooledConvForecaster', self)
    if self.pooling not in POOLINGS:
      raise ValueError(f'PooledConvForecaster pooling must be one of {", ".join(POOLINGS)}, got '
                       f'{self.pooling!r}.')
    super().__post_init__()

  def setup(self):
    self.stack = CausalConvStack(self.channels, self.kernel_size, tuple(self.dilations),
                                 self.num_stacks, self.dropout_rate, self.dtype)
    self.head = nn.Dense(self.horizon, dtype=self.dtype, param_dtype=jnp.float32)

  def _output(self, x_BxT, pooled):
    """Head on pooled features [B, C] (or [B, T, C]); adds x_T (or every x_t) back."""
    change = self.head(pooled).astype(jnp.float32)
    if not self.predict_change:
      return change
    last = jnp.asarray(x_BxT, jnp.float32)
    return change + (last[:, -1, None] if change.ndim == 2 else last[..., None])

  def __call__(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    """The forecast ŷ_BxH of the H values after each window."""
    e_BxTxC = self.stack(_difference_inputs(x_BxT, self.predict_change), train=train)
    if self.pooling == 'mean':
      p_BxC = jnp.mean(e_BxTxC, axis=1)
    elif self.pooling == 'max':
      p_BxC = jnp.max(e_BxTxC, axis=1)
    else:
      p_BxC = e_BxTxC[:, -1]
    return self._output(x_BxT, p_BxC)

  def per_position(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    """ŷ_BxTxH: at every position t, the forecast of x_{t+1} … x_{t+H} from x_{≤t}."""
    e_BxTxC = self.stack(_difference_inputs(x_BxT, self.predict_change), train=train)
    if self.pooling == 'mean':
      count_T = jnp.arange(1, e_BxTxC.shape[1] + 1, dtype=e_BxTxC.dtype)
      p_BxTxC = jnp.cumsum(e_BxTxC, axis=1) / count_T[:, None]
    elif self.pooling == 'max':
      p_BxTxC = jax.lax.cummax(e_BxTxC, axis=1)
    else:
      p_BxTxC = e_BxTxC
    return self._output(x_BxT, p_BxTxC)

  def next_value(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    """ŷ_BxT: position t's forecast of x_{t+1} (the horizon-1 head of `per_position`)."""
    return self.per_position(x_BxT, train=train)[..., 0]


class ShiftedConvForecaster(nn.Module):
  """Next-value forecaster at every position, trained on targets shifted by one.

  A causal language model over real values: WaveNet blocks (van den Oord et al.
  2016) over x_1 … x_T, as in a TCN (Bai et al. 2018), and at every position t

    ŷ_{t+1} = x_t + w·e_t + b                (with predict_change)
    ŷ_{t+1} = w·e_t + b                      (without)

  so ŷ_{t+1} depends on x_{t−R} … x_t only (R = `receptive_field` of the stack,
  one more value for the difference). Trained with the squared error to
  x_{t+1} at every position; many steps ahead come from `forecast`.

  Attributes:
    channels, kernel_size, dilations, num_stacks, dropout_rate: the stack's.
    predict_change: read first differences and predict the change from x_t.
    dtype: compute dtype (a dtype or its name); parameters and outputs are float32.
  """
  channels: int = 32
  kernel_size: int = 2
  dilations: Sequence[int] = (1, 2, 4, 8, 16)
  num_stacks: int = 1
  predict_change: bool = True
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def __post_init__(self):
    _check_stack_options('ShiftedConvForecaster', self)
    super().__post_init__()

  @property
  def receptive_field(self) -> int:
    """R = num_stacks · Σ_l (k−1)·d_l + 1 inputs of the stack."""
    return self.num_stacks * sum((self.kernel_size - 1) * d for d in self.dilations) + 1

  def setup(self):
    self.stack = CausalConvStack(self.channels, self.kernel_size, tuple(self.dilations),
                                 self.num_stacks, self.dropout_rate, self.dtype)
    self.head = nn.Dense(1, dtype=self.dtype, param_dtype=jnp.float32)

  def __call__(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    """ŷ_BxT: position t's forecast of x_{t+1}."""
    e_BxTxC = self.stack(_difference_inputs(x_BxT, self.predict_change), train=train)
    y_BxT = self.head(e_BxTxC)[..., 0].astype(jnp.float32)
    return y_BxT + jnp.asarray(x_BxT, jnp.float32) if self.predict_change else y_BxT

  def next_value(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    """The same as `__call__`: position t's forecast of x_{t+1}."""
    return self(x_BxT, train=train)


def forecast(module, variables, history_BxT, num_steps: int, *, window: int | None = None):
  """ŷ_BxN: N = `num_steps` values after each history, each prediction fed back as input.

    x̂_{T+1} = f(x_1 … x_T),   x̂_{T+i} = f(x_1 … x_T, x̂_{T+1} … x̂_{T+i−1})   (i = 2 … N)

  where f is the model's `next_value` at its last position. With `window`, f
  reads only the last `window` values of that growing history (the window
  length a pooled model was trained on); without, all of it.

  One compiled `jax.lax.scan` of N model calls on a fixed buffer of T + N values
  (without `window`, the unwritten tail after the current position cannot
  change a causal model's output there). The module is a static argument, so
  it must be hashable (Flax modules with tuple attributes are).
  """
  if not isinstance(num_steps, numbers.Integral) or isinstance(num_steps, bool) or num_steps < 1:
    raise ValueError(f'num_steps must be an integer >= 1, got {num_steps!r}.')
  history_BxT = jnp.asarray(history_BxT, jnp.float32)
  if history_BxT.ndim != 2 or history_BxT.shape[1] < 1:
    raise ValueError(f'history must have shape [batch, length >= 1], got {history_BxT.shape}.')
  if window is not None and not (isinstance(window, numbers.Integral) and
                                 1 <= window <= history_BxT.shape[1]):
    raise ValueError(f'window must be None or an integer in [1, {history_BxT.shape[1]}] (the '
                     f'history length), got {window!r}.')
  try:
    hash(module)
  except TypeError:
    raise ValueError(f'module must be hashable to be a static jit argument (give its attributes '
                     f'as tuples, not lists), got {type(module).__name__}.') from None
  return _forecast(module, variables, history_BxT, num_steps=int(num_steps),
                   window=None if window is None else int(window))


@functools.partial(jax.jit, static_argnames=('module', 'num_steps', 'window'))
def _forecast(module, variables, history_BxT, *, num_steps, window):
  batch, length = history_BxT.shape
  buffer_BxL = jnp.concatenate([history_BxT, jnp.zeros((batch, num_steps), jnp.float32)], axis=1)
  variables = {name: tree for name, tree in variables.items() if name != 'cache'}

  def step(buffer_BxL, t):  # t: the position written at this step
    if window is None:
      inputs_BxW, read = buffer_BxL, t - 1
    else:
      inputs_BxW, read = jax.lax.dynamic_slice_in_dim(buffer_BxL, t - window, window, axis=1), -1
    y_BxW = module.apply(variables, inputs_BxW, train=False, method='next_value')
    y_B = y_BxW[:, read]
    return buffer_BxL.at[:, t].set(y_B), y_B

  _, y_NxB = jax.lax.scan(step, buffer_BxL, jnp.arange(length, length + num_steps))
  return y_NxB.T


def last_value_forecast(history_BxT, num_steps: int) -> np.ndarray:
  """The naive forecast: ŷ_{T+h} = x_T for h = 1 … N."""
  history_BxT = np.asarray(history_BxT)
  return np.repeat(history_BxT[:, -1:], num_steps, axis=1)


def seasonal_naive_forecast(history_BxT, num_steps: int, period: int = 12) -> np.ndarray:
  """The seasonal naive forecast: ŷ_{T+h} = x_{T+h−m·⌈h/m⌉}, the last observed value of the
  same season (m = `period`; for h ≤ m that is x_{T+h−m})."""
  if not isinstance(period, numbers.Integral) or isinstance(period, bool) or period < 1:
    raise ValueError(f'The seasonal naive forecast period must be a positive integer, got '
                     f'{period!r}.')
  history_BxT = np.asarray(history_BxT)
  length = history_BxT.shape[1]
  if length < period:
    raise ValueError(f'The seasonal naive forecast of period {period} needs at least {period} '
                     f'values of history, got {length}.')
  h_N = np.arange(1, num_steps + 1)
  source_N = length - 1 + h_N - period * (-(-h_N // period))
  return history_BxT[:, source_N]
