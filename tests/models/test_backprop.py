"""Manual back-propagation against jax.grad; hand-written gates against finite differences."""

import jax
from jax.test_util import check_grads
import jax.numpy as jnp
import numpy as np
import pytest

from models import activations
from models import backprop
from models import losses
from models.mlp import MLP
from tests.messages import one_sentence

# Both sides run in float32; the gradients are O(1).
GRAD_TOL = dict(rtol=1e-4, atol=2e-6)


def _random_layers(widths, seed):
  rng = np.random.default_rng(seed)
  layers = []
  for d, h in zip(widths[:-1], widths[1:]):
    w_DxH = rng.normal(size=(d, h)) / np.sqrt(d)
    b_H = rng.normal(size=h) * 0.3
    layers.append((jnp.asarray(w_DxH, jnp.float32), jnp.asarray(b_H, jnp.float32)))
  return layers


# Every activation with two hidden layers, and 0, 1 and 4 hidden layers with two activations.
_DEPTH_ACTIVATION = ([((6, 5), name) for name in sorted(activations.ACTIVATIONS)]
                     + [(hidden, name) for hidden in [(), (7,), (5, 4, 6, 3)] for name in ['relu', 'tanh']])
CASES = [pytest.param(hidden, name, id=f'{len(hidden)}_hidden-{name}') for hidden, name in _DEPTH_ACTIVATION]


@pytest.mark.parametrize('loss', backprop.LOSSES)
@pytest.mark.parametrize('hidden,activation', CASES)
def test_backprop_equals_autodiff_on_mlp_params(hidden, activation, loss):
  batch, dim, out = 5, 4, 3
  widths = (dim, *hidden, out)
  variables = backprop.layers_to_mlp_params(_random_layers(widths, seed=len(hidden)))
  rng = np.random.default_rng(1)
  x_BxD = jnp.asarray(rng.normal(size=(batch, dim)), jnp.float32)
  if loss == 'squared_error':
    targets = jnp.asarray(rng.normal(size=(batch, out)), jnp.float32)
  else:
    targets = jnp.asarray(rng.integers(0, out, size=batch))
  features = tuple(widths[1:])

  def cost(v):
    y = MLP(features, activation=activation).apply(v, x_BxD)
    if loss == 'squared_error':
      return jnp.mean(jnp.sum((targets - y) ** 2, axis=-1))
    return jnp.mean(losses.cross_entropy(y, targets))

  expected_cost, expected = jax.jit(jax.value_and_grad(cost))(variables)
  manual = jax.jit(lambda v: backprop.value_and_grad(v, x_BxD, targets, activation=activation, loss=loss))
  got_cost, got = manual(variables)
  np.testing.assert_allclose(got_cost, expected_cost, rtol=1e-6)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), got, expected)


@pytest.mark.parametrize('loss', backprop.LOSSES)
@pytest.mark.parametrize('activation', ['relu', 'tanh'])
def test_backprop_of_a_residual_mlp_equals_autodiff(activation, loss):
  # Skips around 4 → 4, 4 → 4 and 6 → 6; none around 4 → 6 or the 6 → 6 output layer.
  batch, dim, out = 5, 4, 6
  features = (4, 4, 6, 6, out)
  mlp = MLP(features, activation=activation, residual=True)
  rng = np.random.default_rng(11)
  x_BxD = jnp.asarray(rng.normal(size=(batch, dim)), jnp.float32)
  variables = mlp.init(jax.random.key(0), x_BxD)
  # Random biases, so that the ReLUs are not all active at once.
  variables = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape) * 0.3, p.dtype), variables)
  if loss == 'squared_error':
    targets = jnp.asarray(rng.normal(size=(batch, out)), jnp.float32)
  else:
    targets = jnp.asarray(rng.integers(0, out, size=batch))

  def cost(v):
    y = mlp.apply(v, x_BxD)
    if loss == 'squared_error':
      return jnp.mean(jnp.sum((targets - y) ** 2, axis=-1))
    return jnp.mean(losses.cross_entropy(y, targets))

  expected_cost, expected = jax.jit(jax.value_and_grad(cost))(variables)
  manual = jax.jit(lambda v: backprop.value_and_grad(v, x_BxD, targets, activation=activation, loss=loss,
                                                     residual=True))
  got_cost, got = manual(variables)
  np.testing.assert_allclose(got_cost, expected_cost, rtol=1e-6)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), got, expected)


