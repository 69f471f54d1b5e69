"""Recurrent cells and layers: Elman RNN, LSTM and GRU, run over time with `nn.scan`.

Cells map (carry, x_t) → (carry', y_t) and compute the equations below, with
x_t ∈ R^C, h_t ∈ R^H and σ the logistic sigmoid:

  Elman  h_t = tanh(W_xh x_t + W_hh h_{t−1} + b_h)                     (Elman 1990)
  LSTM   f_t = σ(W_f x_t + U_f h_{t−1} + b_f)     forget gate          (Hochreiter &
         i_t = σ(W_i x_t + U_i h_{t−1} + b_i)     input gate            Schmidhuber 1997;
         o_t = σ(W_o x_t + U_o h_{t−1} + b_o)     output gate           forget gate: Gers
         c_t = f_t ⊙ c_{t−1} + i_t ⊙ tanh(W_c x_t + U_c h_{t−1} + b_c)  et al. 2000)
         h_t = o_t ⊙ tanh(c_t)
  GRU    r_t = σ(W_r x_t + U_r h_{t−1} + b_r)     reset gate           (Cho et al. 2014)
         z_t = σ(W_z x_t + U_z h_{t−1} + b_z)     update gate
         h̃_t = tanh(W_h x_t + U_h (r_t ⊙ h_{t−1}) + b_h)
         h_t = z_t ⊙ h_{t−1} + (1 − z_t) ⊙ h̃_t

Flax's `nn.SimpleCell` and `nn.OptimizedLSTMCell` compute the Elman and LSTM
equations exactly (tests/models/test_rnn.py runs them against NumPy loops of
the equations above); their carries are h and (c, h). Flax's `nn.GRUCell`
does not: it applies the reset gate after the recurrent product,
h̃_t = tanh(W_h x_t + b_h + r_t ⊙ (U_h h_{t−1} + b_hn)) (the cuDNN form), so
`GRUCell` below implements Cho et al.'s form.

`Recurrent` runs one cell over a sequence, forwards or backwards, with
per-example lengths: steps at or past an example's length leave its carry
unchanged and output zeros, so whatever the padding holds changes nothing.
`RNN` stacks layers, optionally bidirectional, with dropout between layers.
Carries stay float32 whatever the compute `dtype` of the cells' matmuls.
"""

import numbers
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import recurrent as flax_recurrent

CELLS = ('elman', 'lstm', 'gru')


