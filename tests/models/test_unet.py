"""The diffusion U-Net (Ronneberger et al. 2015; Ho et al. 2020, App. B) against independent
references: golden sinusoidal time embeddings (Vaswani et al. 2017, §3.5); its two blocks
against float64 NumPy forward passes; dropout's mean against the evaluation output (Monte
Carlo); the wiring of the path, the skips, the attention and the time embedding, read off a
running network; parameter counts from the layer formulas; shapes, dtypes and the
one-sentence option errors.

Parameters are drawn here (kernels N(0, 1/fan-in), norm scales 1 + N(0, 0.2²), biases
N(0, 0.2²)) instead of `init`, so that the zero-initialised output layer does not hide
anything and no initialiser has to be compiled."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from models.generative import unet as unet_lib
from models.generative.unet import AttentionBlock, ResidualBlock, UNet


def random_params(module, *args, seed=0, **kwargs):
  shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), *args, **kwargs)['params'])
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    if name == 'kernel':
      fan_in = math.prod(leaf.shape[:-1])
      return (rng.normal(size=leaf.shape) / math.sqrt(fan_in)).astype(np.float32)
    base = 1.0 if name == 'scale' else 0.0
    return (base + 0.2 * rng.normal(size=leaf.shape)).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def run_once(fn, *args):
  """fn(*args) compiled without LLVM's optimisations, which would cost more than they save
  for a function that runs once."""
  return jax.jit(fn).lower(*args).compile({'xla_backend_optimization_level': 0})(*args)


def _f64(a):
  return np.asarray(a, np.float64)


def np_silu(x):
  return x / (1 + np.exp(-x))


def np_group_norm(x_BxHxWxC, groups, scale, bias, eps=1e-6):
  b, h, w, c = x_BxHxWxC.shape
  g = x_BxHxWxC.reshape(b, h * w, groups, c // groups)
  mean = g.mean(axis=(1, 3), keepdims=True)
  var = ((g - mean) ** 2).mean(axis=(1, 3), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x_BxHxWxC.shape) * _f64(scale) + _f64(bias)


def np_conv(x_BxHxWxC, layer):
  """Cross-correlation with zero padding k // 2 on every side (stride 1)."""
  kernel = _f64(layer['kernel'])
  pad = kernel.shape[0] // 2
  x = np.pad(x_BxHxWxC, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  windows = sliding_window_view(x, kernel.shape[:2], axis=(1, 2))  # B×H×W×C×k×k
  return np.einsum('bhwcij,ijcf->bhwf', windows, kernel) + _f64(layer['bias'])


# ---- time embedding -------------------------------------------------------------------------

def test_sinusoidal_embedding_golden_values():
  # dim 4: ω = (1, 10000^(−2/4) = 0.01), so t = 2 → [sin 2, sin 0.02, cos 2, cos 0.02].
  emb = np.asarray(unet_lib.sinusoidal_embedding(jnp.array([0, 2]), 4))
  np.testing.assert_allclose(emb[0], [0.0, 0.0, 1.0, 1.0], atol=1e-7)
  # Largest difference measured: 2e-8.
  np.testing.assert_allclose(emb[1], [0.9092974268256817, 0.019998666693333080,
                                      -0.4161468365471424, 0.9998000066665778], atol=1e-6)
  # A real time and another period: t = 0.5, dim 6, period 64 → ω = (1, 1/4, 1/16).
  emb = np.asarray(unet_lib.sinusoidal_embedding(jnp.array([0.5]), 6, max_period=64.0))[0]
  angles = 0.5 * np.array([1.0, 0.25, 0.0625])
  np.testing.assert_allclose(emb, np.concatenate([np.sin(angles), np.cos(angles)]), atol=1e-6)


# ---- the blocks against NumPy ---------------------------------------------------------------

def np_residual_block(p, x, emb, groups):
  """Ho et al. 2020, App. B: h = conv(SiLU(GN(x))) + W SiLU(e); y = x' + conv(SiLU(GN(h)))."""
  x, emb = _f64(x), _f64(emb)
  h = np_conv(np_silu(np_group_norm(x, groups, p['norm1']['scale'], p['norm1']['bias'])), p['conv1'])
  h = h + (np_silu(emb) @ _f64(p['time_proj']['kernel']) + _f64(p['time_proj']['bias']))[:, None, None]
  h = np_conv(np_silu(np_group_norm(h, groups, p['norm2']['scale'], p['norm2']['bias'])), p['conv2'])
  return (np_conv(x, p['shortcut']) if 'shortcut' in p else x) + h


def test_residual_block_matches_numpy_and_dropout_is_unbiased():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 5, 5, 4)).astype(np.float32)
  emb = rng.normal(size=(2, 7)).astype(np.float32)
  widen, keep = ResidualBlock(6, 2, dropout_rate=0.5), ResidualBlock(4, 2, dropout_rate=0.5)
  p_widen, p_keep = random_params(widen, x, emb, seed=2), random_params(keep, x, emb, seed=3)
  # Dropout masks are independent across the batch: 400 copies of x are 400 draws.
  num_samples = 400
  x_copies, emb_copies = np.tile(x, (num_samples, 1, 1, 1)), np.tile(emb, (num_samples, 1))

  def run(p_widen, p_keep, key):
    train = widen.apply({'params': p_widen}, x_copies, emb_copies, train=True, rngs={'dropout': key})
    return (widen.apply({'params': p_widen}, x, emb), keep.apply({'params': p_keep}, x, emb), train)

  # The 'rbg' generator compiles in a third of threefry's time.
  y_widen, y_keep, y_train = run_once(run, p_widen, p_keep, jax.random.key(4, impl='rbg'))
  assert 'shortcut' in p_widen and 'shortcut' not in p_keep
  # float32 against float64; largest difference measured 1.2e-6 on outputs of size ~4.
  np.testing.assert_allclose(y_widen, np_residual_block(p_widen, x, emb, 2), atol=1e-5)
  np.testing.assert_allclose(y_keep, np_residual_block(p_keep, x, emb, 2), atol=1e-5)

  # Inverted dropout keeps E[output] = the evaluation output (conv2 is linear). 300 outputs
  # against 5 standard errors: the largest deviation measured is 3.6 standard errors (without
  # the 1/(1 − p) rescaling it would be 47).
  y_train = np.asarray(y_train, np.float64).reshape(num_samples, *y_widen.shape)
  standard_error = y_train.std(axis=0, ddof=1) / math.sqrt(num_samples)
  assert np.all(standard_error > 1e-3)  # dropout is active
  assert np.max(np.abs(y_train.mean(axis=0) - y_widen) / standard_error) < 5


