"""Recurrent cells against NumPy loops of their equations (models/sequence/rnn.py), and the `Recurrent` /
`RNN` layers against those loops run over each example's valid prefix: padding, reverse and
bidirectional reading, stacking, initial carries, bfloat16 compute and one-step decoding.

Every reference runs in float64 on the float32-rounded parameters, one example and one time
step at a time with column vectors, as the papers write the equations (W x, not x Wᵀ)."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.sequence import rnn
from tests.messages import one_sentence

# float32 model against a float64 loop over at most 7 steps with O(1) weights: the largest
# difference measured is 3.9e-7 (2-layer bidirectional Elman outputs); a transposed kernel or
# a swapped gate is O(0.1).
TOL = dict(rtol=1e-5, atol=1e-6)
# bfloat16 matmuls (8 significant bits) against the float64 loop, 2 layers of 7 steps: measured
# ≤ 2.3e-2 (Elman).
BF16_ATOL = 6e-2

# Shapes of each cell's parameters in the equations' notation: W_* ∈ R^{H×C}, U_* ∈ R^{H×H}, b_* ∈ R^H.
EQUATION_SHAPES = {
    'elman': {'W_xh': 'HC', 'W_hh': 'HH', 'b_h': 'H'},
    'lstm': {**{f'W_{g}': 'HC' for g in 'fioc'}, **{f'U_{g}': 'HH' for g in 'fioc'},
             **{f'b_{g}': 'H' for g in 'fioc'}},
    'gru': {**{f'W_{g}': 'HC' for g in 'rzh'}, **{f'U_{g}': 'HH' for g in 'rzh'},
            **{f'b_{g}': 'H' for g in 'rzh'}},
}
CELL_MODULE = {'elman': 'SimpleCell_0', 'lstm': 'OptimizedLSTMCell_0', 'gru': 'GRUCell_0'}


def equation_params(kind, in_features, features, seed):
  """Distinct, non-trivial weights U(−0.9, 0.9), rounded to float32 and held in float64."""
  rng = np.random.default_rng(seed)
  dims = {'C': in_features, 'H': features}
  return {name: rng.uniform(-0.9, 0.9, [dims[d] for d in spec]).astype(np.float32).astype(np.float64)
          for name, spec in EQUATION_SHAPES[kind].items()}


def flax_params(kind, p):
  """The equations' matrices in Flax's layout: kernels are [in, out], so kernel = Wᵀ."""
  t = lambda m: jnp.asarray(np.asarray(m).T, jnp.float32)
  if kind == 'elman':
    return {'i': {'kernel': t(p['W_xh']), 'bias': t(p['b_h'])}, 'h': {'kernel': t(p['W_hh'])}}
  if kind == 'lstm':
    # Flax's gate letters: i input, f forget, g candidate (the equations' c̃), o output.
    params = {}
    for flax_gate, gate in zip('ifgo', 'ifco'):
      params[f'i{flax_gate}'] = {'kernel': t(p[f'W_{gate}'])}
      params[f'h{flax_gate}'] = {'kernel': t(p[f'U_{gate}']), 'bias': t(p[f'b_{gate}'])}
    return params
  # rnn.GRUCell: 'input' = [W_r | W_z | W_h] with their biases, 'gates' = [U_r | U_z], 'candidate' = U_h.
  return {'input': {'kernel': t(np.concatenate([p['W_r'], p['W_z'], p['W_h']])),
                    'bias': t(np.concatenate([p['b_r'], p['b_z'], p['b_h']]))},
          'gates': {'kernel': t(np.concatenate([p['U_r'], p['U_z']]))},
          'candidate': {'kernel': t(p['U_h'])}}


def sigmoid(a):
  return 1 / (1 + np.exp(-a))


def equation_step(kind, p, carry, x):
  """One step of the cell equations for one example (column vectors)."""
  if kind == 'elman':  # h_t = tanh(W_xh x_t + W_hh h_{t−1} + b_h)
    return np.tanh(p['W_xh'] @ x + p['W_hh'] @ carry + p['b_h'])
  if kind == 'lstm':
    c, h = carry
    f = sigmoid(p['W_f'] @ x + p['U_f'] @ h + p['b_f'])
    i = sigmoid(p['W_i'] @ x + p['U_i'] @ h + p['b_i'])
    o = sigmoid(p['W_o'] @ x + p['U_o'] @ h + p['b_o'])
    c = f * c + i * np.tanh(p['W_c'] @ x + p['U_c'] @ h + p['b_c'])
    return c, o * np.tanh(c)
  h = carry
  r = sigmoid(p['W_r'] @ x + p['U_r'] @ h + p['b_r'])
  z = sigmoid(p['W_z'] @ x + p['U_z'] @ h + p['b_z'])
  candidate = np.tanh(p['W_h'] @ x + p['U_h'] @ (r * h) + p['b_h'])
  return z * h + (1 - z) * candidate


def hidden(kind, carry):
  return carry[1] if kind == 'lstm' else carry


def zero_carry(kind, features):
  return (np.zeros(features), np.zeros(features)) if kind == 'lstm' else np.zeros(features)


def carry_of_example(carry, b):
  """Example b of a batched carry, as float64 NumPy."""
  return jax.tree.map(lambda a: np.asarray(a[b], np.float64), carry)


def stack_carries(kind, carries):
  if kind == 'lstm':
    return tuple(np.stack([c[k] for c in carries]) for k in range(2))
  return np.stack(carries)


def reference_layer(kind, p, x_BxTxC, lengths_B, reverse=False, carry0=None):
  """The cell equations over x[b, :length_b] (last to first if `reverse`); y = 0 past the length."""
  x = np.asarray(x_BxTxC, np.float64)
  batch, steps, _ = x.shape
  features = p['b_h' if kind != 'lstm' else 'b_f'].shape[0]
  y_BxTxH = np.zeros((batch, steps, features))
  finals = []
  for b in range(batch):
    carry = zero_carry(kind, features) if carry0 is None else carry_of_example(carry0, b)
    order = range(lengths_B[b] - 1, -1, -1) if reverse else range(lengths_B[b])
    for t in order:
      carry = equation_step(kind, p, carry, x[b, t])
      y_BxTxH[b, t] = hidden(kind, carry)
    finals.append(carry)
  return y_BxTxH, stack_carries(kind, finals)


def assert_trees_close(got, expected, **tol):
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(np.asarray(g, np.float64), e, **tol),
               got, expected)


def checked(module, variables, *args, **kwargs):
  """`variables` after checking that they have the names and shapes `module.init` gives."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args, **kwargs))
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(lambda s: s.shape, shapes)
  return variables


