"""Maxout and Residual, and flax.linen's Dropout/LayerNorm/BatchNorm against the formulas of their papers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models import registry
from tests import subprocess_util

TOL = dict(rtol=1e-5, atol=1e-5)


def _normal(seed, shape, scale=1.0, shift=0.0):
  return np.random.default_rng(seed).normal(loc=shift, scale=scale, size=shape).astype(np.float32)


# Maxout (Goodfellow et al. 2013).


def test_maxout_reproduces_the_two_piece_example():
  # A two-piece example: max{x1 - 0.5 x2 + 1, -2 x1 + x2 - 2}.
  params = {'params': {'Dense_0': {'kernel': jnp.array([[1.0, -2.0], [-0.5, 1.0]]),
                                   'bias': jnp.array([1.0, -2.0])}}}
  x_Nx2 = _normal(0, (500, 2), scale=3.0)
  got = layers.Maxout(features=1, pieces=2).apply(params, x_Nx2)
  x1, x2 = x_Nx2[:, 0], x_Nx2[:, 1]
  expected = np.maximum(x1 - 0.5 * x2 + 1, -2 * x1 + x2 - 2)
  np.testing.assert_allclose(got[:, 0], expected, **TOL)


def test_maxout_equals_brute_force_loop():
  features, pieces, dim = 3, 4, 5
  model = layers.Maxout(features=features, pieces=pieces)
  x_BxD = _normal(1, (7, dim))
  variables = model.init(jax.random.key(0), x_BxD)
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  expected = np.empty((7, features))
  for n in range(7):
    for j in range(features):
      expected[n, j] = max(x_BxD[n] @ w[:, j * pieces + i] + b[j * pieces + i] for i in range(pieces))
  np.testing.assert_allclose(model.apply(variables, x_BxD), expected, **TOL)


def test_maxout_acts_on_the_last_axis_of_inputs_with_several_leading_axes():
  features, pieces = 3, 2
  model = layers.Maxout(features=features, pieces=pieces)
  x_BxTxD = _normal(18, (2, 4, 5))
  variables = model.init(jax.random.key(0), x_BxTxD)
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  expected = np.empty((2, 4, features))
  for n, t, j in np.ndindex(expected.shape):
    expected[n, t, j] = max(x_BxTxD[n, t] @ w[:, j * pieces + i] + b[j * pieces + i]
                            for i in range(pieces))
  np.testing.assert_allclose(model.apply(variables, x_BxTxD), expected, **TOL)


@pytest.mark.parametrize('alpha', [0.0, 0.05])
def test_maxout_generalises_relu_and_leaky_relu(alpha):
  # Pieces (w, b) and α(w, b): max{z, αz} is the (leaky) ReLU of z.
  w_Dx1 = _normal(2, (3, 1))
  b_1 = _normal(3, (1,))
  params = {'params': {'Dense_0': {'kernel': jnp.concatenate([w_Dx1, alpha * w_Dx1], axis=1),
                                   'bias': jnp.concatenate([b_1, alpha * b_1])}}}
  x_BxD = _normal(4, (64, 3), scale=2.0)
  z = x_BxD @ w_Dx1 + b_1
  np.testing.assert_allclose(layers.Maxout(1, 2).apply(params, x_BxD), np.maximum(z, alpha * z), **TOL)


# A fractional size failed on the Dense layer's shape (TypeError).
@pytest.mark.parametrize('features,pieces', [(0, 2), (3, 0), (2.5, 2), (3, 1.5)])
def test_maxout_rejects_empty_sizes(features, pieces):
  with pytest.raises(ValueError, match='positive integer'):
    layers.Maxout(features, pieces).init(jax.random.key(0), jnp.ones((1, 2)))


# Residual (He et al. 2016: x(l+1) = f(x(l)) + x(l)).


def test_residual_adds_the_input_to_the_branch():
  model = layers.Residual(nn.Dense(4))
  x_BxD = _normal(5, (6, 4))
  variables = model.init(jax.random.key(1), x_BxD)
  dense = variables['params']['fn']
  expected = x_BxD + x_BxD @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])
  np.testing.assert_allclose(model.apply(variables, x_BxD), expected, **TOL)


def test_residual_jacobian_is_identity_plus_branch_jacobian():
  a_DxD = jnp.asarray(_normal(6, (3, 3)))
  branch = lambda x: jnp.tanh(x @ a_DxD)
  x_D = jnp.asarray(_normal(7, (3,)))
  jac = jax.jacobian(lambda x: layers.Residual(branch).apply({}, x))(x_D)
  np.testing.assert_allclose(jac, np.eye(3) + jax.jacobian(branch)(x_D), **TOL)


def test_residual_with_a_zero_branch_is_the_identity_and_passes_arguments():
  x = _normal(8, (2, 3))
  out = layers.Residual(lambda h, *, scale: 0 * scale * h).apply({}, x, scale=3.0)
  np.testing.assert_array_equal(out, x)


def test_residual_rejects_a_shape_changing_branch():
  with pytest.raises(ValueError, match='keep the shape'):
    layers.Residual(nn.Dense(5)).init(jax.random.key(0), jnp.ones((2, 3)))


# Dropout (Srivastava et al. 2014), inverted: h = r ⊙ x / (1 - p), r_i ~ Bernoulli(1 - p).


@pytest.mark.parametrize('rate', [0.1, 0.5, 0.8])
def test_dropout_is_inverted_dropout(rate):
  x = jnp.asarray(_normal(9, (200, 500)))
  layer = nn.Dropout(rate)
  key = jax.random.key(3)
  y = np.asarray(layer.apply({}, x, deterministic=False, rngs={'dropout': key}))
  kept = y != 0
  np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / (1 - rate), rtol=1e-6)
  # Keep fraction ≈ 1 - p within five binomial standard deviations.
  n = x.size
  assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
  # Deterministic for a given key, different for another key.
  np.testing.assert_array_equal(layer.apply({}, x, deterministic=False, rngs={'dropout': key}), y)
  other = layer.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(4)})
  assert np.mean(np.asarray(other) != y) > 0.01
  # Identity at inference: no scaling by (1 - p) is needed.
  np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)


def test_dropout_preserves_the_expected_activation():
  rate, samples = 0.5, 4000
  x = jnp.asarray(_normal(10, (8,), shift=1.0))
  keys = jax.random.split(jax.random.key(5), samples)
  drop = jax.vmap(lambda k: nn.Dropout(rate).apply({}, x, deterministic=False, rngs={'dropout': k}))
  mean = np.asarray(drop(keys)).mean(axis=0)
  std_of_mean = np.abs(np.asarray(x)) * np.sqrt(rate / (1 - rate) / samples)
  assert np.all(np.abs(mean - np.asarray(x)) < 5 * std_of_mean)


# LayerNorm: γ ⊙ (x - μ)/sqrt(σ² + ε) + β, statistics over features per example.


def _layer_norm_reference(x, scale, bias, axes, eps):
  x = np.asarray(x, np.float64)
  mu = x.mean(axis=axes, keepdims=True)
  var = x.var(axis=axes, keepdims=True)
  return scale * (x - mu) / np.sqrt(var + eps) + bias


def test_layer_norm_over_features_equals_its_formula():
  x_BxD = _normal(11, (5, 16), scale=3.0, shift=2.0)
  scale, bias = _normal(12, (16,)), _normal(13, (16,))
  got = nn.LayerNorm(epsilon=1e-6).apply({'params': {'scale': scale, 'bias': bias}}, x_BxD)
  np.testing.assert_allclose(got, _layer_norm_reference(x_BxD, scale, bias, -1, 1e-6), **TOL)


def test_layer_norm_over_all_non_batch_axes_equals_its_formula():
  # Ba et al. 2016: mean and variance over T_{b,•,•}, with γ_{n,c}, β_{n,c}.
  x_BxNxC = _normal(14, (4, 3, 5), scale=2.0, shift=-1.0)
  scale, bias = _normal(15, (3, 5)), _normal(16, (3, 5))
  layer = nn.LayerNorm(epsilon=1e-6, reduction_axes=(1, 2), feature_axes=(1, 2))
  got = layer.apply({'params': {'scale': scale, 'bias': bias}}, x_BxNxC)
  np.testing.assert_allclose(got, _layer_norm_reference(x_BxNxC, scale, bias, (1, 2), 1e-6), **TOL)


def test_layer_norm_ignores_the_batch_so_training_and_inference_agree():
  x_BxD = _normal(17, (6, 8), scale=2.0)
  layer = nn.LayerNorm()
  variables = layer.init(jax.random.key(0), x_BxD)
  batched = layer.apply(variables, x_BxD)
  one_at_a_time = np.stack([layer.apply(variables, x_BxD[i:i + 1])[0] for i in range(6)])
  np.testing.assert_allclose(batched, one_at_a_time, **TOL)


# BatchNorm: batch statistics in training, running averages at inference.


def _batch_norm_reference(x, mean, var, scale, bias, eps=1e-5):
  return scale * (np.asarray(x, np.float64) - mean) / np.sqrt(var + eps) + bias


def test_batch_norm_training_uses_batch_statistics_and_updates_running_averages():
  momentum = 0.9
  layer = nn.BatchNorm(use_running_average=False, momentum=momentum)
  batches = [_normal(20 + i, (16, 4), scale=1.0 + i, shift=i - 1.0) for i in range(3)]
  variables = layer.init(jax.random.key(0), batches[0])
  scale, bias = _normal(30, (4,)), _normal(31, (4,))
  params = {'scale': scale, 'bias': bias}
  stats = variables['batch_stats']
  running_mean, running_var = np.zeros(4), np.ones(4)
  for x_BxC in batches:
    y, updates = layer.apply({'params': params, 'batch_stats': stats}, x_BxC, mutable=['batch_stats'])
    x64 = x_BxC.astype(np.float64)
    np.testing.assert_allclose(y, _batch_norm_reference(x64, x64.mean(0), x64.var(0), scale, bias), **TOL)
    running_mean = momentum * running_mean + (1 - momentum) * x64.mean(0)
    running_var = momentum * running_var + (1 - momentum) * x64.var(0)
    stats = updates['batch_stats']
    np.testing.assert_allclose(stats['mean'], running_mean, **TOL)
    np.testing.assert_allclose(stats['var'], running_var, **TOL)
  # At inference the layer is the affine map fixed by the running averages.
  x_test = _normal(40, (3, 4))
  inference = nn.BatchNorm(use_running_average=True).apply({'params': params, 'batch_stats': stats}, x_test)
  np.testing.assert_allclose(inference, _batch_norm_reference(x_test, running_mean, running_var, scale, bias),
                             **TOL)
  single = nn.BatchNorm(use_running_average=True).apply({'params': params, 'batch_stats': stats}, x_test[:1])
  np.testing.assert_allclose(single, inference[:1], **TOL)


def test_batch_norm_on_nhwc_feature_maps_uses_per_channel_statistics():
  x_BxHxWxC = _normal(41, (4, 5, 5, 3), scale=2.0, shift=1.5)
  layer = nn.BatchNorm(use_running_average=False)
  variables = layer.init(jax.random.key(0), x_BxHxWxC)
  y, updates = layer.apply(variables, x_BxHxWxC, mutable=['batch_stats'])
  x64 = x_BxHxWxC.astype(np.float64)
  mean_C, var_C = x64.mean(axis=(0, 1, 2)), x64.var(axis=(0, 1, 2))
  np.testing.assert_allclose(y, _batch_norm_reference(x64, mean_C, var_C, 1.0, 0.0), **TOL)
  np.testing.assert_allclose(updates['batch_stats']['mean'], 0.01 * mean_C, **TOL)


def test_batch_norm_per_position_equals_its_formula():
  # Ioffe & Szegedy 2015: (T_{b,n,c} - mean(T_{•,n,c})) / sqrt(var(T_{•,n,c}) + ε).
  x_BxNxC = _normal(42, (6, 3, 4), scale=3.0)
  layer = nn.BatchNorm(use_running_average=False, axis=(1, 2), use_scale=False, use_bias=False)
  y, _ = layer.apply(layer.init(jax.random.key(0), x_BxNxC), x_BxNxC, mutable=['batch_stats'])
  x64 = x_BxNxC.astype(np.float64)
  np.testing.assert_allclose(y, _batch_norm_reference(x64, x64.mean(0), x64.var(0), 1.0, 0.0), **TOL)


_SHARDED_BATCH_NORM = """
import json
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from models.mlp import MLP

