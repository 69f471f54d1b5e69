"""Activations against their defining formulas, derivatives against jax.grad."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import activations
from tests.messages import one_sentence

# float32 evaluation compared with float64 references.
RTOL, ATOL = 1e-6, 1e-6

_erf = np.vectorize(math.erf)


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


FORMULAS = {
    'sigmoid': _sigmoid,
    'tanh': lambda x: (np.exp(x) - np.exp(-x)) / (np.exp(x) + np.exp(-x)),
    'relu': lambda x: np.maximum(0, x),
    'leaky_relu': lambda x: np.maximum(0.01 * x, x),
    'gelu': lambda x: x * 0.5 * (1 + _erf(x / math.sqrt(2))),
    'gelu_tanh': lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    'elu': lambda x: np.where(x > 0, x, np.exp(np.minimum(x, 0)) - 1),
}


def _points(n=401, scale=6.0):
  # A grid that avoids the kink at exactly 0, plus random points.
  grid = np.linspace(-scale, scale, n) + 1e-3
  rand = np.random.default_rng(0).normal(scale=3.0, size=200)
  return np.concatenate([grid, rand]).astype(np.float32)


def test_every_activation_has_a_formula_and_a_derivative():
  assert set(activations.ACTIVATIONS) == set(FORMULAS) == set(activations.DERIVATIVES)


@pytest.mark.parametrize('name', sorted(FORMULAS))
def test_activation_equals_its_formula(name):
  x = _points()
  got = np.asarray(activations.get(name)(jnp.asarray(x)))
  np.testing.assert_allclose(got, FORMULAS[name](x.astype(np.float64)), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('name', sorted(FORMULAS))
def test_hand_derivative_equals_jax_grad(name):
  x = jnp.asarray(_points())
  fn = activations.get(name)
  autodiff = jax.vmap(jax.grad(fn))(x)
  np.testing.assert_allclose(activations.derivative(name)(x), autodiff, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('name', sorted(FORMULAS))
def test_hand_derivative_agrees_with_jax_grad_at_the_origin(name):
  zero = jnp.zeros((1,))
  autodiff = jax.vmap(jax.grad(activations.get(name)))(zero)
  np.testing.assert_allclose(activations.derivative(name)(zero), autodiff, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('name', sorted(FORMULAS))
def test_hand_derivative_equals_central_difference(name):
  # An independent check of the hand derivations, in float64 on the defining formula.
  x = _points().astype(np.float64)
  h = 1e-5
  numeric = (FORMULAS[name](x + h) - FORMULAS[name](x - h)) / (2 * h)
  np.testing.assert_allclose(activations.derivative(name)(jnp.asarray(x, jnp.float32)), numeric,
                             rtol=1e-5, atol=1e-5)


def test_tanh_is_a_rescaled_sigmoid():
  # The identity tanh(x) = 2φ(2x) - 1.
  x = jnp.asarray(_points())
  np.testing.assert_allclose(activations.tanh(x), 2 * activations.sigmoid(2 * x) - 1, atol=2e-6)


@pytest.mark.parametrize('alpha', [0.0, 0.01, 0.05, 0.3])
def test_leaky_relu_with_configurable_slope(alpha):
  x = _points()
  np.testing.assert_allclose(activations.leaky_relu(jnp.asarray(x), alpha),
                             np.maximum(alpha * x.astype(np.float64), x), rtol=RTOL, atol=ATOL)
  slope = jax.vmap(jax.grad(activations.leaky_relu), in_axes=(0, None))(jnp.asarray(x), alpha)
  np.testing.assert_allclose(activations.leaky_relu_derivative(jnp.asarray(x), alpha), slope)
  np.testing.assert_array_equal(np.unique(np.asarray(slope)), np.unique(np.float32([alpha, 1.0])))


@pytest.mark.parametrize('alpha', [0.5, 1.0, 2.0])
def test_elu_with_configurable_alpha(alpha):
  x = _points()
  x64 = x.astype(np.float64)
  expected = np.where(x64 > 0, x64, alpha * (np.exp(np.minimum(x64, 0)) - 1))
  np.testing.assert_allclose(activations.elu(jnp.asarray(x), alpha), expected, rtol=RTOL, atol=ATOL)
  autodiff = jax.vmap(jax.grad(activations.elu), in_axes=(0, None))(jnp.asarray(x), alpha)
  np.testing.assert_allclose(activations.elu_derivative(jnp.asarray(x), alpha), autodiff, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('alpha', [0.5, 2.0])
def test_elu_derivative_at_the_kink_is_alpha_as_jax_grad(alpha):
  # At x = 0 the slope is the left one, α·e⁰ = α, as jax.grad gives. With α = 1 both sides
  # agree, so only another α catches a derivative that takes the right slope 1 at 0 (x ≥ 0
  # for x > 0).
  zero = jnp.zeros((1,))
  np.testing.assert_allclose(jax.vmap(jax.grad(activations.elu), in_axes=(0, None))(zero, alpha),
                             [alpha])
  np.testing.assert_allclose(activations.elu_derivative(zero, alpha), [alpha])
  np.testing.assert_allclose(activations.derivative(f'elu({alpha})')(zero), [alpha])


def test_gelu_tanh_approximates_exact_gelu():
  x = jnp.asarray(_points())
  gap = np.max(np.abs(activations.gelu(x) - activations.gelu_tanh(x)))
  assert 1e-5 < gap < 1e-3


def test_derivative_of_a_custom_callable_uses_autodiff():
  x = jnp.asarray(_points())
  steep = functools.partial(activations.leaky_relu, alpha=0.2)
  np.testing.assert_allclose(activations.derivative(steep)(x), activations.leaky_relu_derivative(x, 0.2))


def test_derivative_of_a_registered_callable_is_the_hand_derived_one():
  assert activations.derivative(activations.ACTIVATIONS['gelu']) is activations.gelu_derivative


@pytest.mark.parametrize('name, alpha, formula, slope', [
    ('leaky_relu(0.2)', 0.2, lambda x: np.maximum(0.2 * x, x), lambda x: np.where(x >= 0, 1, 0.2)),
    ('elu(0.5)', 0.5, lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0))),
     lambda x: np.where(x > 0, 1, 0.5 * np.exp(np.minimum(x, 0))))])
def test_a_parameter_in_the_name_sets_alpha_of_the_function_and_its_derivative(name, alpha, formula,
                                                                               slope):
  x = _points()
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(activations.get(name)(jnp.asarray(x)), formula(x64), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(activations.derivative(name)(jnp.asarray(x)), slope(x64), rtol=RTOL,
                             atol=ATOL)
  assert activations.parse(name) == (name.split('(')[0], {'alpha': alpha})


@pytest.mark.parametrize('name, message', [
    ('relu(0.2)', 'relu takes no parameter'), ('leaky_relu(1)', r'slope α in \[0, 1\), got \'1\''),
    ('elu(-1)', 'α > 0'), ('elu(nan)', 'α > 0'), ('elu(inf)', 'α > 0'), ('leaky_relu()', 'slope'),
    ('maxout(2)', 'models.mlp.MLP takes it'), ('maxout(two)', r'maxout\(k\) with k ≥ 1')])
def test_a_wrong_parameter_is_named_with_what_is_allowed(name, message):
  with pytest.raises(ValueError, match=message):
    activations.get(name)
  with pytest.raises(ValueError, match=message):
    activations.derivative(name)


def test_spaces_in_a_name_are_ignored():
  assert activations.parse(' leaky_relu( 0.2 ) ') == ('leaky_relu', {'alpha': 0.2})
  assert activations.parse('elu (0.5)') == ('elu', {'alpha': 0.5})


def test_maxout_pieces_reads_k_of_at_least_one():
  assert activations.maxout_pieces('maxout(3)') == 3
  assert activations.maxout_pieces('maxout( 1 )') == 1
  assert activations.maxout_pieces('relu') is None and activations.maxout_pieces(jnp.tanh) is None
  for name in ('maxout(0)', 'maxout', 'maxout(-2)'):
    with pytest.raises(ValueError, match=r'maxout\(k\) with k ≥ 1'):
      activations.maxout_pieces(name)


def test_the_ends_of_the_parameter_ranges():
  # The slope of leaky_relu lies in [0, 1): 0, the ReLU, is allowed (a range (0, 1) refuses
  # it). The α of elu must be > 0: 0, a flat negative part, is refused (α ≥ 0 takes it).
  assert activations.parse('leaky_relu(0)') == ('leaky_relu', {'alpha': 0.0})
  x = _points()
  np.testing.assert_allclose(activations.get('leaky_relu(0)')(jnp.asarray(x)), np.maximum(x, 0))
  with pytest.raises(ValueError, match=r"α > 0, got '0'"):
    activations.get('elu(0)')
  with pytest.raises(ValueError, match=r"α > 0, got '0'"):
    activations.derivative('elu(0)')


def test_unknown_name_is_rejected():
  with pytest.raises(ValueError, match="'swish'"):
    activations.get('swish')
  with pytest.raises(ValueError, match="'swish'"):
    activations.derivative('swish')


@pytest.mark.parametrize('name', sorted(activations.DERIVATIVES))
@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16, jnp.float32])
def test_derivatives_keep_the_float_input_dtype(name, dtype):
  x = jnp.asarray(np.array([-3.0, -1.0, 0.5, 2.0]), dtype)
  got = activations.derivative(name)(x)
  assert got.dtype == dtype, (name, got.dtype)
  # The values are those of the float32 derivative, rounded to the input dtype.
  expected = activations.derivative(name)(x.astype(jnp.float32))
  np.testing.assert_allclose(np.asarray(got, np.float32), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('name', ['relu', 'leaky_relu'])
def test_relu_derivatives_of_integers_are_float32(name):
  got = activations.derivative(name)(jnp.array([-2, 0, 3]))
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, np.float32([0, 0, 1] if name == 'relu' else [0.01, 1, 1]))


@pytest.mark.parametrize('value', [None, 5, ('relu',)])
def test_an_activation_neither_a_name_nor_a_callable_is_refused_in_one_sentence(value):
  for fn in (activations.get, activations.derivative, activations.parse):
    message = one_sentence(lambda: fn(value), repr(value), 'relu', 'leaky_relu(α)')
    assert 'name or a callable' in message
