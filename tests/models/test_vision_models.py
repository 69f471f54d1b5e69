"""LeNet-5, AlexNet and ResNet against independent references: parameter counts from
the layer formulas and the published tables (LeCun et al. 1998; He et al. 2016 Table 6;
torchvision), float64 NumPy forward passes of LeNet-5, AlexNet, the residual blocks and a
whole ResNet (stems included) with random BatchNorm parameters and statistics, closed-form
block outputs at zero-initialised residuals, BatchNorm running statistics from the batch
moments, dropout and dtype properties, and the one-sentence option errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from models import registry
from models.vision import resnet
from models.vision.alexnet import AlexNet
from models.vision.lenet import LeNet5


def _param_count(model, input_shape):
  # eval_shape: no parameter array is materialised, so ResNet-50 costs nothing.
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(input_shape, jnp.float32))
  return sum(leaf.size for leaf in jax.tree.leaves(variables['params']))


def _conv_params(kernel, c_in, c_out, bias=True):
  return kernel * kernel * c_in * c_out + (c_out if bias else 0)


def _dense_params(d_in, d_out):
  return d_in * d_out + d_out


def _redraw(variables, draws, seed=0):
  """Replaces every leaf named like a key of `draws` by draws[name](rng, shape), in float32."""
  rng = np.random.default_rng(seed)
  redraw = lambda path, a: (jnp.asarray(draws[path[-1].key](rng, a.shape), jnp.float32)
                            if path[-1].key in draws else a)
  return jax.tree_util.tree_map_with_path(redraw, variables)


def _relu(a):
  return np.maximum(a, 0)


def _numpy_conv(h_BxHxWxC, kernel_KxKxCxF, strides=1, padding=0):
  """Cross-correlation in float64 with stride s = `strides`,
  y[b, i, j, f] = Σ_{a, a', c} x̃[b, s·i + a, s·j + a', c] k[a, a', c, f],
  x̃ being the input zero-padded by `padding` on every side."""
  p = padding
  h = np.pad(np.asarray(h_BxHxWxC, np.float64), ((0, 0), (p, p), (p, p), (0, 0)))
  k = kernel_KxKxCxF.shape[0]
  windows = sliding_window_view(h, (k, k), axis=(1, 2))[:, ::strides, ::strides]  # B×H'×W'×C×K×K
  return np.einsum('bhwcij,ijcf->bhwf', windows, np.asarray(kernel_KxKxCxF, np.float64))


def _numpy_max_pool(h_BxHxWxC, lo, hi):
  """Maxima of 3×3 windows with stride 2, h padded with −∞ by lo rows/columns before, hi after."""
  h = np.pad(h_BxHxWxC, ((0, 0), (lo, hi), (lo, hi), (0, 0)), constant_values=-np.inf)
  return sliding_window_view(h, (3, 3), axis=(1, 2))[:, ::2, ::2].max(axis=(-2, -1))


# ---------------------------------------------------------------------------- LeNet-5


def test_lenet5_parameter_count_is_61706():
  # C1 (5·5·1+1)·6, C3 (5·5·6+1)·16 (full connectivity), C5 (5·5·16+1)·120, F6, output.
  expected = (_conv_params(5, 1, 6) + _conv_params(5, 6, 16) + _conv_params(5, 16, 120)
              + _dense_params(120, 84) + _dense_params(84, 10))
  assert expected == 61_706
  assert _param_count(LeNet5(10), (1, 32, 32, 1)) == expected


def _numpy_lenet5(params, x_BxHxWxC, phi):
  """LeNet-5 in float64 NumPy: valid cross-correlations and 2×2 means."""
  def conv(h, layer):
    return _numpy_conv(h, layer['kernel']) + np.asarray(layer['bias'], np.float64)

  def pool(h):
    b, hh, ww, c = h.shape
    return h.reshape(b, hh // 2, 2, ww // 2, 2, c).mean(axis=(2, 4))

  h = np.asarray(x_BxHxWxC, np.float64)
  h = pool(phi(conv(h, params['Conv_0'])))
  h = pool(phi(conv(h, params['Conv_1'])))
  h = phi(conv(h, params['Conv_2'])).reshape(h.shape[0], -1)
  dense = lambda h, layer: h @ np.asarray(layer['kernel'], np.float64) + np.asarray(layer['bias'], np.float64)
  return dense(phi(dense(h, params['Dense_0'])), params['Dense_1'])


@pytest.mark.parametrize('activation, phi', [('tanh', np.tanh), ('relu', _relu)])
def test_lenet5_matches_numpy_forward_pass(activation, phi):
  model = LeNet5(10, activation=activation)
  x_Bx32x32x1 = jax.random.normal(jax.random.key(0), (2, 32, 32, 1))
  variables = model.init(jax.random.key(1), x_Bx32x32x1)
  logits_BxK = model.apply(variables, x_Bx32x32x1)
  assert logits_BxK.shape == (2, 10) and logits_BxK.dtype == jnp.float32
  np.testing.assert_allclose(logits_BxK, _numpy_lenet5(variables['params'], x_Bx32x32x1, phi),
                             rtol=1e-4, atol=1e-4)


def test_lenet5_padding_makes_28x28_the_padded_32x32_network():
  x_Bx28x28x1 = jax.random.normal(jax.random.key(0), (2, 28, 28, 1))
  padded_Bx32x32x1 = jnp.pad(x_Bx28x28x1, ((0, 0), (2, 2), (2, 2), (0, 0)))
  variables = LeNet5(10).init(jax.random.key(1), padded_Bx32x32x1)
  np.testing.assert_allclose(LeNet5(10, padding=2).apply(variables, x_Bx28x28x1),
                             LeNet5(10).apply(variables, padded_Bx32x32x1), rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match='needs 32×32 images after padding by 0, got 28×28'):
    LeNet5(10).init(jax.random.key(1), x_Bx28x28x1)


# ---------------------------------------------------------------------------- AlexNet


@pytest.mark.parametrize('input_shape, final_map', [((2, 28, 28, 1), 4), ((2, 32, 32, 3), 4),
                                                    ((2, 64, 64, 3), 8)])
def test_alexnet_shapes_and_parameter_count(input_shape, final_map):
  m = 0.25
  model = AlexNet(10, width_multiplier=m)
  c = [round(w * m) for w in (64, 192, 384, 256, 256)]
  d = [round(w * m) for w in (1024, 1024)]
  expected = (_conv_params(3, input_shape[-1], c[0]) + _conv_params(5, c[0], c[1]) + _conv_params(3, c[1], c[2])
              + _conv_params(3, c[2], c[3]) + _conv_params(3, c[3], c[4])
              + _dense_params(final_map * final_map * c[4], d[0]) + _dense_params(d[0], d[1])
              + _dense_params(d[1], 10))
  assert _param_count(model, input_shape) == expected
  if input_shape[1] <= 32:  # Keep the forward passes tiny; the 64-pixel one is checked by count.
    x = jax.random.normal(jax.random.key(0), input_shape)
    variables = model.init(jax.random.key(1), x)
    logits_BxK = model.apply(variables, x)
    assert logits_BxK.shape == (2, 10) and logits_BxK.dtype == jnp.float32


def test_alexnet_dropout_only_in_training():
  x_Bx32x32x3 = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  model = AlexNet(10, width_multiplier=0.125)
  variables = model.init(jax.random.key(1), x_Bx32x32x3)
  train = lambda seed, m=model: m.apply(variables, x_Bx32x32x3, train=True, rngs={'dropout': jax.random.key(seed)})
  # Without dropout, training and evaluation compute the same function (no other train-only path).
  np.testing.assert_allclose(train(2, AlexNet(10, width_multiplier=0.125, dropout_rate=0.0)),
                             model.apply(variables, x_Bx32x32x3), rtol=1e-6, atol=1e-6)
  assert not np.allclose(train(2), train(3))
  assert not np.allclose(train(2), model.apply(variables, x_Bx32x32x3))
  # Evaluation needs no dropout key and is deterministic.
  np.testing.assert_array_equal(model.apply(variables, x_Bx32x32x3), model.apply(variables, x_Bx32x32x3))


def test_alexnet_dropout_is_on_the_inputs_of_the_first_two_dense_layers():
  """h = φ(W₆ d₁(flatten h)), h = φ(W₇ d₂(h)), logits = W₈ h: dᵢ keeps a unit with probability
  1 − p and scales it by 1 / (1 − p); the output layer reads h undropped."""
  rate = 0.25
  x_Bx32x32x3 = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  model = AlexNet(10, width_multiplier=0.125, dropout_rate=rate)
  variables = model.init(jax.random.key(1), x_Bx32x32x3)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  _, evaluated = model.apply(variables, x_Bx32x32x3, capture_intermediates=True)
  logits, trained = model.apply(variables, x_Bx32x32x3, train=True, capture_intermediates=True,
                                rngs={'dropout': jax.random.key(2)})
  h_BxF = np.asarray(evaluated['intermediates']['Dropout_0']['__call__'][0], np.float64)
  assert h_BxF.shape == (2, 4 * 4 * 32)  # the flattened last feature map
  for index in range(2):
    dropped = np.asarray(trained['intermediates'][f'Dropout_{index}']['__call__'][0], np.float64)
    kept = dropped != 0  # (a unit that ReLU set to 0 stays 0 either way)
    assert 0.5 < kept[h_BxF != 0].mean() < 0.95
    np.testing.assert_allclose(dropped[kept], h_BxF[kept] / (1 - rate), rtol=1e-5, atol=1e-6)
    dense = p[f'Dense_{index}']
    h_BxF = _relu(dropped @ dense['kernel'] + dense['bias'])
  np.testing.assert_allclose(logits, h_BxF @ p['Dense_2']['kernel'] + p['Dense_2']['bias'],
                             rtol=1e-4, atol=1e-5)


def _numpy_alexnet(params, x_BxHxWxC):
  """AlexNet in float64 NumPy (evaluation: no dropout): 'SAME' convolutions of sizes 3, 5, 3, 3, 3,
  each followed by ReLU, 3×3/2 'SAME' max pooling after conv1, conv2 and conv5, 3 dense layers."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

  def pool(h):
    # 'SAME': ⌈n/2⌉ outputs, total padding (⌈n/2⌉ − 1)·2 + 3 − n, the smaller half before.
    n = h.shape[1]
    total = max((-(-n // 2) - 1) * 2 + 3 - n, 0)
    return _numpy_max_pool(h, total // 2, total - total // 2)

  h = x_BxHxWxC
  for index, size in enumerate((3, 5, 3, 3, 3)):
    layer = p[f'Conv_{index}']
    h = _relu(_numpy_conv(h, layer['kernel'], padding=size // 2) + layer['bias'])
    if index in (0, 1, 4):
      h = pool(h)
  h_BxF = h.reshape(h.shape[0], -1)
  for index in range(2):
    h_BxF = _relu(h_BxF @ p[f'Dense_{index}']['kernel'] + p[f'Dense_{index}']['bias'])
  return h_BxF @ p['Dense_2']['kernel'] + p['Dense_2']['bias']


# 28 pixels pool to 14, 7 and 4 (the 7 → 4 pool pads one on each side), 32 pixels to 16, 8 and 4
# (each pool pads one after only). The shapes and widths are those of the tests above, whose
# compiled initialisers are reused.
@pytest.mark.parametrize('input_shape, width_multiplier', [((2, 28, 28, 1), 0.25),
                                                           ((2, 32, 32, 3), 0.125)])
def test_alexnet_matches_numpy_forward_pass(input_shape, width_multiplier):
  model = AlexNet(10, width_multiplier=width_multiplier)
  x = jax.random.normal(jax.random.key(0), input_shape)
  variables = model.init(jax.random.key(1), x)
  # Random biases (all zero at initialisation), so that a layer that drops its bias is seen.
  variables = _redraw(variables, {'bias': lambda rng, shape: rng.normal(0, 0.1, shape)})
  logits_BxK = model.apply(variables, x)
  expected_BxK = _numpy_alexnet(variables['params'], x)
  # Measured: max |difference| 2.8e-7 with logits up to 0.49.
  np.testing.assert_allclose(logits_BxK, expected_BxK, rtol=0, atol=1e-6)


def test_alexnet_given_images_of_another_size_than_at_init_is_one_sentence():
  # 28- and 32-pixel images both reach the dense layers as a 4×4 map; a 64-pixel one as 8×8,
  # which Flax refused on Dense_0's kernel shape (ScopeParamShapeError).
  model = AlexNet(10, width_multiplier=0.125)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1))))
  logits = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 32, 32, 1))), variables)
  assert logits.shape == (2, 10)
  message = ('AlexNet image size 64×64 gives a 8×8×32 map (2048 features) before the dense '
             'layers, but they were made for 512 at init; give images of the size it was '
             'initialised with.')
  # Raised while tracing; JAX appends a note on its own lines.
  with pytest.raises(ValueError) as error:
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 64, 64, 1))), variables)
  assert str(error.value).splitlines()[0] == message