mesh = jax.make_mesh((8,), ('data',))
x = jax.random.normal(jax.random.key(0), (32, 3, 3, 4)) * 2.0 + 1.0
key = jax.random.key(1)

def max_diff(a, b):
  return float(max(np.max(np.abs(np.asarray(u) - np.asarray(v)))
                   for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))))

def compare(full, distributed, inputs, stats_spec=P()):
  variables = full.init(key, inputs, train=False) if isinstance(full, MLP) else full.init(key, inputs)
  kwargs = {'train': True} if isinstance(full, MLP) else {}
  y_full, stats_full = full.apply(variables, inputs, mutable=['batch_stats'], **kwargs)
  step = lambda v, xs: distributed.apply(v, xs, mutable=['batch_stats'], **kwargs)
  sharded = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P('data')), out_specs=(P('data'), stats_spec)))
  # The mesh axis is explicit, so the arguments are placed as the in_specs say.
  y_dist, stats_dist = sharded(jax.device_put(variables, NamedSharding(mesh, P())),
                               jax.device_put(inputs, NamedSharding(mesh, P('data'))))
  stats_gap = max_diff(stats_full, stats_dist) if stats_spec == P() else None
  return max_diff(y_full, y_dist), stats_gap

# With momentum 0 the stored running statistics are exactly the batch statistics.
bn = dict(use_running_average=False, momentum=0.0)
out_bn, stats_bn = compare(nn.BatchNorm(**bn), nn.BatchNorm(axis_name='data', **bn), x)
# Per-device statistics differ between devices, so they come back stacked.
out_local, _ = compare(nn.BatchNorm(**bn), nn.BatchNorm(**bn), x, stats_spec=P('data'))
flat = x.reshape(32, -1)
out_mlp, stats_mlp = compare(MLP((8, 8, 3), batch_norm=True), MLP((8, 8, 3), batch_norm=True,
                                                                   batch_norm_axis_name='data'), flat)