def np_attention_block(p, x, groups):
  """x + MultiHead(GN(x)) over the H·W positions; the heads are read off the kernels."""
  b, height, width, c = x.shape
  a = p['attention']
  h = np_group_norm(_f64(x), groups, p['norm']['scale'], p['norm']['bias']).reshape(
      b, height * width, c)
  q, k, v = (np.einsum('btc,cnh->btnh', h, _f64(a[n]['kernel'])) + _f64(a[n]['bias'])
             for n in ('query', 'key', 'value'))
  logits_BxNxTxS = np.einsum('btnh,bsnh->bnts', q, k) / math.sqrt(q.shape[-1])
  w = np.exp(logits_BxNxTxS - logits_BxNxTxS.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)  # over the H·W key positions
  o = np.einsum('bnts,bsnh->btnh', w, v)
  out = np.einsum('btnh,nhc->btc', o, _f64(a['out']['kernel'])) + _f64(a['out']['bias'])
  return _f64(x) + out.reshape(x.shape)


def test_attention_block_matches_numpy():
  x = np.random.default_rng(5).normal(size=(2, 3, 3, 4)).astype(np.float32)
  block = AttentionBlock(num_heads=2, num_groups=2)
  p = random_params(block, x, seed=6)
  y = run_once(block.apply, {'params': p}, x)
  assert p['attention']['query']['kernel'].shape == (4, 2, 2)  # [C, heads, C / heads]
  # Largest difference measured: 2.4e-7.
  np.testing.assert_allclose(y, np_attention_block(p, x, 2), atol=1e-5)


# ---- the wiring of the whole network, read off a running one ------------------------------

SMALL = dict(channels=8, channel_mults=(1, 2, 2), num_res_blocks=1, attention_resolutions=(7,),
             num_groups=4, dropout_rate=0.1, time_scale=1000.0)