@pytest.mark.parametrize('width_multiplier, widths', [
    # 64·0.3 = 19.2, 192·0.3 = 57.6, 384·0.3 = 115.2, 256·0.3 = 76.8, 1024·0.3 = 307.2: rounded to
    # the nearest integer (57.6 and 76.8 up); 0.001 would round every width to 0, kept at 1.
    (0.3, [19, 58, 115, 77, 77, 307, 307]), (0.001, [1] * 7)])
def test_alexnet_widths_are_rounded_to_the_nearest_integer_and_at_least_one(width_multiplier,
                                                                          widths):
  model = AlexNet(10, width_multiplier=width_multiplier)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))['params']
  names = [f'Conv_{i}' for i in range(5)] + ['Dense_0', 'Dense_1']
  assert [params[name]['kernel'].shape[-1] for name in names] == widths


# ----------------------------------------------------------------------------- ResNet


@pytest.mark.parametrize('name, expected', [('resnet18', 11_689_512), ('resnet34', 21_797_672),
                                            ('resnet50', 25_557_032)])
def test_imagenet_resnet_parameter_counts_match_torchvision(name, expected):
  # torchvision's counts: conv kernels, BN scale and offset, the 1000-way head; not the running statistics.
  assert _param_count(registry.build(name, None, num_classes=1000), (1, 224, 224, 3)) == expected