def recurrent_variables(kind, p):
  return {'params': {CELL_MODULE[kind]: flax_params(kind, p)}}


def random_carry(kind, batch, features, seed):
  rng = np.random.default_rng(seed)
  draw = lambda: jnp.asarray(rng.uniform(-0.8, 0.8, (batch, features)), jnp.float32)
  return (draw(), draw()) if kind == 'lstm' else draw()


def inputs(batch, steps, channels, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, steps, channels)), jnp.float32)


B, T, C, H = 4, 7, 3, 5
# One full sequence, two partial ones and an empty one.
LENGTHS = np.array([7, 4, 0, 1])


# --- cells -------------------------------------------------------------------------------------


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_cell_follows_the_papers_equations(kind):
  p = equation_params(kind, C, H, seed=1)
  cell = rnn.make_cell(kind, H)
  x_BxTxC = inputs(2, 5, C, seed=2)
  carry = random_carry(kind, 2, H, seed=3)
  variables = checked(cell, {'params': flax_params(kind, p)}, carry, x_BxTxC[:, 0])
  expected = [carry_of_example(carry, b) for b in range(2)]
  step = jax.jit(cell.apply)
  for t in range(5):
    carry, y_BxH = step(variables, carry, x_BxTxC[:, t])
    expected = [equation_step(kind, p, e, np.asarray(x_BxTxC[b, t], np.float64))
                for b, e in enumerate(expected)]
    assert_trees_close(carry, stack_carries(kind, expected), **TOL)
    np.testing.assert_allclose(y_BxH, np.stack([hidden(kind, e) for e in expected]), **TOL)