class GRUCell(nn.RNNCellBase):
  """GRU cell with the reset gate inside the recurrent product (Cho et al. 2014, eq. 5–8):

    r = σ(W_r x + U_r h + b_r),  z = σ(W_z x + U_z h + b_z),
    h̃ = tanh(W_h x + U_h (r ⊙ h) + b_h),  h' = z ⊙ h + (1 − z) ⊙ h̃.

  The three input projections are one [C, 3H] matmul ('input': W_r | W_z | W_h
  and their biases) and the two gate projections of h one [H, 2H] matmul
  ('gates': U_r | U_z); U_h ('candidate') multiplies r ⊙ h, so it is separate.
  """
  features: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.lecun_normal()
  recurrent_kernel_init: Any = nn.initializers.orthogonal()

  @nn.compact
  def __call__(self, h_BxH, x_BxC):
    dense = lambda features, name, use_bias, init: nn.Dense(
        features, use_bias=use_bias, kernel_init=init, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    features = self.features
    wx_Bx3H = dense(3 * features, 'input', True, self.kernel_init)(x_BxC)
    uh_Bx2H = dense(2 * features, 'gates', False, self.recurrent_kernel_init)(h_BxH)
    r_BxH = nn.sigmoid(wx_Bx3H[..., :features] + uh_Bx2H[..., :features])
    z_BxH = nn.sigmoid(wx_Bx3H[..., features:2 * features] + uh_Bx2H[..., features:])
    candidate_BxH = jnp.tanh(wx_Bx3H[..., 2 * features:] + dense(
        features, 'candidate', False, self.recurrent_kernel_init)(r_BxH * h_BxH))
    new_h_BxH = z_BxH * h_BxH + (1 - z_BxH) * candidate_BxH
    return new_h_BxH, new_h_BxH

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    del rng
    return jnp.zeros(tuple(input_shape[:-1]) + (self.features,), self.param_dtype)

  @property
  def num_feature_axes(self) -> int:
    return 1


def make_cell(kind: str, features: int, dtype: Any = jnp.float32, **kwargs) -> nn.RNNCellBase:
  """The cell `kind` ('elman', 'lstm' or 'gru') with `features` hidden units."""
  if kind == 'elman':
    return nn.SimpleCell(features, dtype=dtype, **kwargs)
  if kind == 'lstm':
    return nn.OptimizedLSTMCell(features, dtype=dtype, **kwargs)
  if kind == 'gru':
    return GRUCell(features, dtype=dtype, **kwargs)
  raise ValueError(f'Unknown recurrent cell {kind!r}; allowed: {", ".join(CELLS)}.')


def check_unroll(owner: str, unroll: int | bool) -> None:
  """One sentence for an `unroll` that `jax.lax.scan` does not take: it takes a bool (True
  unrolls every step) or an integer >= 0 (0 unrolls every step too)."""
  if not isinstance(unroll, numbers.Integral) or unroll < 0:
    raise ValueError(f'{owner} unroll must be a bool or an integer >= 0 (True or 0 unrolls every '
                     f'step), got {unroll!r}.')


def check_cell_options(owner: str, cell: str, features: int, num_layers: int = 1,
                       unroll: int | bool = 1) -> None:
  """One-sentence errors for the options every recurrent model shares."""
  if cell not in CELLS:
    raise ValueError(f'{owner} cell={cell!r} is not a recurrent cell; allowed: {", ".join(CELLS)}.')
  for name, value in (('features', features), ('num_layers', num_layers)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{owner} {name} must be a positive integer, got {value!r}.')
  check_unroll(owner, unroll)


def hidden_state(carry):
  """h_t of a carry: the carry itself (Elman, GRU) or its second part (LSTM's (c, h))."""
  return carry[1] if isinstance(carry, tuple) else carry


def _step(cell, carry, inputs):
  """One masked time step: carry and output only advance where `valid_B` is true."""
  x_BxC, valid_B = inputs
  new_carry, y_BxH = cell(carry, x_BxC)
  keep = lambda new, old: jnp.where(valid_B[:, None], new.astype(old.dtype), old)
  new_carry = jax.tree.map(keep, new_carry, carry)
  return new_carry, jnp.where(valid_B[:, None], y_BxH, jnp.zeros_like(y_BxH))


class Recurrent(nn.Module):
  """One cell over time: (x_BxTxC, lengths_B, initial carry) → (outputs_BxTxH, final carry).

  Forwards, y_t and the carry follow the cell for t < length and stop there:
  the final carry is the one after step length − 1 and y_t = 0 for t ≥ length.
  With `reverse`, each example's first `length` steps are read last to first
  (padding stays at the end, as in `flax.linen.recurrent.flip_sequences`) and
  the outputs are put back in input order, so y_t summarises x_t … x_{length−1}.
  Lengths are clipped to [0, T]: a length ≥ T reads every step in both directions.

  With `decode=True` the carry is kept in the 'cache' collection between calls
  (created at `init`), so a generator can feed one step at a time
  (see train/sampling.py); apply with `mutable=['cache']`.

  Attributes:
    cell: 'elman', 'lstm' or 'gru'.
    features: hidden size H.
    reverse: read the sequence backwards.
    unroll: time steps per iteration of the compiled loop (`nn.scan`'s unroll: an integer >= 0
      or a bool; 0 or True unrolls every step).
    dtype: compute dtype of the matmuls; carries stay float32.
  """
  cell: str
  features: int
  reverse: bool = False
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_unroll('Recurrent', self.unroll)
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxTxC, lengths_B=None, initial_carry=None, *, decode: bool = False):
    if jnp.ndim(x_BxTxC) != 3:
      raise ValueError(f'A recurrent layer reads inputs of shape [B, T, C], got shape '
                       f'{jnp.shape(x_BxTxC)}.')
    batch, steps = x_BxTxC.shape[:2]
    if lengths_B is not None and jnp.shape(lengths_B) != (batch,):
      raise ValueError(f'Sequence lengths of shape {jnp.shape(lengths_B)} must be [B] = '
                       f'({batch},), one per sequence of the batch.')
    cell = make_cell(self.cell, self.features, self.dtype)
    if initial_carry is None:
      initial_carry = cell.initialize_carry(jax.random.PRNGKey(0), (batch, x_BxTxC.shape[-1]))
    initial_carry = jax.tree.map(lambda c: jnp.asarray(c, jnp.float32), initial_carry)
    if decode:
      if self.reverse:
        raise ValueError('A reverse recurrent layer cannot decode one step at a time.')
      is_initialized = self.has_variable('cache', 'carry')
      cache = self.variable('cache', 'carry', lambda: initial_carry)
      if is_initialized:
        initial_carry = cache.value
    if lengths_B is not None:
      # A length past the last step means every step; unclipped, `flip_sequences` (which indexes
      # (t + length) mod T) would rotate the reversed input instead.
      lengths_B = jnp.clip(jnp.asarray(lengths_B), 0, steps)
    valid_BxT = jnp.ones((batch, steps), bool) if lengths_B is None else (
        jnp.arange(steps)[None, :] < jnp.asarray(lengths_B)[:, None])
    if self.reverse:
      x_BxTxC = flax_recurrent.flip_sequences(x_BxTxC, lengths_B, num_batch_dims=1,
                                              time_major=False)
    scan = nn.scan(_step, variable_broadcast='params', split_rngs={'params': False},
                   in_axes=1, out_axes=1, unroll=self.unroll)
    carry, y_BxTxH = scan(cell, initial_carry, (x_BxTxC, valid_BxT))
    if self.reverse:
      y_BxTxH = flax_recurrent.flip_sequences(y_BxTxH, lengths_B, num_batch_dims=1,
                                              time_major=False)
    if decode and is_initialized:
      cache.value = carry
    return y_BxTxH, carry


class RNN(nn.Module):
  """`num_layers` recurrent layers, each fed the previous one's outputs.

  Layer l reads y^{l−1} (y^0 = x); a bidirectional layer concatenates a
  forward and a backward `Recurrent` ([→h_t ; ←h_t], 2H features; Schuster &
  Paliwal 1997). Dropout (rate `dropout_rate`, training only) is applied to
  the inputs of layers 2 … L.

  Returns (outputs_BxTxH′, carries): the last layer's outputs and the final
  carry of every layer, a tuple over layers of (forward,) or (forward,
  backward) carries. `initial_carries`, in the same layout, starts each layer
  from a given carry (e.g. an encoder's, in a decoder); None starts from zeros.

  Attributes:
    cell, features, unroll, dtype: as in `Recurrent`.
    num_layers: stacked layers L.
    bidirectional: add a backward direction to every layer.
    dropout_rate: dropout between layers.
  """
  cell: str
  features: int
  num_layers: int = 1
  bidirectional: bool = False
  dropout_rate: float = 0.0
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_unroll('RNN', self.unroll)
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxTxC, lengths_B=None, initial_carries: Sequence | None = None, *,
               train: bool = False, decode: bool = False):
    if decode and self.bidirectional:  # the backward direction needs the whole sequence at once
      raise ValueError('A bidirectional RNN cannot decode one step at a time; use '
                       'bidirectional=False to decode.')
    y_BxTxH, carries = x_BxTxC, []
    for layer in range(self.num_layers):
      if layer > 0 and self.dropout_rate > 0:
        y_BxTxH = nn.Dropout(self.dropout_rate, deterministic=not train)(y_BxTxH)
      starts = (None, None) if initial_carries is None else tuple(initial_carries[layer]) + (None,)
      forward = Recurrent(self.cell, self.features, unroll=self.unroll, dtype=self.dtype,
                          name=f'layer{layer}_forward')
      out_BxTxH, carry = forward(y_BxTxH, lengths_B, starts[0], decode=decode)
      if self.bidirectional:
        backward = Recurrent(self.cell, self.features, reverse=True, unroll=self.unroll,
                             dtype=self.dtype, name=f'layer{layer}_backward')
        back_BxTxH, back_carry = backward(y_BxTxH, lengths_B, starts[1])
        out_BxTxH = jnp.concatenate([out_BxTxH, back_BxTxH], axis=-1)
        carries.append((carry, back_carry))
      else:
        carries.append((carry,))
      y_BxTxH = out_BxTxH
    return y_BxTxH, tuple(carries)