def recorder(names, records):
  """An interceptor that logs the name, arguments and output of every layer the U-Net calls."""
  def intercept(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == '__call__' and isinstance(context.module.parent, UNet):
      names.append(context.module.name)
      records.append((args, kwargs, out))
    return out
  return intercept


@pytest.fixture(scope='module')
def small_run():
  """One compiled forward pass of a small 28×28 network: what every top-level layer took and
  returned. Its times are continuous, t ∈ [0, 1], scaled by 1000."""
  model = UNet(**SMALL)
  x = np.repeat(np.random.default_rng(7).normal(size=(1, 28, 28, 1)), 2, axis=0).astype(np.float32)
  t = np.array([0.003, 0.7], np.float32)  # the same image at two times
  params = random_params(model, x, t, seed=8)
  names = []

  def run(params):
    records = []
    with nn.intercept_methods(recorder(names, records)):
      out = model.apply({'params': params}, x, t)
    return out, [(args, out) for args, _, out in records]

  out, records = run_once(run, params)
  return dict(x=x, t=t, params=params, out=out, order=names, records=dict(zip(names, records)))


def test_the_time_embedding_reaches_every_residual_block(small_run):
  """Catches a block given no embedding or the wrong one, and time_scale not applied."""
  records, order = small_run['records'], small_run['order']
  out = np.asarray(small_run['out'])
  # The same image at t = 0.003 and 0.7: outputs differ by 4.9% of their mean size (float32
  # rounding would be ~1e-7).
  assert np.mean(np.abs(out[0] - out[1])) > 1e-2 * np.mean(np.abs(out))
  # e = Dense(SiLU(Dense(PE(1000 t)))) of width 4C, given to every block (whose use of it is
  # checked against NumPy above); PE = [sin 1000tω_i, cos 1000tω_i], ω_i = 10000^(−2i/8). The
  # float32 product 1000·t may be an ulp of 700 (6e-5) off, moving sin by as much; measured 4e-8.
  (pe,), pe_out = records['time_dense1']
  angles_Bx4 = 1000 * small_run['t'].astype(np.float64)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
  np.testing.assert_allclose(pe, np.concatenate([np.sin(angles_Bx4), np.cos(angles_Bx4)], -1),
                             atol=1e-4)
  (silu,), emb = records['time_dense2']
  pe_out = np.asarray(pe_out, np.float64)
  np.testing.assert_allclose(silu, np_silu(pe_out), rtol=1e-6, atol=1e-6)
  blocks = [name for name in order if '_block' in name]
  assert len(blocks) == 3 + 2 + 3 * 2  # down, middle, up (num_res_blocks + 1 per level)
  for name in blocks:
    np.testing.assert_array_equal(records[name][0][1], emb, err_msg=name)


def test_every_layer_takes_the_previous_layers_output(small_run):
  """The path x → conv_in → down → middle → up → GN, SiLU → conv_out, with nearest-neighbour
  ×2 upsampling before each upsampling convolution. Catches a layer whose output is dropped
  (an attention computed but not used) or that is fed the wrong tensor. The up blocks'
  concatenations are the next test's."""
  records, order = small_run['records'], small_run['order']
  path = [name for name in order if not name.startswith('time_dense')]
  assert path[0] == 'conv_in' and path[-2:] == ['norm_out', 'conv_out']
  np.testing.assert_array_equal(records['conv_in'][0][0], small_run['x'])
  for previous, name in zip(path, path[1:]):
    if name.startswith('up') and '_block' in name:
      continue
    expected = np.asarray(records[previous][1])
    if name.endswith('_upsample'):
      expected = expected.repeat(2, axis=1).repeat(2, axis=2)
    if name == 'conv_out':
      expected = np_silu(expected.astype(np.float64))
    # Equal, except SiLU in float32 against NumPy's: measured 4.8e-7.
    np.testing.assert_allclose(records[name][0][0], expected, rtol=1e-6, atol=1e-6, err_msg=name)
  np.testing.assert_array_equal(small_run['out'], records['conv_out'][1])
  # The sizes 28 → 14 → 7 → 14 → 28.
  heights = [records[name][1].shape[1] for name in path if name.endswith(('sample', 'conv_in'))]
  assert heights == [28, 14, 7, 14, 28]


def test_skips_join_each_level_last_in_first_out(small_run):
  """Ronneberger et al. 2015: the up path concatenates, at each level, the activations the
  down path kept there, in reverse order: [h, skip] with h the previous layer's output and
  skip the output of conv_in, of each down block (after its attention) and of each
  downsampling, popped last in first out. Catches a missing skip, a wrong order, or a skip
  taken before the attention."""
  records, order = small_run['records'], small_run['order']
  skips = []
  for name in order:
    if name == 'conv_in' or name.endswith('_downsample') or name.startswith('down') and '_block' in name:
      skips.append(records[name][1])
    elif name.startswith('down') and '_attention' in name:
      skips[-1] = records[name][1]  # it attends over the block's output, which is what is kept
  assert len(skips) == 6
  up_blocks = [name for name in order if name.startswith('up') and '_block' in name]
  assert len(up_blocks) == 6
  for name in up_blocks:
    previous = order[order.index(name) - 1]
    skip = skips.pop()
    joined = np.asarray(records[name][0][0])
    assert joined.shape[-1] == records[previous][1].shape[-1] + skip.shape[-1], name
    np.testing.assert_array_equal(joined[..., -skip.shape[-1]:], skip, err_msg=name)
    np.testing.assert_array_equal(joined[..., :-skip.shape[-1]], records[previous][1], err_msg=name)


def test_attention_sits_at_7x7_after_every_block_there(small_run):
  """Catches attention at the wrong resolution, or missing after some block there."""
  records, order = small_run['records'], small_run['order']
  attention = [name for name in order if '_attention' in name]
  assert attention == ['down2_attention0', 'middle_attention', 'up2_attention0', 'up2_attention1']
  for name in attention:
    assert records[name][0][0].shape == (2, 7, 7, 16), name
  # Attention at 14×14 instead: after each block of level 1 (one down, two up).
  names = []
  model = UNet(**dict(SMALL, attention_resolutions=(14,)))
  x, t = jnp.zeros((2, 28, 28, 1)), jnp.zeros((2,))
  with nn.intercept_methods(recorder(names, [])):
    jax.eval_shape(model.init, jax.random.key(0), x, t)
  assert [name for name in names if '_attention' in name] == [
      'down1_attention0', 'up1_attention0', 'up1_attention1']


def test_every_block_and_the_last_norm_compute_with_the_configured_groups(small_run):
  """Each residual block, attention and the output GroupNorm of the running network, on the
  inputs it was given, against NumPy with num_groups = 4 groups. Catches the U-Net handing its
  blocks (or norm_out) another group count than the one configured."""
  records, params = small_run['records'], small_run['params']
  checked = 0
  for name in small_run['order']:
    (args, out), p = records[name], params.get(name)
    if '_block' in name:
      expected = np_residual_block(p, args[0], args[1], 4)
    elif '_attention' in name:
      expected = np_attention_block(p, np.asarray(args[0]), 4)
    elif name == 'norm_out':
      expected = np_group_norm(_f64(args[0]), 4, p['scale'], p['bias'])
    else:
      continue
    checked += 1
    # float32 against float64: measured 3e-6 on outputs of size ~10.
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=name)
  assert checked == 11 + 4 + 1