def _cifar_count_option_a(n, classes=10):
  """6n+2 layers, option A: stem, 3n basic blocks, head; BN has 2 parameters per channel."""
  conv_bn = lambda c_in, c_out: _conv_params(3, c_in, c_out, bias=False) + 2 * c_out
  count = conv_bn(3, 16) + _dense_params(64, classes)
  for c_in, c_out in ((16, 16), (16, 32), (32, 64)):
    count += conv_bn(c_in, c_out) + conv_bn(c_out, c_out)  # The stage's first block.
    count += (n - 1) * 2 * conv_bn(c_out, c_out)
  return count


# He et al. 2016, Table 6: depth → (n, parameters in millions as printed).
_TABLE_6 = {20: (3, 0.27), 32: (5, 0.46), 44: (7, 0.66), 56: (9, 0.85), 110: (18, 1.7)}


@pytest.mark.parametrize('depth', sorted(_TABLE_6))
def test_cifar_resnet_parameter_counts_match_he_et_al_table_6(depth):
  n, millions = _TABLE_6[depth]
  model = registry.build(f'resnet{depth}', None, num_classes=10, shortcut='A')
  assert model.stage_sizes == (n, n, n) and 6 * n + 2 == depth
  count = _param_count(model, (1, 32, 32, 3))
  # Exact: 269,722 / 464,154 / 658,586 / 853,018 / 1,727,962.
  assert count == _cifar_count_option_a(n)
  decimals = 1 if millions >= 1 else 2
  assert round(count / 1e6, decimals) == millions
  # Option B adds two 1×1 projections with BN: 16→32 and 32→64.
  projections = (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)
  assert _param_count(registry.build(f'resnet{depth}', None, num_classes=10), (1, 32, 32, 3)) == count + projections