def test_flax_gru_cell_is_not_cho_et_al_gru():
  """Flax's nn.GRUCell applies r after the recurrent product (h̃ = tanh(W_h x + b_h + r ⊙ (U_h h)));
  Cho et al.'s h̃ = tanh(W_h x + U_h (r ⊙ h) + b_h) is why rnn.GRUCell exists."""
  p = equation_params('gru', C, H, seed=4)
  t = lambda m: jnp.asarray(m.T, jnp.float32)
  variables = {'params': {
      'ir': {'kernel': t(p['W_r']), 'bias': t(p['b_r'])},
      'iz': {'kernel': t(p['W_z']), 'bias': t(p['b_z'])},
      'in': {'kernel': t(p['W_h']), 'bias': t(p['b_h'])},
      'hr': {'kernel': t(p['U_r'])}, 'hz': {'kernel': t(p['U_z'])},
      'hn': {'kernel': t(p['U_h']), 'bias': jnp.zeros(H)}}}
  h_BxH = random_carry('gru', 2, H, seed=5)
  x_BxC = inputs(2, 1, C, seed=6)[:, 0]
  flax_cell = nn.GRUCell(H)
  got, _ = flax_cell.apply(checked(flax_cell, variables, h_BxH, x_BxC), h_BxH, x_BxC)
  ours, _ = rnn.GRUCell(H).apply({'params': flax_params('gru', p)}, h_BxH, x_BxC)
  x, h = np.asarray(x_BxC, np.float64), np.asarray(h_BxH, np.float64)
  cho_form = np.stack([equation_step('gru', p, h[b], x[b]) for b in range(2)])
  r = sigmoid(x @ p['W_r'].T + h @ p['U_r'].T + p['b_r'])
  z = sigmoid(x @ p['W_z'].T + h @ p['U_z'].T + p['b_z'])
  cudnn_form = z * h + (1 - z) * np.tanh(x @ p['W_h'].T + p['b_h'] + r * (h @ p['U_h'].T))
  np.testing.assert_allclose(got, cudnn_form, **TOL)  # Flax's cell is the cuDNN form …
  assert np.max(np.abs(np.asarray(got) - cho_form)) > 1e-2  # … not Cho et al.'s,
  np.testing.assert_allclose(ours, cho_form, **TOL)  # which ours is.


def test_gru_cell_takes_any_leading_batch_axes():
  p = equation_params('gru', C, H, seed=40)
  variables = {'params': flax_params('gru', p)}
  x_2x5xC = inputs(2, 5, C, seed=41)
  h_2x5xH = random_carry('gru', 10, H, seed=42).reshape(2, 5, H)
  flat, _ = rnn.GRUCell(H).apply(variables, h_2x5xH.reshape(10, H), x_2x5xC.reshape(10, C))
  single, _ = rnn.GRUCell(H).apply(variables, h_2x5xH[0, 0], x_2x5xC[0, 0])
  np.testing.assert_allclose(single, flat[0], **TOL)
  nested, _ = rnn.GRUCell(H).apply(variables, h_2x5xH, x_2x5xC)
  np.testing.assert_allclose(nested, flat.reshape(2, 5, H), **TOL)


# --- Recurrent over lengths --------------------------------------------------------------------
# Each test compiles one program (XLA compiles a scan in about a second on this machine; eager
# applies would compile every scan and small op on its own, and this file takes > 2 min).