print(json.dumps(dict(devices=jax.device_count(), out_bn=out_bn, stats_bn=stats_bn, out_local=out_local,
                      out_mlp=out_mlp, stats_mlp=stats_mlp)))
"""


def test_cross_device_batch_norm_equals_full_batch_batch_norm():
  result = subprocess_util.run_python(_SHARDED_BATCH_NORM, devices=8)
  assert result['devices'] == 8
  # nn.BatchNorm(axis_name='data') under shard_map: statistics averaged over devices.
  assert result['out_bn'] < 1e-5 and result['stats_bn'] < 1e-5, result
  assert result['out_mlp'] < 1e-5 and result['stats_mlp'] < 1e-5, result
  # Without the axis name every device normalises its own 4 examples.
  assert result['out_local'] > 1e-2, result


@pytest.mark.parametrize('name, options, init_shape, wrong_shape, expected', [
    ('lenet5', {}, (1, 32, 32, 1), (1, 32, 32, 3),
     'LeNet5 was initialised on inputs of 1 channels, got inputs of 3'),
    ('alexnet', {}, (1, 28, 28, 1), (1, 28, 28, 3),
     'AlexNet was initialised on inputs of 1 channels, got inputs of 3'),
    ('resnet20', {}, (1, 8, 8, 3), (1, 8, 8, 1),
     'ResNet20 was initialised on inputs of 3 channels, got inputs of 1'),
    ('vit', {'patch_size': 4, 'num_layers': 1, 'features': 8, 'num_heads': 2}, (1, 8, 8, 1),
     (1, 8, 8, 3), 'ViT was initialised on inputs of 1 channels, got inputs of 3'),
    ('cnn1d', {}, (1, 40, 1), (1, 40, 3),
     'CNN1D was initialised on inputs of 1 channels, got inputs of 3'),
    ('mlp', {'features': (8, 10)}, (1, 8, 8, 1), (1, 8, 8, 3),
     r'MLP was initialised on inputs of 64 features \(after flattening\), got inputs of 192'),
])
def test_inputs_of_another_width_than_at_init_are_one_sentence(name, options, init_shape,
                                                                 wrong_shape, expected):
  # Flax used to stop on the first kernel's shape (ScopeParamShapeError), naming a layer.
  options = options if name == 'mlp' else {'num_classes': 10, **options}
  model = registry.build(name, **options)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(init_shape)))
  with pytest.raises(ValueError, match=expected + '; give it inputs like those of init.'):
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros(wrong_shape)), variables)
  assert jax.eval_shape(lambda v: model.apply(v, jnp.zeros(init_shape)), variables).shape == (1, 10)


def test_a_unet_given_another_channel_count_than_at_init_is_one_sentence():
  model = registry.build('unet', channels=8, channel_mults=(1, 2), attention_resolutions=(),
                         num_groups=4)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)),
                                                jnp.zeros((1,))))
  with pytest.raises(ValueError, match='UNet was initialised on inputs of 1 channels, got inputs '
                                       'of 3; give it inputs like those of init.'):
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((1, 8, 8, 3)), jnp.zeros((1,))), variables)