def test_resnet_forward_shapes_and_small_input_stem():
  x_Bx32x32x3 = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  for name, options in [('resnet20', {}), ('resnet18', {}), ('resnet18', {'small_input_stem': True}),
                        ('resnet50', {'small_input_stem': True})]:
    model = registry.build(name, None, num_classes=10, **options)
    variables = jax.eval_shape(model.init, jax.random.key(1), x_Bx32x32x3)
    logits = jax.eval_shape(lambda v, x, m=model: m.apply(v, x), variables, x_Bx32x32x3)
    assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  # The small-input stem is a 3×3 convolution, the ImageNet one 7×7.
  for small_input_stem, size in ((True, 3), (False, 7)):
    model = registry.build('resnet18', None, num_classes=10, small_input_stem=small_input_stem)
    params = jax.eval_shape(model.init, jax.random.key(1), x_Bx32x32x3)['params']
    assert params['stem_conv']['kernel'].shape == (size, size, 3, 64)
  model = registry.build('resnet20', None, num_classes=10)
  variables = model.init(jax.random.key(1), x_Bx32x32x3)
  logits_BxK = model.apply(variables, x_Bx32x32x3)
  assert logits_BxK.shape == (2, 10) and np.all(np.isfinite(logits_BxK))


def _tiny_resnet(**options):
  return resnet.ResNet(3, stage_sizes=(1, 1), stage_widths=(4, 8), stem_width=4, small_input_stem=True, **options)