def test_heads_reach_the_attention_and_attention_follows_the_height_of_non_square_inputs():
  """An 8×16 input: levels of 8×16 and 4×8. Attention at height 4 is level 1 only (catches the
  width read as the height); the heads split each projection into [C, heads, C / heads]."""
  model = UNet(channels=8, channel_mults=(1, 2), attention_resolutions=(4,), num_heads=2,
               num_groups=4)
  names = []
  with nn.intercept_methods(recorder(names, [])):
    _, variables = _shapes(model, (1, 8, 16, 1))
  assert [name for name in names if '_attention' in name] == [
      'down1_attention0', 'middle_attention', 'up1_attention0', 'up1_attention1']
  for name in ('down1_attention0', 'middle_attention'):
    query = nn.meta.unbox(variables['params'][name]['attention']['query'])
    assert query['kernel'].shape == (16, 2, 8), name


def test_the_untrained_network_predicts_zero():
  """Module doc: conv_out's kernel and bias start at 0, so ε̂ = 0 at initialisation; the other
  layers keep Flax's default initialisation. The initialisers are read off the layers of a
  traced network and drawn here, which costs no compilation of the network."""
  modules = {}

  def intercept(next_fun, args, kwargs, context):
    modules.setdefault(context.module.name, context.module)
    return next_fun(*args, **kwargs)

  model = UNet(channels=4, channel_mults=(1,), attention_resolutions=(), num_groups=2,
               out_channels=3)
  with nn.intercept_methods(intercept):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4, 4, 1)), jnp.zeros(1))
  key, shape = jax.random.key(0), (3, 3, 4, 3)
  out = modules['conv_out']
  assert out.features == 3
  np.testing.assert_array_equal(out.kernel_init(key, shape), 0.0)
  np.testing.assert_array_equal(out.bias_init(key, (3,)), 0.0)
  assert np.abs(np.asarray(modules['conv_in'].kernel_init(key, shape))).min() > 0