@pytest.mark.parametrize('reverse', [False, True], ids=['forward', 'reverse'])
@pytest.mark.parametrize('kind', rnn.CELLS)
def test_recurrent_runs_the_cell_over_exactly_the_valid_prefix(kind, reverse):
  """Against the reference loop over x[b, :length] (backwards with `reverse`), from zeros and from a
  given initial carry; lengths=None means every step."""
  p = equation_params(kind, C, H, seed=7)
  layer = rnn.Recurrent(kind, H, reverse=reverse)
  x_BxTxC = inputs(B, T, C, seed=8)
  carry0 = random_carry(kind, B, H, seed=9)
  variables = checked(layer, recurrent_variables(kind, p), x_BxTxC, LENGTHS)

  @jax.jit
  def run(variables, x_BxTxC, carry0):
    return (layer.apply(variables, x_BxTxC, LENGTHS), layer.apply(variables, x_BxTxC, LENGTHS, carry0),
            layer.apply(variables, x_BxTxC))

  (y, carry), (y_started, carry_started), (y_all, carry_all) = run(variables, x_BxTxC, carry0)
  expected_y, expected_carry = reference_layer(kind, p, x_BxTxC, LENGTHS, reverse)
  np.testing.assert_allclose(y, expected_y, **TOL)
  assert_trees_close(carry, expected_carry, **TOL)
  started_y, started_carry = reference_layer(kind, p, x_BxTxC, LENGTHS, reverse, carry0)
  assert np.max(np.abs(started_y - expected_y)) > 1e-2  # The initial carry matters …
  np.testing.assert_allclose(y_started, started_y, **TOL)  # … and is used;
  assert_trees_close(carry_started, started_carry, **TOL)
  # the empty example (length 0) keeps it exactly.
  jax.tree.map(lambda got, start: np.testing.assert_array_equal(got[2], start[2]),
               carry_started, carry0)
  expected_y, expected_carry = reference_layer(kind, p, x_BxTxC, [T] * B, reverse)
  np.testing.assert_allclose(y_all, expected_y, **TOL)
  assert_trees_close(carry_all, expected_carry, **TOL)


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_reverse_equals_forward_on_the_reversed_valid_prefix(kind):
  p = equation_params(kind, C, H, seed=14)
  variables = recurrent_variables(kind, p)
  x_BxTxC = inputs(B, T, C, seed=15)
  x_flipped = np.array(x_BxTxC)
  for b, n in enumerate(LENGTHS):
    x_flipped[b, :n] = x_flipped[b, :n][::-1]
  run = jax.jit(lambda v, x, x_flipped: (rnn.Recurrent(kind, H, reverse=True).apply(v, x, LENGTHS),
                                         rnn.Recurrent(kind, H).apply(v, x_flipped, LENGTHS)))
  (y_reverse, carry_reverse), (y_forward, carry_forward) = run(variables, x_BxTxC, x_flipped)
  for b, n in enumerate(LENGTHS):
    np.testing.assert_allclose(np.asarray(y_reverse)[b, :n], np.asarray(y_forward)[b, :n][::-1],
                               **TOL)
    np.testing.assert_array_equal(np.asarray(y_reverse)[b, n:], 0.0)
  assert_trees_close(carry_reverse, jax.tree.map(np.asarray, carry_forward), **TOL)


# --- RNN: stacks and directions ----------------------------------------------------------------


def rnn_params(kind, num_layers, bidirectional, seed):
  """`equation_params` for every layer and direction: ([[p_forward, p_backward], …], variables)."""
  params, drawn = {}, []
  directions = ('forward', 'backward') if bidirectional else ('forward',)
  for layer in range(num_layers):
    in_features = C if layer == 0 else H * len(directions)
    drawn.append([equation_params(kind, in_features, H, seed=seed + 10 * layer + k)
                  for k in range(len(directions))])
    for direction, p in zip(directions, drawn[-1]):
      params[f'layer{layer}_{direction}'] = {CELL_MODULE[kind]: flax_params(kind, p)}
  return drawn, {'params': params}


def reference_rnn(kind, drawn, x_BxTxC, lengths_B, starts=None):
  """Each layer's reference-loop outputs fed into the next; a backward direction reads the reversed
  prefix and its outputs are concatenated after the forward ones."""
  y, carries = np.asarray(x_BxTxC, np.float64), []
  for layer, ps in enumerate(drawn):
    outputs, layer_carries = [], []
    for k, p in enumerate(ps):
      start = None if starts is None else starts[layer][k]
      out, carry = reference_layer(kind, p, y, lengths_B, reverse=k == 1, carry0=start)
      outputs.append(out)
      layer_carries.append(carry)
    y = np.concatenate(outputs, axis=-1)
    carries.append(tuple(layer_carries))
  return y, tuple(carries)


@functools.cache
def rnn_apply(kind, num_layers, bidirectional, dtype=jnp.float32):
  """One compiled `RNN.apply` per configuration, shared by the tests that use it."""
  return jax.jit(rnn.RNN(kind, H, num_layers=num_layers, bidirectional=bidirectional,
                         dtype=dtype).apply)


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_bidirectional_stack_feeds_each_layer_the_concatenated_directions(kind):
  x_BxTxC = inputs(B, T, C, seed=16)
  drawn, variables = rnn_params(kind, 2, True, seed=17)
  checked(rnn.RNN(kind, H, num_layers=2, bidirectional=True), variables, x_BxTxC, LENGTHS)
  y, carries = rnn_apply(kind, 2, True)(variables, x_BxTxC, LENGTHS)
  expected_y, expected_carries = reference_rnn(kind, drawn, x_BxTxC, LENGTHS)
  assert y.shape == (B, T, 2 * H)
  np.testing.assert_allclose(y, expected_y, **TOL)
  assert_trees_close(carries, expected_carries, **TOL)
  # The second layer matters: the first alone gives other outputs.
  assert np.max(np.abs(reference_rnn(kind, drawn[:1], x_BxTxC, LENGTHS)[0] - expected_y)) > 1e-2