def test_batch_norm_running_statistics_per_channel_from_batch_moments():
  model = _tiny_resnet()
  x_Bx8x8x3 = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  variables = model.init(jax.random.key(1), x_Bx8x8x3)
  stem = variables['batch_stats']['stem_norm']
  assert stem['mean'].shape == (4,) and stem['var'].shape == (4,)
  _, updated = model.apply(variables, x_Bx8x8x3, train=True, mutable=['batch_stats'])
  # Independent reference: the stem convolution by lax, then μ ← 0.9μ + 0.1·mean, σ² ← 0.9σ² + 0.1·var
  # with the per-channel moments over batch, height and width.
  h = jax.lax.conv_general_dilated(x_Bx8x8x3, variables['params']['stem_conv']['kernel'], (1, 1),
                                   ((1, 1), (1, 1)), dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  h = np.asarray(h, np.float64)
  np.testing.assert_allclose(updated['batch_stats']['stem_norm']['mean'], 0.1 * h.mean(axis=(0, 1, 2)),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(updated['batch_stats']['stem_norm']['var'], 0.9 + 0.1 * h.var(axis=(0, 1, 2)),
                             rtol=1e-4, atol=1e-5)
  changed = jax.tree.map(lambda a, b: not np.allclose(a, b), variables['batch_stats'], updated['batch_stats'])
  assert all(jax.tree.leaves(changed))
  _, kept = model.apply(variables, x_Bx8x8x3, train=False, mutable=['batch_stats'])
  jax.tree.map(np.testing.assert_array_equal, kept['batch_stats'], variables['batch_stats'])


def test_batch_norm_axis_name_averages_statistics_over_the_mapped_axis():
  # Two shards of two examples under vmap(axis_name) give the statistics of the whole batch of four.
  x_4x8x8x3 = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
  variables = _tiny_resnet().init(jax.random.key(1), x_4x8x8x3)
  whole, whole_stats = _tiny_resnet().apply(variables, x_4x8x8x3, train=True, mutable=['batch_stats'])
  model = registry.build('resnet20', 'shards', num_classes=3)
  assert model.batch_norm_axis_name == 'shards'
  sharded = _tiny_resnet(batch_norm_axis_name='shards')
  apply = lambda x: sharded.apply(variables, x, train=True, mutable=['batch_stats'])
  logits, stats = jax.vmap(apply, axis_name='shards')(x_4x8x8x3.reshape(2, 2, 8, 8, 3))
  np.testing.assert_allclose(logits.reshape(4, 3), whole, rtol=1e-4, atol=1e-5)
  jax.tree.map(lambda s, w: np.testing.assert_allclose(s[0], w, rtol=1e-4, atol=1e-6),
               stats['batch_stats'], whole_stats['batch_stats'])


@pytest.mark.parametrize('shortcut', ['A', 'B'])
@pytest.mark.parametrize('train', [False, True])
def test_zero_init_residual_blocks_start_as_their_shortcut(shortcut, train):
  # With the last γ = 0 the residual branch vanishes: y = ReLU(shortcut(x)).
  x_Bx8x8x16 = jax.random.normal(jax.random.key(0), (2, 8, 8, 16))
  identity = resnet.BasicBlock(16, zero_init_residual=True, shortcut=shortcut)
  variables = identity.init(jax.random.key(1), x_Bx8x8x16)
  y, _ = identity.apply(variables, x_Bx8x8x16, train=train, mutable=['batch_stats'])
  np.testing.assert_allclose(y, jax.nn.relu(x_Bx8x8x16), rtol=1e-6, atol=1e-6)
  down = resnet.BasicBlock(32, strides=2, zero_init_residual=True, shortcut=shortcut)
  variables = down.init(jax.random.key(1), x_Bx8x8x16)
  y_Bx4x4x32, _ = down.apply(variables, x_Bx8x8x16, train=train, mutable=['batch_stats'])
  assert y_Bx4x4x32.shape == (2, 4, 4, 32)
  if shortcut == 'A':  # Subsampled identity, zero-padded from 16 to 32 channels.
    expected = jnp.pad(jax.nn.relu(x_Bx8x8x16[:, ::2, ::2]), ((0, 0), (0, 0), (0, 0), (0, 16)))
    np.testing.assert_allclose(y_Bx4x4x32, expected, rtol=1e-6, atol=1e-6)
  else:
    assert set(variables['params']) == {'Conv_0', 'BatchNorm_0', 'Conv_1', 'BatchNorm_1',
                                        'shortcut_conv', 'shortcut_norm'}
    np.testing.assert_array_equal(variables['params']['shortcut_norm']['scale'], np.ones(32))
  # Only the second BN's γ starts at 0; the first one's is 1.
  np.testing.assert_array_equal(variables['params']['BatchNorm_1']['scale'], np.zeros(32))
  np.testing.assert_array_equal(variables['params']['BatchNorm_0']['scale'], np.ones(32))


def test_bottleneck_block_zero_init_and_last_scales():
  x_Bx8x8x64 = jax.random.normal(jax.random.key(0), (2, 8, 8, 64))
  block = resnet.BottleneckBlock(16, zero_init_residual=True)  # 4·16 = 64: identity shortcut.
  variables = block.init(jax.random.key(1), x_Bx8x8x64)
  np.testing.assert_allclose(block.apply(variables, x_Bx8x8x64), jax.nn.relu(x_Bx8x8x64), rtol=1e-6, atol=1e-6)
  # Every block's last γ starts at 0, the others at 1 (checked without building ResNet-50's arrays).
  model = _tiny_resnet(block='bottleneck', zero_init_residual=True)
  params = model.init(jax.random.key(1), jnp.zeros((1, 8, 8, 3)))['params']
  for stage_block, width in (('stage1_block1', 4), ('stage2_block1', 8)):
    np.testing.assert_array_equal(params[stage_block]['BatchNorm_2']['scale'], np.zeros(4 * width))
    np.testing.assert_array_equal(params[stage_block]['BatchNorm_1']['scale'], np.ones(width))
    np.testing.assert_array_equal(params[stage_block]['shortcut_norm']['scale'], np.ones(4 * width))


def test_convolutions_start_from_he_normal_in_fan_out_mode():
  # He et al. 2015, fan-out mode as torchvision: zero-mean normal with std √(2 / (k·k·c_out)).
  # Every kernel here widens (c_in < c_out), so fan-in mode would be 2–4 times wider.
  model = resnet.ResNet(3, stage_sizes=(1,), stage_widths=(64,), stem_width=16,
                        small_input_stem=True)
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 3)))['params']
  block = params['stage1_block1']
  for kernel in (params['stem_conv']['kernel'], block['Conv_0']['kernel'],
                 block['shortcut_conv']['kernel']):  # 3×3×3×16, 3×3×16×64, 1×1×16×64
    k, _, _, c_out = kernel.shape
    std = float(np.std(np.asarray(kernel, np.float64)))
    # ≥ 432 draws: the sample std is within 3.4% of the true one (one standard error).
    assert abs(std / np.sqrt(2 / (k * k * c_out)) - 1) < 0.12, (kernel.shape, std)