def test_backprop_through_consecutive_skips_equals_autodiff():
  # Every hidden layer 4 → 4 has a skip, so ∂C/∂x(1) = δ(2) W(2)ᵀ + ∂C/∂x(2), where ∂C/∂x(2)
  # holds ∂C/∂x(3) through layer 3's skip in turn. The case above has no two skips in a row
  # past the first layer, so a backward that passes on δ(l) W(l)ᵀ alone, dropping the skip
  # gradient already summed, gave its gradients exactly.
  batch, dim, out = 5, 4, 3
  features = (4, 4, 4, 4, out)
  mlp = MLP(features, activation='tanh', residual=True)
  rng = np.random.default_rng(12)
  x_BxD = jnp.asarray(rng.normal(size=(batch, dim)), jnp.float32)
  variables = mlp.init(jax.random.key(0), x_BxD)
  variables = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape) * 0.3, p.dtype), variables)
  targets = jnp.asarray(rng.normal(size=(batch, out)), jnp.float32)

  def cost(v):
    return jnp.mean(jnp.sum((targets - mlp.apply(v, x_BxD)) ** 2, axis=-1))

  expected_cost, expected = jax.jit(jax.value_and_grad(cost))(variables)
  got_cost, got = jax.jit(lambda v: backprop.value_and_grad(v, x_BxD, targets, activation='tanh',
                                                            residual=True))(variables)
  np.testing.assert_allclose(got_cost, expected_cost, rtol=1e-6)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), got, expected)


def test_backprop_of_the_params_entry_on_unflattened_inputs_equals_autodiff():
  # Inputs [B, 2, 3] are flattened as the MLP does; given the 'params' entry, the gradients
  # come back as that entry, without a 'params' level around them.
  rng = np.random.default_rng(13)
  x_Bx2x3 = jnp.asarray(rng.normal(size=(4, 2, 3)), jnp.float32)
  labels = jnp.array([0, 2, 1, 2])
  params = backprop.layers_to_mlp_params(_random_layers((6, 5, 3), seed=13))['params']
  cost = lambda p: jnp.mean(losses.cross_entropy(
      MLP((5, 3), activation='tanh').apply({'params': p}, x_Bx2x3), labels))
  expected_cost, expected = jax.jit(jax.value_and_grad(cost))(params)
  got_cost, got = jax.jit(lambda p: backprop.value_and_grad(p, x_Bx2x3, labels, activation='tanh',
                                                            loss='cross_entropy'))(params)
  np.testing.assert_allclose(got_cost, expected_cost, rtol=1e-6)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), got, expected)


def test_squared_error_targets_of_another_shape_than_the_output_are_refused():
  layers = _random_layers((2, 3, 1), 0)
  # Targets (B,) against outputs (B, 1) would broadcast to (B, B).
  one_sentence(lambda: backprop.value_and_grad(layers, jnp.ones((4, 2)), jnp.ones(4)), '(4, 1)', '(4,)')
  one_sentence(lambda: backprop.output_delta(jnp.ones((4, 1)), jnp.ones(4), 'squared_error'), '(4, 1)', '(4,)')


def test_backprop_on_plain_layer_lists_follows_the_single_example_formulas():
  # With one example: ∂L/∂w_ij(l) = δ_j(l) x_i(l-1), ∂L/∂b_j(l) = δ_j(l).
  layers = _random_layers((3, 4, 2), seed=7)
  x_1xD = jnp.array([[0.5, -1.0, 2.0]])
  y_1xK = jnp.array([[0.3, -0.2]])
  _, grads = backprop.value_and_grad(layers, x_1xD, y_1xK, activation='tanh')
  (w1, b1), (w2, b2) = [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in layers]
  x0 = np.asarray(x_1xD[0], np.float64)
  z1 = w1.T @ x0 + b1
  x1 = np.tanh(z1)
  out = w2.T @ x1 + b2
  delta2 = -2 * (np.asarray(y_1xK[0]) - out)
  delta1 = (w2 @ delta2) * (1 - np.tanh(z1) ** 2)
  for (dw, db), (x_prev, delta) in zip(grads, [(x0, delta1), (x1, delta2)]):
    np.testing.assert_allclose(dw, np.outer(x_prev, delta), **GRAD_TOL)
    np.testing.assert_allclose(db, delta, **GRAD_TOL)


def test_backprop_with_a_custom_activation_callable():
  softplus = lambda z: jnp.logaddexp(z, 0.0)
  layers = _random_layers((4, 6, 2), seed=3)
  x_BxD = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4)), jnp.float32)
  y_BxK = jnp.zeros((3, 2))
  _, got = jax.jit(lambda l: backprop.value_and_grad(l, x_BxD, y_BxK, activation=softplus))(layers)

  def cost(layers):
    return backprop.output_delta(backprop.forward(layers, x_BxD, softplus)[1][-1], y_BxK, 'squared_error')[0]

  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), got, jax.jit(jax.grad(cost))(layers))