def test_unidirectional_stack_feeds_each_layer_the_previous_outputs():
  x_BxTxC = inputs(B, T, C, seed=18)
  drawn, variables = rnn_params('gru', 3, False, seed=19)
  checked(rnn.RNN('gru', H, num_layers=3), variables, x_BxTxC, LENGTHS)
  y, carries = rnn_apply('gru', 3, False)(variables, x_BxTxC, LENGTHS)
  expected_y, expected_carries = reference_rnn('gru', drawn, x_BxTxC, LENGTHS)
  np.testing.assert_allclose(y, expected_y, **TOL)
  assert_trees_close(carries, expected_carries, **TOL)


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_padding_changes_nothing(kind):
  """Large values past each length leave the valid outputs and all final carries of a
  2-layer bidirectional RNN unchanged, and the outputs past the length stay exactly 0."""
  x_BxTxC = inputs(B, T, C, seed=20)
  _, variables = rnn_params(kind, 2, True, seed=17)
  padding_BxT = np.arange(T)[None, :] >= LENGTHS[:, None]
  noise = np.random.default_rng(21).normal(scale=1e4, size=x_BxTxC.shape).astype(np.float32)
  perturbed = jnp.where(padding_BxT[..., None], noise, x_BxTxC)
  assert np.abs(np.asarray(perturbed - x_BxTxC)).max() > 1e3
  y, carries = rnn_apply(kind, 2, True)(variables, x_BxTxC, LENGTHS)
  y_perturbed, carries_perturbed = rnn_apply(kind, 2, True)(variables, perturbed, LENGTHS)
  np.testing.assert_allclose(np.asarray(y_perturbed)[~padding_BxT], np.asarray(y)[~padding_BxT],
                             rtol=0, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(y_perturbed)[padding_BxT], 0.0)
  np.testing.assert_array_equal(np.asarray(y)[padding_BxT], 0.0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
               carries_perturbed, carries)


def test_lengths_past_the_last_step_read_every_step():
  """A length past T reads the same T steps as T, backwards too (not a rotated input)."""
  drawn, variables = rnn_params('gru', 1, True, seed=16)
  x_BxTxC = inputs(B, T, C, seed=17)
  lengths = np.array([T, 4, 0, T])
  run = rnn_apply('gru', 1, True)
  y_long, carries_long = run(variables, x_BxTxC, np.array([T + 2, 4, 0, T + 5]))
  y, carries = run(variables, x_BxTxC, lengths)
  np.testing.assert_array_equal(y_long, y)
  jax.tree.map(np.testing.assert_array_equal, carries_long, carries)
  expected_y, expected_carries = reference_rnn('gru', drawn, x_BxTxC, lengths)
  np.testing.assert_allclose(y_long, expected_y, **TOL)
  assert_trees_close(carries_long, expected_carries, **TOL)


@pytest.mark.parametrize('kind', ['elman', 'lstm'])
def test_rnn_initial_carries_start_every_layer_and_direction(kind):
  x_BxTxC = inputs(B, T, C, seed=22)
  drawn, variables = rnn_params(kind, 2, True, seed=23)
  starts = tuple(tuple(random_carry(kind, B, H, seed=30 + 2 * layer + k) for k in range(2))
                 for layer in range(2))
  y, carries = rnn_apply(kind, 2, True)(variables, x_BxTxC, LENGTHS, starts)
  expected_y, expected_carries = reference_rnn(kind, drawn, x_BxTxC, LENGTHS, starts)
  assert np.max(np.abs(reference_rnn(kind, drawn, x_BxTxC, LENGTHS)[0] - expected_y)) > 1e-2
  np.testing.assert_allclose(y, expected_y, **TOL)
  assert_trees_close(carries, expected_carries, **TOL)