def test_train_reaches_every_residual_block(small_run):
  """Dropout acts in training only (its mean is checked against NumPy above); catches a block
  that is not told, or whose dropout is not at the configured rate."""
  model = UNet(**SMALL)
  variables = {'params': small_run['params']}
  x, t = small_run['x'], small_run['t']
  for train in (False, True):
    names, records, dropouts = [], [], []
    record = recorder(names, records)

    def intercept(next_fun, args, kwargs, context):
      if isinstance(context.module, nn.Dropout):
        dropouts.append((context.module.rate, context.module.deterministic))
      return record(next_fun, args, kwargs, context)

    with nn.intercept_methods(intercept):
      jax.eval_shape(lambda v: model.apply(v, x, t, train=train, rngs={'dropout': jax.random.key(0)}),
                     variables)
    flags = [kwargs.get('train') for name, (_, kwargs, _) in zip(names, records) if '_block' in name]
    assert flags == [train] * 11
    assert dropouts == [(SMALL['dropout_rate'], not train)] * 11


# ---- parameter counts, shapes, dtypes, errors -----------------------------------------------

@functools.cache
def _shapes(model, x_shape, t_dtype=jnp.float32):
  """The output and parameters that `model` would have for inputs of `x_shape` (a trace, no
  computation)."""
  x, t = jnp.zeros(x_shape), jnp.zeros(x_shape[:1], t_dtype)
  return jax.eval_shape(lambda: model.init_with_output(jax.random.key(0), x, t))


def _count(model, x_shape):
  return sum(leaf.size for leaf in jax.tree.leaves(_shapes(model, x_shape)[1]['params']))


def conv(k, c_in, c_out):
  return k * k * c_in * c_out + c_out


def dense(d_in, d_out):
  return d_in * d_out + d_out


def norm(c):
  return 2 * c


def res(c_in, c_out, emb):
  shortcut = conv(1, c_in, c_out) if c_in != c_out else 0
  return (norm(c_in) + conv(3, c_in, c_out) + dense(emb, c_out) + norm(c_out)
          + conv(3, c_out, c_out) + shortcut)


def attn(c):
  return norm(c) + 4 * dense(c, c)  # W^Q, W^K, W^V, W^O


def test_parameter_count_tiny_by_hand():
  # C = 4, widths 4 and 8, two blocks per level, attention at height 4 of an 8×8 input with
  # 2 channels in and 3 out. Kept activations: conv_in 4, d0 4, 4, down 4, d1 8, 8.
  model = UNet(channels=4, channel_mults=(1, 2), num_res_blocks=2, attention_resolutions=(4,),
               num_heads=2, num_groups=2, out_channels=3)
  e = 16
  expected = (dense(4, e) + dense(e, e) + conv(3, 2, 4)
              + res(4, 4, e) + res(4, 4, e) + conv(3, 4, 4)            # level 0 down
              + res(4, 8, e) + attn(8) + res(8, 8, e) + attn(8)        # level 1 down
              + res(8, 8, e) + attn(8) + res(8, 8, e)                  # middle
              + res(8 + 8, 8, e) + res(8 + 8, 8, e) + res(8 + 4, 8, e) + 3 * attn(8)  # level 1 up
              + conv(3, 8, 8)                                          # upsampling
              + res(8 + 4, 4, e) + res(4 + 4, 4, e) + res(4 + 4, 4, e)  # level 0 up
              + norm(4) + conv(3, 4, 3))
  assert _count(model, (1, 8, 8, 2)) == expected == 16_687