# Random γ (either sign), β, running μ and σ² for every BatchNorm: no γ = 0 hides a residual branch,
# and evaluation must normalise by the running statistics, not by (0, 1).
_BATCH_NORM_DRAWS = {
    'scale': lambda rng, shape: rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape),
    'bias': lambda rng, shape: rng.normal(0, 0.5, shape),
    'mean': lambda rng, shape: rng.normal(0, 0.5, shape),
    'var': lambda rng, shape: rng.uniform(0.5, 2.0, shape),
}


def _numpy_batch_norm(h_BxHxWxC, norm, stats, train):
  """γ (h − μ)/√(σ² + ε) + β per channel, ε = 1e-5, with the batch moments (biased variance) in
  training and the running statistics in evaluation."""
  if train:
    mean, var = h_BxHxWxC.mean(axis=(0, 1, 2)), h_BxHxWxC.var(axis=(0, 1, 2))
  else:
    mean, var = stats['mean'], stats['var']
  return norm['scale'] * (h_BxHxWxC - mean) / np.sqrt(var + 1e-5) + norm['bias']


def _numpy_block(params, stats, x_BxHxWxC, strides, shortcut, bottleneck, train):
  """He et al. 2016, Fig. 5, in float64 NumPy: y = ReLU(F(x) + shortcut(x)) with
  basic      F = BN∘conv3×3∘ReLU∘BN∘conv3×3/s,
  bottleneck F = BN∘conv1×1∘ReLU∘BN∘conv3×3/s∘ReLU∘BN∘conv1×1 (the stride on the 3×3),
  and the shortcut the identity, option A (x[::s, ::s] zero-padded to the new channels) or
  option B (BN∘conv1×1/s)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  s = jax.tree.map(lambda a: np.asarray(a, np.float64), stats)
  bn = lambda h, name: _numpy_batch_norm(h, p[name], s[name], train)
  conv = lambda h, name, strides, padding: _numpy_conv(h, p[name]['kernel'], strides, padding)
  x = np.asarray(x_BxHxWxC, np.float64)
  if bottleneck:
    h = _relu(bn(conv(x, 'Conv_0', 1, 0), 'BatchNorm_0'))
    h = _relu(bn(conv(h, 'Conv_1', strides, 1), 'BatchNorm_1'))
    h = bn(conv(h, 'Conv_2', 1, 0), 'BatchNorm_2')
  else:
    h = _relu(bn(conv(x, 'Conv_0', strides, 1), 'BatchNorm_0'))
    h = bn(conv(h, 'Conv_1', 1, 1), 'BatchNorm_1')
  c_in, c_out = x.shape[-1], h.shape[-1]
  if strides == 1 and c_in == c_out:
    identity = x
  elif shortcut == 'B':
    identity = bn(conv(x, 'shortcut_conv', strides, 0), 'shortcut_norm')
  else:
    identity = np.pad(x[:, ::strides, ::strides], ((0, 0), (0, 0), (0, 0), (0, c_out - c_in)))
  return _relu(h + identity)


# (input channels, width, stride, shortcut): the identity, a strided option-B projection, a strided
# option-A shortcut; a bottleneck block's output has 4·width channels. The shapes are those of the
# zero-initialisation tests above, whose compiled operations are reused. The last two stride
# without widening: the shortcut must still subsample (an identity chosen on the channel count
# alone adds an 8×8 map to a 4×4 one).
_BLOCK_CASES = [(16, 16, 1, 'B'), (16, 32, 2, 'B'), (16, 32, 2, 'A'), (16, 16, 2, 'B'),
                (16, 16, 2, 'A')]
_BOTTLENECK_CASES = [(64, 16, 1, 'B'), (16, 8, 2, 'B')]


@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('bottleneck, c_in, width, strides, shortcut',
                         [(False, *case) for case in _BLOCK_CASES]
                         + [(True, *case) for case in _BOTTLENECK_CASES])
def test_residual_blocks_match_numpy_forward_pass(bottleneck, c_in, width, strides, shortcut,
                                                  train):
  block_cls = resnet.BottleneckBlock if bottleneck else resnet.BasicBlock
  # zero_init_residual would make the branch vanish; the redrawn γ brings it back.
  block = block_cls(width, strides=strides, shortcut=shortcut, zero_init_residual=True)
  x_Bx8x8xC = jax.random.normal(jax.random.key(0), (2, 8, 8, c_in))
  variables = _redraw(block.init(jax.random.key(1), x_Bx8x8xC), _BATCH_NORM_DRAWS)
  y, _ = block.apply(variables, x_Bx8x8xC, train=train, mutable=['batch_stats'])
  expected = _numpy_block(variables['params'], variables['batch_stats'], x_Bx8x8xC, strides,
                          shortcut, bottleneck, train)
  assert y.shape == expected.shape
  # Measured: max |difference| 2.6e-6 with outputs up to 8.3.
  np.testing.assert_allclose(y, expected, rtol=0, atol=1e-5)


def _numpy_resnet(variables, x_BxHxWxC, model, train):
  """ResNet in float64 NumPy: the stem (3×3/1 conv, BN, ReLU; or 7×7/2 conv padded by 3, BN, ReLU
  and a 3×3/2 max pool padded by 1), the blocks (stride 2 opening every stage after the first),
  the global average and the linear head."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  s = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['batch_stats'])
  stem = lambda h: _relu(_numpy_batch_norm(h, p['stem_norm'], s['stem_norm'], train))
  if model.small_input_stem:
    h = stem(_numpy_conv(x_BxHxWxC, p['stem_conv']['kernel'], 1, 1))
  else:
    h = _numpy_max_pool(stem(_numpy_conv(x_BxHxWxC, p['stem_conv']['kernel'], 2, 3)), 1, 1)
  for stage, num_blocks in enumerate(model.stage_sizes):
    for index in range(num_blocks):
      name = f'stage{stage + 1}_block{index + 1}'
      strides = 2 if stage > 0 and index == 0 else 1
      h = _numpy_block(p[name], s[name], h, strides, model.shortcut, model.block == 'bottleneck',
                       train)
  return h.mean(axis=(1, 2)) @ p['head']['kernel'] + p['head']['bias']