# --- compute dtype and decoding ----------------------------------------------------------------


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_bfloat16_compute_stays_close_and_keeps_float32_carries(kind):
  x_BxTxC = inputs(B, T, C, seed=24)
  drawn, variables = rnn_params(kind, 2, True, seed=25)
  y16, carries16 = rnn_apply(kind, 2, True, jnp.bfloat16)(variables, x_BxTxC, LENGTHS)
  y64, carries64 = reference_rnn(kind, drawn, x_BxTxC, LENGTHS)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(carries16))
  y16 = np.asarray(y16, np.float32)
  assert np.all(np.isfinite(y16))
  np.testing.assert_allclose(y16, y64, rtol=0, atol=BF16_ATOL)
  assert_trees_close(carries16, carries64, rtol=0, atol=BF16_ATOL)
  # bfloat16 did change the computation (the float32 model is within 1e-6, see TOL).
  assert np.max(np.abs(y16 - y64)) > 1e-4


def decode_step_by_step(module, variables, x_BxTxC):
  """`init` with the full input and `decode=True`, then one `apply(..., decode=True,
  mutable=['cache'])` per step, as train/sampling.py does; returns (init cache, y, last cache)."""
  cache0 = module.init(jax.random.PRNGKey(0), x_BxTxC, decode=True)['cache']

  def step(cache, x_BxC):
    (y_Bx1xH, _), mutated = module.apply({**variables, 'cache': cache}, x_BxC[:, None],
                                         decode=True, mutable=['cache'])
    return mutated['cache'], y_Bx1xH[:, 0]

  cache, y_TxBxH = jax.lax.scan(step, cache0, jnp.swapaxes(x_BxTxC, 0, 1))
  return cache0, jnp.swapaxes(y_TxBxH, 0, 1), cache


@pytest.mark.parametrize('kind', rnn.CELLS)
def test_decode_one_step_at_a_time_equals_the_full_sequence(kind):
  x_BxTxC = inputs(B, T, C, seed=26)
  p = equation_params(kind, C, H, seed=27)
  layer = rnn.Recurrent(kind, H)
  cache0, y_BxTxH, cache = jax.jit(functools.partial(decode_step_by_step, layer))(
      recurrent_variables(kind, p), x_BxTxC)
  assert set(cache0) == {'carry'}
  jax.tree.map(lambda c: np.testing.assert_array_equal(c, 0.0), cache0)
  expected_y, expected_carry = reference_layer(kind, p, x_BxTxC, [T] * B)
  np.testing.assert_allclose(y_BxTxH, expected_y, **TOL)
  assert_trees_close(cache['carry'], expected_carry, **TOL)


def test_stacked_rnn_decodes_one_step_at_a_time():
  x_BxTxC = inputs(B, T, C, seed=28)
  drawn, variables = rnn_params('lstm', 2, False, seed=29)
  model = rnn.RNN('lstm', H, num_layers=2)
  _, y_BxTxH, cache = jax.jit(functools.partial(decode_step_by_step, model))(variables, x_BxTxC)
  expected_y, ((carry0,), (carry1,)) = reference_rnn('lstm', drawn, x_BxTxC, [T] * B)
  np.testing.assert_allclose(y_BxTxH, expected_y, **TOL)
  assert_trees_close(cache['layer0_forward']['carry'], carry0, **TOL)
  assert_trees_close(cache['layer1_forward']['carry'], carry1, **TOL)


def test_a_reverse_layer_refuses_to_decode():
  with pytest.raises(ValueError, match='reverse recurrent layer cannot decode'):
    jax.eval_shape(lambda: rnn.Recurrent('gru', H, reverse=True).init(
        jax.random.PRNGKey(0), inputs(B, T, C), decode=True))


def test_a_bidirectional_rnn_refuses_to_decode():
  """Its backward direction would read only the new step, not the whole sequence."""
  with pytest.raises(ValueError, match='bidirectional RNN cannot decode'):
    jax.eval_shape(lambda: rnn.RNN('gru', H, bidirectional=True).init(
        jax.random.PRNGKey(0), inputs(B, T, C), decode=True))


def test_gru_recurrent_kernels_start_orthogonal_like_flaxs_elman_and_lstm_cells():
  """U_r | U_z ('gates', [H, 2H]) and U_h ('candidate', [H, H]) are drawn orthogonal, as the
  recurrent kernels of Flax's SimpleCell and OptimizedLSTMCell are: Uᵀ U = I keeps h's norm
  through the recurrent product at the start. The input kernel is LeCun normal, not
  orthogonal."""
  features = 6
  params = rnn.GRUCell(features).init(jax.random.PRNGKey(0), jnp.zeros((1, features)),
                                      jnp.zeros((1, 4)))['params']
  gates = np.asarray(params['gates']['kernel'])
  candidate = np.asarray(params['candidate']['kernel'])
  assert gates.shape == (features, 2 * features)
  # An [H, 2H] orthogonal draw has orthonormal rows.
  np.testing.assert_allclose(gates @ gates.T, np.eye(features), atol=1e-5)
  np.testing.assert_allclose(candidate.T @ candidate, np.eye(features), atol=1e-5)
  inputs = np.asarray(params['input']['kernel'])
  assert np.abs(inputs @ inputs.T - np.eye(4)).max() > 0.1


