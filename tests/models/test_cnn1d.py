"""The MNIST-1D convolutional classifier against a NumPy forward pass written from its equation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.vision.cnn1d import CNN1D


def _numpy_forward(params, x_BxT, strides, padding, pooling='flatten', batch_norm=None,
                   batch_stats=None):
  """batch_norm: None, 'batch' (train: statistics of this batch) or 'running' (eval: init stats 0, 1).
  A list `batch_stats` receives each layer's batch (mean, variance)."""
  h = x_BxT[:, :, None].astype(np.float64)
  for layer, stride in enumerate(strides):
    kernel = np.asarray(params[f'Conv_{layer}']['kernel'], np.float64)  # [k, C_in, C_out]
    k = kernel.shape[0]
    padded = np.pad(h, ((0, 0), (padding, padding), (0, 0)))
    length = (h.shape[1] + 2 * padding - k) // stride + 1  # ⌊(n + 2p − k)/s⌋ + 1
    out = np.zeros((h.shape[0], length, kernel.shape[2]))
    for t in range(length):
      for j in range(k):  # cross-correlation: tap j reads position s·t + j − p
        out[:, t] += padded[:, stride * t + j] @ kernel[j]
    if batch_norm is None:
      out += np.asarray(params[f'Conv_{layer}']['bias'], np.float64)
    else:  # y = γ (x − μ) / √(σ² + ε) + β, μ and σ² per channel over batch and positions
      norm = params[f'BatchNorm_{layer}']
      mean, var = (out.mean((0, 1)), out.var((0, 1))) if batch_norm == 'batch' else (0.0, 1.0)
      if batch_stats is not None:
        batch_stats.append((mean, var))
      out = np.asarray(norm['scale']) * (out - mean) / np.sqrt(var + 1e-5) + np.asarray(norm['bias'])
    h = np.maximum(out, 0)
  z = {'flatten': lambda: h.reshape(h.shape[0], -1), 'mean': lambda: h.mean(1), 'max': lambda: h.max(1)}[pooling]()
  dense = params['Dense_0']
  return z @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])