def test_mlp_params_are_read_in_numeric_layer_order():
  layers = _random_layers((2,) * 13, seed=5)
  params = backprop.layers_to_mlp_params(layers)['params']
  # Lexicographic order would put Dense_10 before Dense_2.
  shuffled = {name: params[name] for name in sorted(params)}
  read = backprop.layers_from_mlp_params(shuffled)
  for (w, b), (w_read, b_read) in zip(layers, read):
    np.testing.assert_array_equal(w, w_read)
    np.testing.assert_array_equal(b, b_read)


def test_params_of_an_mlp_with_normalisation_are_rejected():
  variables = MLP((3, 2), batch_norm=True).init(jax.random.key(0), jnp.ones((2, 2)))
  with pytest.raises(ValueError, match='plain MLP'):
    backprop.layers_from_mlp_params(variables)


def test_layers_whose_widths_do_not_chain_are_one_sentence():
  # A maxout MLP's Dense_0 is width · k wide, so its kernels do not chain; they, and inputs
  # of another width than W(1) reads, failed in a matrix product (TypeError of dot_general).
  x_Bx5, labels_B = jnp.ones((2, 5)), jnp.array([0, 1])
  variables = MLP((4, 3), activation='maxout(2)').init(jax.random.key(0), x_Bx5)
  one_sentence(lambda: backprop.value_and_grad(variables, x_Bx5, labels_B, loss='cross_entropy'),
               'Layer 1 (kernel (4, 3), bias (3,)) does not read the 8 features before it',
               '[(5, 8), (4, 3)]', 'not maxout ones')
  layers = _random_layers((5, 4, 3), 0)
  one_sentence(lambda: backprop.value_and_grad(layers, jnp.ones((2, 6)), labels_B,
                                               loss='cross_entropy'),
               'Layer 0 (kernel (5, 4), bias (4,)) does not read the 6 features before it')
  # A bias of one entry would broadcast over the layer's 4 outputs.
  w0, _ = layers[0]
  one_sentence(lambda: backprop.value_and_grad([(w0, jnp.zeros(1)), layers[1]], x_Bx5, labels_B,
                                               loss='cross_entropy'),
               'Layer 0 (kernel (5, 4), bias (1,)) does not read the 5 features before it')
  cost, _ = backprop.value_and_grad(layers, x_Bx5, labels_B, loss='cross_entropy')
  assert np.isfinite(cost)


def test_unknown_loss_is_rejected():
  with pytest.raises(ValueError, match="'hinge'"):
    backprop.value_and_grad(_random_layers((2, 2), 0), jnp.ones((1, 2)), jnp.ones((1, 2)), loss='hinge')


# Gates with a hand-written backward.


def test_multiply_gate_matches_finite_differences_and_autodiff():
  x = jnp.array([0.5, -1.5, 2.0])
  y = jnp.array([3.0, 0.25, -1.0])
  check_grads(backprop.multiply, (x, y), order=2, modes=['rev'])
  upstream = jnp.array([1.0, -2.0, 0.5])
  _, gate_vjp = jax.vjp(backprop.multiply, x, y)
  _, auto_vjp = jax.vjp(lambda a, b: a * b, x, y)
  for gate, auto in zip(gate_vjp(upstream), auto_vjp(upstream)):
    np.testing.assert_array_equal(gate, auto)
  # Local gradients of z = x·y: grad_x = y · grad_z and grad_y = x · grad_z.
  np.testing.assert_array_equal(gate_vjp(upstream)[0], y * upstream)
  np.testing.assert_array_equal(gate_vjp(upstream)[1], x * upstream)


def test_multiply_gate_on_scalars():
  grad_x, grad_y = jax.grad(backprop.multiply, argnums=(0, 1))(3.0, -2.0)
  assert (grad_x, grad_y) == (-2.0, 3.0)


def test_multiply_gate_rejects_mismatched_shapes():
  with pytest.raises(ValueError, match='one shape'):
    backprop.multiply(jnp.ones(3), jnp.ones(2))


def test_affine_gate_matches_finite_differences():
  rng = np.random.default_rng(6)
  args = tuple(jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(3, 4), (4, 2), (2,)])
  check_grads(backprop.affine, args, order=2, modes=['rev'])


def test_network_of_gates_reproduces_backprop():
  layers = _random_layers((3, 5, 2), seed=8)
  x_BxD = jnp.asarray(np.random.default_rng(9).normal(size=(4, 3)), jnp.float32)
  y_BxK = jnp.ones((4, 2))

  def cost(layers):
    (w1, b1), (w2, b2) = layers
    out = backprop.affine(jnp.tanh(backprop.affine(x_BxD, w1, b1)), w2, b2)
    return jnp.mean(jnp.sum((y_BxK - out) ** 2, axis=-1))

  _, manual = jax.jit(lambda l: backprop.value_and_grad(l, x_BxD, y_BxK, activation='tanh'))(layers)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, **GRAD_TOL), manual, jax.jit(jax.grad(cost))(layers))