# Two blocks in stage 1 (the first keeps the stem's 4 channels, or widens them to 16 by option A),
# one strided block in stage 2. The 16-pixel image reaches stage 1 as 4×4 through the ImageNet stem.
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('options, size', [({'small_input_stem': True}, 8),
                                           ({'block': 'bottleneck', 'shortcut': 'A'}, 16)])
def test_resnet_matches_numpy_forward_pass(options, size, train):
  model = resnet.ResNet(3, stage_sizes=(2, 1), stage_widths=(4, 8), stem_width=4, **options)
  x = jax.random.normal(jax.random.key(0), (2, size, size, 3))
  variables = _redraw(model.init(jax.random.key(1), x), _BATCH_NORM_DRAWS)
  logits_BxK, _ = model.apply(variables, x, train=train, mutable=['batch_stats'])
  expected_BxK = _numpy_resnet(variables, x, model, train)
  # Measured: max |difference| 1.1e-6 with logits up to 3.9.
  np.testing.assert_allclose(logits_BxK, expected_BxK, rtol=0, atol=5e-6)


# -------------------------------------------------------------------- dtype and options


@pytest.mark.parametrize('name, options, input_shape', [
    ('lenet5', {'padding': 2}, (2, 28, 28, 1)),
    ('alexnet', {'width_multiplier': 0.125}, (2, 32, 32, 3)),
    ('resnet20', {}, (2, 32, 32, 3)),
])
def test_bfloat16_compute_keeps_float32_params_and_logits(name, options, input_shape):
  model = registry.build(name, None, num_classes=10, dtype='bfloat16', **options)
  assert model.dtype == jnp.bfloat16
  x = jax.random.normal(jax.random.key(0), input_shape)
  variables = model.init(jax.random.key(1), x)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  logits_BxK, _ = model.apply(variables, x, train=True, mutable=['batch_stats'],
                              rngs={'dropout': jax.random.key(2)})
  assert logits_BxK.shape == (2, 10) and logits_BxK.dtype == jnp.float32
  reference = registry.build(name, None, num_classes=10, **options).apply(variables, x)
  # bfloat16 keeps 8 significant bits (relative step 2⁻⁸ ≈ 0.4%). Measured largest differences:
  # 0.0023 of logits up to 0.29 (LeNet-5), 0.0039 of 0.53 (AlexNet), 0.096 of 14.4 (ResNet-20),
  # at most 0.79% of the largest logit. A zero difference means the dtype was ignored.
  difference = np.max(np.abs(model.apply(variables, x) - reference))
  assert 0 < difference < 0.025 * np.max(np.abs(reference))
  # Every layer's output is bfloat16; only the logits are cast back to float32.
  _, state = model.apply(variables, x, capture_intermediates=True, mutable=['intermediates'])
  layers = [(jax.tree_util.keystr(path), a.dtype)
            for path, a in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]
            if len(path) > 2]  # (module, '__call__', 0); the root's own output is ('__call__', 0).
  assert layers and all(dtype == jnp.bfloat16 for _, dtype in layers), layers