def test_parameter_count_default_by_hand():
  # C = 32, widths 32, 64, 64, one block per level, attention at 7×7. Kept activations:
  # conv_in 32, d0 32, down 32, d1 64, down 64, d2 64.
  e = 128
  expected = (dense(32, e) + dense(e, e) + conv(3, 1, 32)
              + res(32, 32, e) + conv(3, 32, 32) + res(32, 64, e) + conv(3, 64, 64)
              + res(64, 64, e) + attn(64)
              + res(64, 64, e) + attn(64) + res(64, 64, e)
              + res(128, 64, e) + attn(64) + res(128, 64, e) + attn(64) + conv(3, 64, 64)
              + res(128, 64, e) + res(96, 64, e) + conv(3, 64, 64)
              + res(96, 32, e) + res(64, 32, e)
              + norm(32) + conv(3, 32, 1))
  assert _count(UNet(), (2, 28, 28, 1)) == expected == 1_112_801


@pytest.mark.parametrize('model,channels', [
    (UNet(), 1), (UNet(channels=8, num_groups=4, out_channels=6, dtype=jnp.bfloat16), 3)])
def test_shapes_and_dtypes(model, channels):
  out, variables = _shapes(model, (2, 28, 28, channels), jnp.int32)  # integer steps
  assert out.shape == (2, 28, 28, model.out_channels or channels) and out.dtype == model.dtype
  assert {leaf.dtype for leaf in jax.tree.leaves(variables['params'])} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize('options,x_shape,t_shape,message', [
    (dict(channels=8, num_groups=3), (1, 28, 28, 1), (1,), 'num_groups=3 must divide every level width'),
    # Every level is 8 or 16 wide, but the first level's GroupNorms also see conv_in's 4
    # channels: Flax's own error, naming neither option, came at the first call.
    (dict(channels=4, channel_mults=(2, 4), num_groups=8, attention_resolutions=()), (1, 8, 8, 1),
     (1,), r'num_groups=8 must divide every level width \(8, 16\) and channels=4'),
    (dict(num_groups=0), (1, 28, 28, 1), (1,), 'num_groups must be a positive integer, got 0'),
    (dict(channels=5, num_groups=1), (1, 28, 28, 1), (1,), 'channels=5 must be even'),
    (dict(out_channels=0), (1, 28, 28, 1), (1,),
     'out_channels must be None or a positive integer, got 0'),
    (dict(channels=8, num_groups=4, num_heads=3), (1, 28, 28, 1), (1,),
     r'num_heads=3 must divide every level width \(8, 16, 16\)'),
    (dict(channels=8, num_groups=4), (1, 30, 30, 1), (1,), 'size 30×30 is not allowed.*multiples of 4'),
    (dict(channels=8, num_groups=4), (2, 28, 28, 1), (1,), r'times of shape \(1,\) must be \[B\] = \(2,\)'),
    (dict(channels=8, num_groups=4, attention_resolutions=(8,)), (1, 28, 28, 1), (1,),
     r'lists 8, which no level has; the level heights are \(28, 14, 7\)'),
    (dict(dropout_rate=1.0), (1, 28, 28, 1), (1,), r'dropout_rate must lie in \[0, 1\), got 1.0'),
])
def test_bad_options_raise_one_sentence(options, x_shape, t_shape, message):
  with pytest.raises(ValueError, match=message):
    model = UNet(**options)
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(x_shape), jnp.zeros(t_shape))


def test_downsampling_is_a_stride_2_convolution_padded_by_one_on_every_side(small_run):
  """The 3×3 stride-2 convolution equals the stride-1 one (zero padding 1 on every side)
  sampled at even positions: output (i, j) is centred on input (2i, 2j). Catches 'SAME'
  padding, which pads 28 → 14 by one pixel at the end only and so centres it on (2i+1, 2j+1)."""
  records, params = small_run['records'], small_run['params']
  downsamples = [name for name in small_run['order'] if name.endswith('_downsample')]
  assert downsamples == ['down0_downsample', 'down1_downsample']
  for name in downsamples:
    (x,), out = records[name]
    expected = np_conv(_f64(x), params[name])[:, ::2, ::2]
    assert out.shape == expected.shape, name
    # float32 against float64: measured 1e-6 relative to values of size ~1.
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5, err_msg=name)