def test_logits_equal_the_equation_and_the_published_layout():
  model = CNN1D()
  x = np.random.default_rng(0).normal(size=(3, 40)).astype(np.float32)
  params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 40)))['params']
  # Lengths 40 → 19 → 10 → 5 with 25 channels: a 125-wide classifier.
  assert params['Dense_0']['kernel'].shape == (125, 10)
  assert sum(p.size for p in jax.tree.leaves(params)) == 150 + 1900 + 1900 + 1260
  np.testing.assert_allclose(model.apply({'params': params}, x),
                             _numpy_forward(params, x, (2, 2, 2), 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('pooling', ['mean', 'max'])
def test_global_pooling_reduces_over_positions(pooling):
  model = CNN1D(channels=(8, 16, 32), pooling=pooling)
  x = np.random.default_rng(2).normal(size=(4, 40)).astype(np.float32)
  params = model.init(jax.random.PRNGKey(3), jnp.zeros((1, 40)))['params']
  # Convolutions (5·1+1)·8, (3·8+1)·16, (3·16+1)·32; the head sees 32 features, not 5·32.
  assert params['Dense_0']['kernel'].shape == (32, 10)
  assert sum(p.size for p in jax.tree.leaves(params)) == 48 + 400 + 1568 + 330
  logits = model.apply({'params': params}, x)
  np.testing.assert_allclose(logits, _numpy_forward(params, x, (2, 2, 2), 1, pooling),
                             rtol=1e-4, atol=1e-5)
  # The same convolutions flattened: 5 positions · 32 channels reach the head.
  flat = CNN1D(channels=(8, 16, 32)).init(jax.random.PRNGKey(3), jnp.zeros((1, 40)))['params']
  assert flat['Dense_0']['kernel'].shape == (160, 10)


def test_batch_norm_normalises_with_batch_statistics_in_training_and_running_ones_in_eval():
  model = CNN1D(channels=(6, 6, 6), batch_norm=True)
  x = np.random.default_rng(4).normal(size=(5, 40)).astype(np.float32)
  variables = model.init(jax.random.PRNGKey(5), jnp.zeros((1, 40)))
  params = variables['params']
  assert 'bias' not in params['Conv_0']  # BN's offset β replaces the bias
  # Kernels 5·1·6, 3·6·6, 3·6·6; γ and β per BN channel; head 30·10 + 10.
  assert sum(p.size for p in jax.tree.leaves(params)) == 30 + 108 + 108 + 3 * 12 + 310
  assert jax.tree.map(jnp.shape, variables['batch_stats']['BatchNorm_2']) == {'mean': (6,), 'var': (6,)}
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(6), p.shape), params)
  logits, updates = model.apply({'params': params, 'batch_stats': variables['batch_stats']}, x,
                                train=True, mutable=['batch_stats'])
  batch_stats = []
  np.testing.assert_allclose(logits, _numpy_forward(params, x, (2, 2, 2), 1, batch_norm='batch',
                                                    batch_stats=batch_stats),
                             rtol=1e-4, atol=1e-4)
  # Running statistics move 10% of the way to the batch's (momentum 0.9) from their start at
  # mean 0 and variance 1: 0.1·μ and 0.9 + 0.1·σ² (the biased variance over batch and positions).
  for layer, (mean, var) in enumerate(batch_stats):
    running = updates['batch_stats'][f'BatchNorm_{layer}']
    np.testing.assert_allclose(running['mean'], 0.1 * mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(running['var'], 0.9 + 0.1 * var, rtol=1e-4, atol=1e-6)
  eval_logits = model.apply({'params': params, 'batch_stats': variables['batch_stats']}, x)
  np.testing.assert_allclose(eval_logits, _numpy_forward(params, x, (2, 2, 2), 1, batch_norm='running'),
                             rtol=1e-4, atol=1e-4)


def test_batch_norm_axis_name_averages_statistics_over_the_mapped_axis():
  # Two shards of three examples under vmap(axis_name) normalise with the statistics of the whole
  # batch of six, and store its running averages; without the axis name each shard uses its own.
  x = np.random.default_rng(8).normal(size=(6, 40)).astype(np.float32)
  model = CNN1D(channels=(4, 4), kernel_sizes=(5, 3), strides=(2, 2), batch_norm=True)
  variables = model.init(jax.random.PRNGKey(9), jnp.zeros((1, 40)))
  whole, whole_stats = model.apply(variables, x, train=True, mutable=['batch_stats'])
  np.testing.assert_allclose(whole, _numpy_forward(variables['params'], x, (2, 2), 1,
                                                   pooling='flatten', batch_norm='batch'),
                             rtol=1e-4, atol=1e-4)
  for axis_name, same in (('shards', True), (None, False)):
    sharded = CNN1D(channels=(4, 4), kernel_sizes=(5, 3), strides=(2, 2), batch_norm=True,
                    batch_norm_axis_name=axis_name)
    apply = lambda x: sharded.apply(variables, x, train=True, mutable=['batch_stats'])
    logits, stats = jax.vmap(apply, axis_name='shards')(x.reshape(2, 3, 40))
    assert np.allclose(logits.reshape(6, 10), whole, rtol=1e-4, atol=1e-5) == same
    if same:
      jax.tree.map(lambda s, w: np.testing.assert_allclose(s[0], w, rtol=1e-4, atol=1e-6),
                   stats['batch_stats'], whole_stats['batch_stats'])


def test_dropout_acts_only_in_training_and_rescales_the_kept_features():
  model = CNN1D(pooling='max', dropout_rate=0.5)
  x = np.random.default_rng(7).normal(size=(64, 40)).astype(np.float32)
  params = model.init(jax.random.PRNGKey(8), jnp.zeros((1, 40)))['params']
  plain = CNN1D(pooling='max').apply({'params': params}, x)
  np.testing.assert_allclose(model.apply({'params': params}, x), plain, rtol=1e-6)
  # With the head's kernel set to the identity on feature 0, a train logit is either
  # 0 (dropped) or 2·z_0 (kept, scaled by 1/(1 − 0.5)).
  head = {'kernel': jnp.zeros((25, 10)).at[0, 0].set(1.0), 'bias': jnp.zeros(10)}
  params = {**params, 'Dense_0': head}
  z0 = np.asarray(CNN1D(pooling='max').apply({'params': params}, x))[:, 0]
  dropped = np.asarray(model.apply({'params': params}, x, train=True,
                                   rngs={'dropout': jax.random.PRNGKey(9)}))[:, 0]
  kept = np.isclose(dropped, 2 * z0, rtol=1e-5)
  assert np.all(kept | (dropped == 0)) and 0 < kept[z0 > 0].mean() < 1


def test_bfloat16_compute_keeps_float32_params_and_logits():
  options = dict(channels=(6, 6), kernel_sizes=(5, 3), strides=(2, 2), batch_norm=True)
  model, reference = CNN1D(**options, dtype=jnp.bfloat16), CNN1D(**options)
  x = np.random.default_rng(10).normal(size=(4, 40)).astype(np.float32)
  variables = reference.init(jax.random.PRNGKey(11), jnp.zeros((1, 40)))
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(11), jnp.zeros((1, 40)))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(shapes))
  logits, state = model.apply(variables, x, capture_intermediates=True, mutable=['intermediates'])
  assert logits.dtype == jnp.float32
  # Every convolution and BatchNorm, and the head, compute in bfloat16 (8 significant bits).
  outputs = {jax.tree_util.keystr(path[:1]): a.dtype
             for path, a in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]
             if len(path) > 2}
  assert sorted(outputs) == sorted(f"['{name}']" for name in
                                   ('Conv_0', 'Conv_1', 'BatchNorm_0', 'BatchNorm_1', 'Dense_0'))
  assert all(dtype == jnp.bfloat16 for dtype in outputs.values()), outputs
  expected = reference.apply(variables, x)
  difference = np.max(np.abs(logits - expected))
  assert 0 < difference < 0.05 * np.max(np.abs(expected)), difference


