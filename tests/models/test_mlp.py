"""MLP against x(l) = φ(W(l)ᵀ x(l-1) + b(l)), evaluated by a NumPy loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.mlp import MLP

TOL = dict(rtol=1e-5, atol=1e-5)

NUMPY_PHI = {'relu': lambda z: np.maximum(z, 0), 'tanh': np.tanh, 'sigmoid': lambda z: 1 / (1 + np.exp(-z))}


def _dense(variables, index):
  layer = variables['params'][f'Dense_{index}']
  # Layers followed by batch norm have no bias (the norm would cancel it).
  bias = layer.get('bias', np.zeros(layer['kernel'].shape[-1]))
  return np.asarray(layer['kernel'], np.float64), np.asarray(bias, np.float64)


def _reference(variables, x, features, phi, residual=False, layer_norm=False):
  x = np.asarray(x, np.float64).reshape(x.shape[0], -1)
  for l in range(len(features)):
    w, b = _dense(variables, l)
    z = x @ w + b
    if l == len(features) - 1:
      return z
    if layer_norm:
      ln = variables['params'][f'LayerNorm_{l}']
      z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-6)
      z = np.asarray(ln['scale']) * z + np.asarray(ln['bias'])
    h = phi(z)
    x = x + h if residual and x.shape[-1] == h.shape[-1] else h


def _perturbed(variables, seed=0):
  # Non-trivial scales and biases everywhere, so every parameter matters.
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: np.asarray(leaf) + rng.normal(scale=0.3, size=leaf.shape).astype(np.float32),
                      variables)


@pytest.mark.parametrize('activation', sorted(NUMPY_PHI))
@pytest.mark.parametrize('features', [(3,), (5, 3), (6, 4, 4, 2)])
def test_forward_equals_the_layer_recursion(activation, features):
  model = MLP(features, activation=activation)
  x_BxHxW = jax.random.normal(jax.random.key(1), (4, 2, 3))
  variables = _perturbed(model.init(jax.random.key(0), x_BxHxW))
  expected = _reference(variables, x_BxHxW, features, NUMPY_PHI[activation])
  np.testing.assert_allclose(model.apply(variables, x_BxHxW), expected, **TOL)


@pytest.mark.parametrize('activation, phi', [('leaky_relu(0.2)', lambda z: np.where(z > 0, z, 0.2 * z)),
                                              ('elu(0.5)', lambda z: np.where(z > 0, z, 0.5 * np.expm1(z)))])
def test_an_activation_parameter_given_in_its_name_is_used(activation, phi):
  features = (5, 3)
  x_BxD = jax.random.normal(jax.random.key(1), (6, 4))
  model = MLP(features, activation=activation)
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  np.testing.assert_allclose(model.apply(variables, x_BxD), _reference(variables, x_BxD, features, phi),
                             **TOL)


@pytest.mark.parametrize('pieces', [1, 3])
def test_maxout_hidden_units_are_the_largest_of_their_own_pieces(pieces):
  # Unit j of a hidden layer owns columns j·k … j·k + k − 1 of its Dense layer.
  def maxout(z_BxHK):
    return np.stack([np.max([z_BxHK[:, j * pieces + p] for p in range(pieces)], axis=0)
                     for j in range(z_BxHK.shape[1] // pieces)], axis=1)

  features = (4, 4, 2)  # the second hidden layer has a skip connection
  x_BxD = jax.random.normal(jax.random.key(1), (6, 3))
  model = MLP(features, activation=f'maxout({pieces})', residual=True)
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  assert [variables['params'][f'Dense_{l}']['kernel'].shape for l in range(3)] == [
      (3, 4 * pieces), (4, 4 * pieces), (4, 2)]
  expected = _reference(variables, x_BxD, features, maxout, residual=True)
  np.testing.assert_allclose(model.apply(variables, x_BxD), expected, **TOL)


@pytest.mark.parametrize('activation, message', [('maxout(0)', 'k ≥ 1'), ('maxout', 'k ≥ 1'),
                                                 ('leaky_relu(2)', r'\[0, 1\)'),
                                                 ('relu(0.1)', 'takes no parameter')])
def test_a_wrong_activation_is_named_with_what_is_allowed(activation, message):
  with pytest.raises(ValueError, match=message):
    MLP((3, 2), activation=activation).init(jax.random.key(0), jnp.ones((1, 4)))


def test_residual_adds_skip_connections_where_widths_agree_and_keeps_parameter_names():
  features = (5, 5, 5, 2)
  x_BxD = jax.random.normal(jax.random.key(2), (3, 4))
  plain_variables = MLP(features).init(jax.random.key(0), x_BxD)
  model = MLP(features, activation='tanh', residual=True)
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  assert jax.tree.structure(variables) == jax.tree.structure(plain_variables)
  expected = _reference(variables, x_BxD, features, np.tanh, residual=True)
  np.testing.assert_allclose(model.apply(variables, x_BxD), expected, **TOL)
  plain = _reference(variables, x_BxD, features, np.tanh)
  assert np.max(np.abs(expected - plain)) > 1e-2


def test_layer_norm_option_equals_its_formula_in_training_and_inference():
  features = (6, 6, 3)
  model = MLP(features, activation='relu', layer_norm=True)
  x_BxD = jax.random.normal(jax.random.key(3), (4, 5))
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  expected = _reference(variables, x_BxD, features, NUMPY_PHI['relu'], layer_norm=True)
  np.testing.assert_allclose(model.apply(variables, x_BxD, train=False), expected, **TOL)
  np.testing.assert_allclose(model.apply(variables, x_BxD, train=True), expected, **TOL)


def test_layer_norm_option_on_pre_activations_of_variance_near_epsilon():
  # With inputs of scale 1e-3 and no first bias, the pre-activations' variance over the features
  # is of order ε = 1e-6 (0.6e-6 … 3.2e-6), so ε shows: ε = 1e-5 (PyTorch's default) shrinks the
  # normalised values by a factor of 1.8 … 2.6, where at the variance ~1 of the test above it
  # changes them by 5e-6 relative, inside its tolerance.
  features = (6, 6, 3)
  model = MLP(features, activation='tanh', layer_norm=True)
  x_BxD = jax.random.normal(jax.random.key(3), (4, 5)) * 1e-3
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  params = dict(variables['params'])
  params['Dense_0'] = {**params['Dense_0'], 'bias': np.zeros(6, np.float32)}
  variables = {'params': params}
  expected = _reference(variables, x_BxD, features, np.tanh, layer_norm=True)
  np.testing.assert_allclose(model.apply(variables, x_BxD), expected, rtol=1e-4, atol=1e-4)


def test_dropout_acts_in_training_only():
  model = MLP((32, 32, 2), dropout_rate=0.5)
  x_BxD = jax.random.normal(jax.random.key(4), (8, 3))
  variables = model.init(jax.random.key(0), x_BxD)
  no_dropout = MLP((32, 32, 2)).apply(variables, x_BxD)
  np.testing.assert_array_equal(model.apply(variables, x_BxD, train=False), no_dropout)
  trained = model.apply(variables, x_BxD, train=True, rngs={'dropout': jax.random.key(5)})
  assert np.max(np.abs(trained - no_dropout)) > 1e-3


@pytest.mark.parametrize('rate', [0.25, 0.6])
def test_dropout_keeps_each_hidden_unit_with_probability_one_minus_rate_and_rescales_it(rate):
  # Inverted dropout after φ: h = r ⊙ φ(z) / (1 - p), r_i ~ Bernoulli(1 - p). With the output layer
  # the identity, the logits are h itself, so every entry is 0 or φ(z)/(1 - p) of the NumPy
  # forward pass. Fails for a dropout before φ, a keep probability of p instead of 1 - p, a
  # missing or squared 1/(1 - p), or a dropout of the logits as well.
  width = 16
  model = MLP((width, width), activation='tanh', dropout_rate=rate)
  x_BxD = jax.random.normal(jax.random.key(7), (64, 3))
  variables = _perturbed(model.init(jax.random.key(0), x_BxD))
  params = dict(variables['params'])
  params['Dense_1'] = {'kernel': np.eye(width, dtype=np.float32), 'bias': np.zeros(width, np.float32)}
  variables = {'params': params}
  w, b = _dense(variables, 0)
  kept_value = np.tanh(np.asarray(x_BxD, np.float64) @ w + b) / (1 - rate)
  out = np.asarray(model.apply(variables, x_BxD, train=True, rngs={'dropout': jax.random.key(8)}))
  dropped = out == 0
  np.testing.assert_allclose(out[~dropped], kept_value[~dropped], **TOL)
  assert abs(1 - dropped.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / out.size), dropped.mean()
  # The same key gives the same mask, another key another one.
  again = model.apply(variables, x_BxD, train=True, rngs={'dropout': jax.random.key(8)})
  np.testing.assert_array_equal(again, out)
  other = np.asarray(model.apply(variables, x_BxD, train=True, rngs={'dropout': jax.random.key(9)}))
  assert np.mean((other == 0) != dropped) > 0.1


def test_batch_norm_uses_running_averages_at_inference():
  model = MLP((4, 2), batch_norm=True, activation='tanh')
  x_BxD = jax.random.normal(jax.random.key(6), (5, 3)) * 3.0
  variables = model.init(jax.random.key(0), x_BxD)
  # The normalised layer has no bias of its own (BatchNorm's shift takes its place); the
  # output layer keeps its bias.
  assert sorted(variables['params']['Dense_0']) == ['kernel']
  assert sorted(variables['params']['Dense_1']) == ['bias', 'kernel']
  # Fresh running averages are mean 0 and variance 1.
  w, b = _dense(variables, 0)
  hidden = np.tanh((np.asarray(x_BxD) @ w + b) / np.sqrt(1 + 1e-5))
  w_out, b_out = _dense(variables, 1)
  np.testing.assert_allclose(model.apply(variables, x_BxD, train=False), hidden @ w_out + b_out, **TOL)
  _, updates = model.apply(variables, x_BxD, train=True, mutable=['batch_stats'])
  z = np.asarray(x_BxD, np.float64) @ w + b
  np.testing.assert_allclose(updates['batch_stats']['BatchNorm_0']['mean'], 0.01 * z.mean(0), **TOL)


def test_numpy_integer_widths_are_widths():
  # A width from np.arange or .astype(int) is an np.int64; it was refused as not a positive integer.
  x_BxD = jax.random.normal(jax.random.key(1), (3, 2))
  numpy_widths = MLP((np.int64(5), np.int32(3)), activation='tanh')
  variables = _perturbed(numpy_widths.init(jax.random.key(0), x_BxD))
  np.testing.assert_allclose(numpy_widths.apply(variables, x_BxD),
                             _reference(variables, x_BxD, (5, 3), np.tanh), **TOL)
  with pytest.raises(ValueError, match='positive integers'):
    MLP((True, 3)).init(jax.random.key(0), x_BxD)


@pytest.mark.parametrize('kwargs,message', [
    (dict(features=()), 'at least the output width'),
    (dict(features=(3, 2), dropout_rate=1.0), 'dropout_rate must lie in'),
    (dict(features=(3, 2), batch_norm=True, layer_norm=True), 'not both'),
    (dict(features=(3, 2), activation='swish'), "'swish'"),
    # One integer for the widths failed iterating over it, a dropout rate that is no number
    # comparing it with 0 (TypeError both).
    (dict(features=10), r'features must be a sequence of layer widths, the last one the output '
                        r'width, got 10\.'),
    (dict(features=(3, 2), dropout_rate='0.1'), r"dropout_rate must lie in \[0, 1\), got '0.1'"),
    (dict(features=(3, 2), dropout_rate=None), r'dropout_rate must lie in \[0, 1\), got None'),
])
def test_bad_configuration_is_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    MLP(**kwargs).init(jax.random.key(0), jnp.ones((1, 2)))


def test_registry_refuses_an_mlp_whose_output_width_is_not_the_number_of_classes():
  # The train library passes the data's class count; 5 logits for 10 classes gave NaN losses
  # (labels 5 … 9 have no logit) and the run stopped blaming the learning rate.
  model = registry.build('mlp', None, {'num_classes': 10}, features=[32, 10])
  assert model.features == (32, 10)
  with pytest.raises(ValueError, match=r'features=\(32, 5\) ends in 5, .* the data has 10 classes'):
    registry.build('mlp', None, {'num_classes': 10}, features=[32, 5])
  # A single width, not a sequence: the MLP's own sentence (the check above indexed it and
  # raised a TypeError).
  model = registry.build('mlp', None, {'num_classes': 10}, features=10)
  with pytest.raises(ValueError, match='MLP features must be a sequence of layer widths'):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4))))


@pytest.mark.parametrize('dtype', ['float16', 'half', 'float64', 'int8'])
def test_registry_takes_float32_and_bfloat16_compute_and_refuses_other_dtypes(dtype):
  # float16 would need loss scaling, and XLA:CPU cannot compile its products: refused up front.
  assert registry.build('mlp', dtype='bfloat16', features=[4]).dtype == jnp.bfloat16
  assert registry.build('mlp', dtype=jnp.float32, features=[4]).dtype == jnp.float32
  with pytest.raises(ValueError, match=f"^config.model.dtype='{dtype}' is not a compute dtype; "
                                       r'allowed: float32, bfloat16\.$'):
    registry.build('mlp', dtype=dtype, features=[4])