@pytest.mark.parametrize('name, options, message', [
    ('lenet5', {'num_classes': 0}, 'LeNet5 num_classes must be a positive integer, got 0.'),
    ('lenet5', {'activation': 'gelu'}, "LeNet5 activation must be one of tanh, relu, got 'gelu'."),
    ('lenet5', {'padding': -1}, 'LeNet5 padding must be a non-negative integer, got -1.'),
    ('alexnet', {'width_multiplier': 0}, 'AlexNet width_multiplier must be a positive number, got 0.'),
    ('alexnet', {'dropout_rate': 1.0}, r'AlexNet dropout_rate must lie in \[0, 1\), got 1.0.'),
    # A NaN or infinite width multiplier failed in round() (cannot convert float NaN to
    # integer), a dropout rate given as a string in the comparison with 0 (TypeError).
    ('alexnet', {'width_multiplier': float('nan')},
     'AlexNet width_multiplier must be a positive number, got nan.'),
    ('alexnet', {'width_multiplier': float('inf')},
     'AlexNet width_multiplier must be a positive number, got inf.'),
    ('alexnet', {'dropout_rate': '0.5'}, r"AlexNet dropout_rate must lie in \[0, 1\), got '0.5'."),
    # A number of blocks instead of one per stage failed iterating over an int.
    ('resnet18', {'stage_sizes': 2},
     'ResNet18 stage_sizes must be a non-empty sequence of positive integers, got 2.'),
    ('resnet20', {'stage_widths': 16},
     'ResNet20 stage_widths must be a non-empty sequence of positive integers, got 16.'),
    ('resnet18', {'block': 'wide'}, "ResNet18 block must be one of basic, bottleneck, got 'wide'."),
    ('resnet20', {'shortcut': 'C'}, "ResNet20 shortcut must be one of A, B, got 'C'."),
    ('resnet34', {'stage_sizes': [3, 0, 6, 3]},
     r'ResNet34 stage_sizes must be a non-empty sequence of positive integers, got \(3, 0, 6, 3\).'),
    ('resnet50', {'stage_widths': (64, 128)},
     r'ResNet50 needs one width per stage, got stage_sizes=\(3, 4, 6, 3\) and stage_widths=\(64, 128\).'),
])
def test_option_errors_are_one_sentence(name, options, message):
  options = {'num_classes': 10, **options}
  with pytest.raises(ValueError, match=f'^{message}$'):
    registry.build(name, None, **options)


def test_every_batch_norm_keeps_nine_tenths_of_its_running_statistics():
  # The batch moments in training do not depend on the running statistics, so two updates
  # from running (mean, var) = (0, 1) and (1, 2) differ by 0.9 × (1, 1) in every BatchNorm
  # (stem, blocks and projection shortcuts alike) for momentum 0.9.
  model = _tiny_resnet(shortcut='B')
  x_Bx8x8x3 = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  # Parameters drawn by NumPy from the shapes (no init program to compile).
  shapes = jax.eval_shape(model.init, jax.random.key(1), x_Bx8x8x3)
  rng = np.random.default_rng(0)
  variables = {'params': jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
                                      shapes['params'])}
  stats = shapes['batch_stats']
  assert any('shortcut_norm' in block for block in stats.values())
  apply = jax.jit(lambda start: model.apply({'params': variables['params'], 'batch_stats': start},
                                            x_Bx8x8x3, train=True, mutable=['batch_stats'])[1])

  def update(mean, var):
    start = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.full(a.shape, mean if path[-1].key == 'mean' else var), stats)
    return apply(start)['batch_stats']

  difference = jax.tree.map(lambda a, b: np.asarray(a - b, np.float64), update(1.0, 2.0),
                            update(0.0, 1.0))
  for path, leaf in jax.tree_util.tree_leaves_with_path(difference):
    np.testing.assert_allclose(leaf, 0.9, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('name, options, shape, expected', [
    ('lenet5', {'padding': 2}, (28, 28, 1), r'LeNet5 needs images of shape \(B, H, W, C\), got '
                                            r'shape \(28, 28, 1\)\.'),
    ('alexnet', {}, (28, 28, 1), r'AlexNet needs images of shape \(B, H, W, C\), got shape '
                                 r'\(28, 28, 1\)\.'),
    ('resnet20', {}, (8, 8, 1), r'ResNet20 needs images of shape \(B, H, W, C\), got shape '
                                r'\(8, 8, 1\)\.'),
    ('cnn1d', {}, (40,), r'CNN1D needs sequences of shape \(B, T\) or \(B, T, C\), got shape '
                         r'\(40,\)\.'),
])
def test_one_example_without_a_batch_axis_is_one_sentence(name, options, shape, expected):
  # Flax convolutions take unbatched inputs, so these used to fail further on (jnp.pad's
  # pad_width, a reshape, global_avg_pool naming a (2, 2, 64) feature map, conv dimensions).
  model = registry.build(name, num_classes=10, **options)
  with pytest.raises(ValueError, match=expected):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(shape)))