@pytest.mark.parametrize('options, fragment', [
    (dict(channels=(8, 8), kernel_sizes=(3,), strides=(1, 1)), 'as many kernel_sizes'),
    (dict(channels=(8, 0, 8)), 'channels must be positive'),
    (dict(padding=-1), 'padding must be an integer >= 0'),
    (dict(pooling='avg'), "Unknown CNN1D pooling 'avg'"),
    (dict(dropout_rate=1.0), r'dropout_rate must lie in \[0, 1\)'),
    # A dropout rate that is no number failed comparing it with 0 (TypeError); a width or kernel
    # size given as one integer instead of one per convolution failed in len() (TypeError).
    (dict(dropout_rate='0.1'), r"dropout_rate must lie in \[0, 1\), got '0.1'"),
    (dict(dropout_rate=None), r'dropout_rate must lie in \[0, 1\), got None'),
    (dict(channels=25),
     'CNN1D channels must be a sequence with one integer per convolution, got 25'),
    (dict(kernel_sizes=3),
     'CNN1D kernel_sizes must be a sequence with one integer per convolution, got 3'),
])
def test_bad_options_are_one_sentence(options, fragment):
  with pytest.raises(ValueError, match=fragment) as info:
    CNN1D(**options)
  assert '\n' not in str(info.value)


@pytest.mark.parametrize('pooling', ['flatten', 'mean', 'max'])
def test_an_input_the_convolutions_shrink_to_nothing_is_refused(pooling):
  # Mean pooling returned NaN logits and the other poolings failed with unrelated errors.
  model = CNN1D(num_classes=3, channels=(4, 4), kernel_sizes=(3, 3), strides=(2, 2), padding=0,
                pooling=pooling)
  with pytest.raises(ValueError, match=r'CNN1D: an input of length 4 leaves no positions after '
                                       r'the convolutions \(kernel_sizes=\(3, 3\), strides=\(2, 2\), '
                                       r'padding=0\)') as info:
    model.init(jax.random.PRNGKey(0), jnp.zeros((2, 4)))
  assert '\n' not in str(info.value)
  model.init(jax.random.PRNGKey(0), jnp.zeros((2, 7)))  # 7 → 3 → 1 position: accepted


def test_inputs_of_another_length_or_channel_count_than_at_init_are_one_sentence():
  # Flattened, the head has a row per position and channel of the inputs of init (5 · 4 = 20
  # for length 40); Flax refused other lengths and channel counts on a kernel's shape
  # (ScopeParamShapeError). Mean pooling takes any length.
  model = CNN1D(num_classes=3, channels=(4, 4), kernel_sizes=(5, 3), strides=(2, 4))
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((2, 40))))
  assert variables['params']['Dense_0']['kernel'].shape == (20, 3)
  with pytest.raises(ValueError) as info:  # 60 → 29 → 8 positions
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 60))), variables)
  assert str(info.value).splitlines()[0] == (
      'CNN1D: an input of length 60 leaves 8 positions of 4 channels (32 features) for the head, '
      'but it was made for 20 at init; give inputs of the length it was initialised with.')
  with pytest.raises(ValueError) as info:
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 40, 3))), variables)
  assert str(info.value).splitlines()[0] == (
      'CNN1D was initialised on inputs of 1 channels, got inputs of 3; give it inputs like those '
      'of init.')
  assert jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 40, 1))), variables).shape == (2, 3)
  mean = CNN1D(num_classes=3, channels=(4, 4), kernel_sizes=(5, 3), strides=(2, 4), pooling='mean')
  variables = jax.eval_shape(lambda: mean.init(jax.random.PRNGKey(0), jnp.zeros((2, 40))))
  assert jax.eval_shape(lambda v: mean.apply(v, jnp.zeros((2, 60))), variables).shape == (2, 3)