@pytest.mark.parametrize('lengths', [np.array([3, 4, 5]), np.array(3), np.array([[3, 4]])])
def test_lengths_that_are_not_one_per_sequence_are_one_sentence(lengths):
  layer = rnn.RNN('gru', 4)
  x_BxTxC = jnp.ones((2, 5, 1))
  variables = layer.init(jax.random.PRNGKey(0), x_BxTxC)
  message = (r'Sequence lengths of shape ' + re.escape(str(lengths.shape))
             + r' must be \[B\] = \(2,\), one per sequence of the batch\.')
  with pytest.raises(ValueError, match=message):
    layer.apply(variables, x_BxTxC, lengths)


@pytest.mark.parametrize('unroll', [2.5, '2', -1])
def test_an_unroll_that_scan_does_not_take_is_one_sentence_at_construction(unroll):
  # They failed while tracing the scan: a shape TypeError, a '<' TypeError, scan's own message.
  one_sentence(lambda: rnn.Recurrent('gru', 4, unroll=unroll), 'Recurrent unroll', repr(unroll))
  one_sentence(lambda: rnn.RNN('gru', 4, unroll=unroll), 'RNN unroll', repr(unroll))


def test_inputs_without_a_feature_axis_are_one_sentence():
  layer = rnn.Recurrent('gru', 4)
  with pytest.raises(ValueError, match=r'reads inputs of shape \[B, T, C\], got shape \(2, 5\)\.'):
    layer.init(jax.random.PRNGKey(0), jnp.ones((2, 5)))


def test_dropout_between_layers_is_inverted_and_spares_the_first_layers_input():
  """With rate p, layer 2 reads m ⊙ y¹ / (1 − p) in training (m ∈ {0, 1}, P(m = 0) = p) and y¹ at
  inference; layer 1 reads x undropped. Layer 2 is an Elman cell with W_xh = I, W_hh = 0, b = 0,
  so its input is recovered exactly as arctanh of its output."""
  rate = 0.25
  p0 = equation_params('elman', C, H, seed=50)
  p1 = {'W_xh': np.eye(H), 'W_hh': np.zeros((H, H)), 'b_h': np.zeros(H)}
  variables = {'params': {f'layer{layer}_forward': {'SimpleCell_0': flax_params('elman', p)}
                          for layer, p in enumerate((p0, p1))}}
  model = rnn.RNN('elman', H, num_layers=2, dropout_rate=rate)
  x_BxTxC = inputs(B, T, C, seed=51)

  @jax.jit
  def run(variables, x_BxTxC):
    return (model.apply(variables, x_BxTxC, train=True, rngs={'dropout': jax.random.PRNGKey(3)}),
            model.apply(variables, x_BxTxC))

  (y_train, carries_train), (y_eval, carries_eval) = run(variables, x_BxTxC)
  y1, _ = reference_layer('elman', p0, x_BxTxC, [T] * B)
  # Inference: no dropout, the plain stack.
  expected_y, expected_carries = reference_rnn('elman', [[p0], [p1]], x_BxTxC, [T] * B)
  np.testing.assert_allclose(y_eval, expected_y, **TOL)
  assert_trees_close(carries_eval, expected_carries, **TOL)
  # Training: the first layer is untouched …
  assert_trees_close(carries_train[0], expected_carries[0], **TOL)
  # … and the second reads y¹ scaled by 0 or 1 / (1 − p) = 4/3 per unit and step.
  ratio = np.arctanh(np.asarray(y_train, np.float64)) / y1
  assert np.min(np.abs(y1)) > 1e-3
  dropped = np.abs(ratio) < 1e-4
  np.testing.assert_allclose(ratio[~dropped], 1 / (1 - rate), rtol=1e-4)
  assert 0.1 < dropped.mean() < 0.45
