"""The Vision Transformer (Dosovitskiy et al. 2021) against independent references: the patch
embedding x_p^i E against a NumPy loop that cuts the image into row-major P×P patches, the
token count (H/P)(W/P) (+1), the parameter count from the layer formulas, the set property of
the encoder (with no positions, permuting the patches leaves the logits unchanged; with
any position scheme it does not), the pooled head, dropout, the bfloat16 compute dtype, the registry and the
one-sentence option errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import registry
from models.vision.vit import ViT
from tests.messages import one_sentence
from tests.models import dropout_probe
from tests.models.test_transformer_reference import reference_block

B, H, W, C, P, D, K = 2, 8, 12, 3, 4, 16, 5
N = (H // P) * (W // P)  # 6 patches


TINY = {'num_classes': K, 'patch_size': P, 'num_layers': 2, 'features': D, 'num_heads': 2,
        'mlp_dim': 24}


def tiny(**options):
  return ViT(**{**TINY, **options})


def images(seed=0, shape=(B, H, W, C)):
  return jax.random.normal(jax.random.key(seed), shape)


def init(model, x, seed=1):
  return nn.unbox(model.init(jax.random.key(seed), x))


def numpy_patches(x_BxHxWxC, p):
  """[B, N, P·P·C]: patches in row-major order, each flattened row by row, channels last."""
  x = np.asarray(x_BxHxWxC, np.float64)
  batch, height, width, channels = x.shape
  out = []
  for b in range(batch):
    rows = []
    for top in range(0, height, p):
      for left in range(0, width, p):
        patch = [x[b, top + i, left + j, c] for i in range(p) for j in range(p)
                 for c in range(channels)]
        rows.append(patch)
    out.append(rows)
  return np.array(out)


def first_block_input(model, variables, x):
  """z_0 (after the embeddings and positions), the input of block0."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name == 'block0' and context.method_name == '__call__':
      seen['z0'] = args[0]
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    model.apply(variables, x)
  return seen['z0']


# ------------------------------------------------------------------- patch embedding


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_patch_embedding_matches_numpy_patches_times_kernel(pool):
  model = tiny(pool=pool, positions='none')
  x = images()
  variables = init(model, x)
  embed = variables['params']['patch_embed']
  kernel_PPCxD = np.asarray(embed['kernel'], np.float64).reshape(P * P * C, D)
  expected_BxNxD = numpy_patches(x, P) @ kernel_PPCxD + np.asarray(embed['bias'], np.float64)
  z0 = np.asarray(first_block_input(model, variables, x))
  if pool == 'cls':
    assert z0.shape == (B, N + 1, D)
    np.testing.assert_array_equal(z0[:, 0], np.broadcast_to(variables['params']['class_token'][0],
                                                            (B, D)))
    z0 = z0[:, 1:]
  assert z0.shape == (B, N, D)
  # float32 against float64: the largest difference measured is 6e-7.
  np.testing.assert_allclose(z0, expected_BxNxD, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('height, width, patch, pool, tokens', [
    (8, 12, 4, 'cls', 7), (8, 12, 4, 'mean', 6), (28, 28, 7, 'cls', 17), (28, 28, 4, 'mean', 49),
    (6, 6, 1, 'cls', 37)])
def test_number_of_tokens_and_learned_table(height, width, patch, pool, tokens):
  model = tiny(patch_size=patch, pool=pool)
  x = jnp.zeros((1, height, width, C))
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  assert (height // patch) * (width // patch) + (pool == 'cls') == tokens
  assert nn.unbox(variables)['params']['position_embed']['embedding'].shape == (tokens, D)
  z0 = jax.eval_shape(lambda v: first_block_input(model, nn.unbox(v), x), variables)
  assert z0.shape == (1, tokens, D)


@pytest.mark.parametrize('positions', ['sinusoidal', 'learned'])
def test_positions_are_added_to_every_token_class_token_first(positions):
  x = images()
  none, model = tiny(positions='none'), tiny(positions=positions)
  variables = init(model, x)
  difference = np.asarray(first_block_input(model, variables, x)
                          - first_block_input(none, variables, x), np.float64)
  if positions == 'learned':
    expected = np.asarray(variables['params']['position_embed']['embedding'], np.float64)
  else:  # PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))
    p, i = np.arange(N + 1)[:, None], np.arange(D // 2)[None, :]
    expected = np.zeros((N + 1, D))
    expected[:, 0::2] = np.sin(p / 10000 ** (2 * i / D))
    expected[:, 1::2] = np.cos(p / 10000 ** (2 * i / D))
  np.testing.assert_allclose(difference, np.broadcast_to(expected, (B, N + 1, D)), atol=1e-5)


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_head_reads_the_normalised_class_token_or_the_mean(pool):
  # y = LN(z_L^0) (eq. 4) or the mean over tokens of LN(z_L); logits = y W + b. z_L is the
  # input of the final LayerNorm, taken by interception; LN is written out in NumPy.
  x = images()
  model = tiny(pool=pool)
  variables = init(model, x)
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name == 'final_norm':
      seen['zL'] = np.asarray(args[0], np.float64)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    logits = model.apply(variables, x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  z = seen['zL']
  normed = ((z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-6)
            * params['final_norm']['scale'] + params['final_norm']['bias'])
  y = normed[:, 0] if pool == 'cls' else normed.mean(axis=1)
  expected = y @ params['head']['kernel'] + params['head']['bias']
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_blocks_are_pre_ln_bidirectional_transformer_blocks():
  # z'_l = MSA(LN(z_{l−1})) + z_{l−1}, z_l = MLP(LN(z'_l)) + z'_l (eqs. 2–3), every token
  # attending to every token: block0's output against the float64 reference block of
  # test_transformer_reference.py, run on block0's own input.
  x = images()
  model = tiny()
  variables = nn.unbox(jax.jit(model.init)(jax.random.key(1), x))
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.module.name == 'block0' and context.method_name == '__call__':
      seen['in'], seen['out'] = args[0], out
    return out

  @jax.jit
  def block0_input_and_output(variables, x):
    with nn.intercept_methods(interceptor):
      model.apply(variables, x)
    return seen['in'], seen['out']

  z0, z1 = block0_input_and_output(variables, x)
  expected = reference_block(variables['params']['block0'], z0, pre_norm=True)
  # float32 against float64: the largest difference measured is 1e-6.
  np.testing.assert_allclose(z1, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- parameter count


def expected_param_count(*, patch, channels, width, layers, mlp, tokens, classes, pool,
                         learned):
  patch_embed = patch * patch * channels * width + width
  class_token = width if pool == 'cls' else 0
  positions = (tokens + (pool == 'cls')) * width if learned else 0
  layer_norm = 2 * width
  attention = 4 * (width * width + width)  # Q, K, V and the output projection, with biases
  feed_forward = width * mlp + mlp + mlp * width + width
  block = 2 * layer_norm + attention + feed_forward
  head = width * classes + classes
  return patch_embed + class_token + positions + layers * block + layer_norm + head


@pytest.mark.parametrize('pool, positions', [('cls', 'learned'), ('mean', 'learned'),
                                             ('cls', 'sinusoidal'), ('mean', 'none')])
def test_parameter_count_matches_formula(pool, positions):
  model = tiny(pool=pool, positions=positions)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, H, W, C)))
  count = sum(leaf.size for leaf in jax.tree.leaves(nn.unbox(variables)['params']))
  expected = expected_param_count(patch=P, channels=C, width=D, layers=2, mlp=24, tokens=N,
                                  classes=K, pool=pool, learned=positions == 'learned')
  assert count == expected
  if (pool, positions) == ('cls', 'learned'):
    # 784 + 16 + 112 + 2·(64 + 1088 + 808) + 32 + 85, by hand.
    assert count == 4949


def test_without_bias_no_layer_has_one():
  # use_bias=False removes the patch embedding's, every LayerNorm's and projection's and the
  # head's bias: D + L·(2D + 4D + mlp + D) + D + K parameters fewer than the formula above.
  model = tiny(use_bias=False)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, H, W, C)))
  leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(variables)['params'])[0]
  assert not [jax.tree_util.keystr(path) for path, _ in leaves if path[-1].key == 'bias']
  biases = D + 2 * (2 * D + 4 * D + 24 + D) + D + K
  assert sum(leaf.size for _, leaf in leaves) == expected_param_count(
      patch=P, channels=C, width=D, layers=2, mlp=24, tokens=N, classes=K, pool='cls',
      learned=True) - biases


def test_initialisation_of_the_embeddings_and_the_head():
  # As big_vision's ViT: E and the head LeCun normal, std √(1 / fan_in) with fan_in = P·P·C
  # and D; their biases and the class token 0; the learned E_pos N(0, 0.02²).
  variables = init(tiny(num_classes=64), images())
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  for name, fan_in in (('patch_embed', P * P * C), ('head', D)):
    kernel = params[name]['kernel']  # 768 and 1024 draws: std within 2.6% (one standard error)
    assert abs(kernel.std() / np.sqrt(1 / fan_in) - 1) < 0.1, (name, kernel.std())
    np.testing.assert_array_equal(params[name]['bias'], 0)
  np.testing.assert_array_equal(params['class_token'], 0)
  table = params['position_embed']['embedding']  # 7 × 16 draws: within 6.7%
  assert table.shape == (N + 1, D) and abs(table.std() / 0.02 - 1) < 0.2, table.std()


# ------------------------------------------------------------- the encoder sees a set


def permute_patches(x_BxHxWxC, p, order):
  """The image whose k-th row-major patch is patch order[k] of x."""
  batch, height, width, channels = x_BxHxWxC.shape
  rows, cols = height // p, width // p
  patches = x_BxHxWxC.reshape(batch, rows, p, cols, p, channels).transpose(0, 1, 3, 2, 4, 5)
  patches = patches.reshape(batch, rows * cols, p, p, channels)[:, np.asarray(order)]
  patches = patches.reshape(batch, rows, cols, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
  return patches.reshape(batch, height, width, channels)


ORDER = (3, 0, 5, 1, 4, 2)


def test_permute_patches_moves_whole_patches():
  x = images()
  moved = np.asarray(permute_patches(x, P, ORDER))
  for k, source in enumerate(ORDER):
    to_r, to_c = divmod(k, W // P)
    from_r, from_c = divmod(source, W // P)
    np.testing.assert_array_equal(moved[:, to_r * P:(to_r + 1) * P, to_c * P:(to_c + 1) * P],
                                  x[:, from_r * P:(from_r + 1) * P, from_c * P:(from_c + 1) * P])


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_without_positions_permuting_patches_leaves_logits_unchanged(pool):
  x = images()
  model = tiny(pool=pool, positions='none')
  variables = init(model, x)
  logits = model.apply(variables, x)
  permuted = model.apply(variables, permute_patches(x, P, ORDER))
  # Measured differences ≤ 3.6e-7 (summation order only). Mirroring the image also permutes
  # the pixels inside each patch, which is not a patch permutation: measured 0.77–1.7.
  np.testing.assert_allclose(permuted, logits, rtol=1e-5, atol=1e-5)
  pixels = x[:, :, ::-1]  # mirrors inside every patch too
  assert np.max(np.abs(model.apply(variables, pixels) - logits)) > 1e-2


@pytest.mark.parametrize('pool', ['cls', 'mean'])
@pytest.mark.parametrize('positions', ['learned', 'sinusoidal', 'rotary', 'alibi'])
def test_with_positions_permuting_patches_changes_logits(pool, positions):
  x = images()
  model = tiny(pool=pool, positions=positions)
  variables = init(model, x)
  if positions == 'learned':  # N(0, 0.02²) at initialisation: make the table matter.
    table = variables['params']['position_embed']['embedding']
    variables['params']['position_embed']['embedding'] = table * 50
  logits = model.apply(variables, x)
  # Measured 0.03 (ALiBi, mean pooling) to 0.6; without positions the difference is < 1e-6.
  assert np.max(np.abs(model.apply(variables, permute_patches(x, P, ORDER)) - logits)) > 1e-2


# -------------------------------------------------------------------- dropout and dtype


def test_dropout_only_in_training():
  x = images()
  model = tiny(dropout_rate=0.3)
  variables = init(model, x)
  train = lambda seed, m=model: m.apply(variables, x, train=True,
                                        rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_allclose(train(2, tiny(dropout_rate=0.0)), model.apply(variables, x),
                             rtol=1e-6, atol=1e-6)
  assert not np.allclose(train(2), train(3))
  assert not np.allclose(train(2), model.apply(variables, x))
  np.testing.assert_array_equal(model.apply(variables, x), model.apply(variables, x))


def test_training_drops_out_z0_before_the_first_block():
  # Dropout on z_0 (App. B.1): in training with rate 0.5 each entry of block0's input is 0 or
  # z_0 scaled by 1/(1 − 0.5) = 2, about half of each; z_0 is block0's input at evaluation.
  x = images()
  model = tiny(dropout_rate=0.5)
  variables = init(model, x)
  (dropped,) = dropout_probe.first_block_inputs(lambda: model.apply(
      variables, x, train=True, rngs={'dropout': jax.random.key(4)})).values()
  z0 = first_block_input(model, variables, x)
  dropout_probe.assert_inverted_dropout(dropped, z0, 0.5, rtol=1e-5, atol=1e-6)


def test_training_drops_out_the_mlp_hidden_units():
  # App. B.1: dropout after every dense layer but the qkv projections, so the MLP's output
  # layer reads GELU(hidden) with each unit 0 or scaled by 1/(1 − 0.5) = 2; at evaluation it
  # reads GELU(hidden) itself.
  x = images()
  model = tiny(dropout_rate=0.5)
  variables = init(model, x)
  for train in (True, False):
    hidden, read = dropout_probe.first_mlp_hidden_units(lambda: model.apply(
        variables, x, train=train, rngs={'dropout': jax.random.key(5)}))
    if train:
      dropout_probe.assert_inverted_dropout(read, hidden, 0.5, rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(read, hidden)


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_bfloat16_compute_is_close_to_float32(pool):
  x = images()
  model = registry.build('vit', dtype='bfloat16', **TINY, pool=pool)
  assert model.dtype == jnp.bfloat16
  shapes = jax.eval_shape(model.init, jax.random.key(1), x)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(nn.unbox(shapes)))
  variables = init(tiny(pool=pool), x)
  train = jax.eval_shape(lambda v: model.apply(v, x, train=True,
                                               rngs={'dropout': jax.random.key(2)}), variables)
  assert train.shape == (B, K) and train.dtype == jnp.float32
  logits = jax.jit(model.apply)(variables, x)
  assert logits.dtype == jnp.float32
  reference = jax.jit(tiny(pool=pool).apply)(variables, x)
  # bfloat16 keeps 8 significant bits (relative step 2^-8 ≈ 0.4%); the largest difference
  # measured is 0.8% of the largest logit. Zero would mean the compute dtype was ignored.
  scale = np.max(np.abs(reference))
  assert scale > 0.3
  difference = np.max(np.abs(logits - reference))
  assert 0 < difference < 0.05 * scale, (difference, scale)
  # The patch embedding, every block (its residual stream and projections) and the head compute
  # in bfloat16; the LayerNorms stay float32.
  _, state = jax.eval_shape(lambda v: model.apply(v, x, capture_intermediates=True,
                                                  mutable=['intermediates']), variables)
  outputs = {'/'.join(jax.tree_util.keystr((key,), simple=True) for key in path[:-2]): a.dtype
             for path, a in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]
             if path[-2].key == '__call__'}
  layers = (('self_attention', ('query', 'key', 'value', 'out')), ('mlp', ('hidden', 'output')))
  bfloat16 = ['patch_embed', 'head'] + [
      name for i in range(TINY['num_layers']) for name in
      [f'block{i}'] + [f'block{i}/{layer}/{n}' for layer, names in layers for n in names]]
  for name in bfloat16:
    assert outputs[name] == jnp.bfloat16, (name, outputs[name])
  for name in ['final_norm'] + [f'block{i}/{n}_norm' for i in range(TINY['num_layers'])
                                for n in ('self_attention', 'mlp')]:
    assert outputs[name] == jnp.float32, (name, outputs[name])


def test_every_parameter_is_trained_and_a_small_batch_is_fitted():
  # Gradient descent on 8 images with random labels drives the cross-entropy from ≈ log 5 to
  # near 0 only if the logits depend on the pixels through every part of the model; each
  # parameter's gradient is non-zero (a detached or unused branch would give zeros).
  x = images(shape=(8, H, W, C))
  labels = jax.random.randint(jax.random.key(3), (8,), 0, K)
  model = tiny(pool='cls')
  params = init(model, x)['params']

  def loss_fn(p):
    logits = model.apply({'params': p}, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  optimizer = optax.adam(1e-2)

  @jax.jit
  def train(p):
    def step(carry, _):
      p, state = carry
      loss, g = jax.value_and_grad(loss_fn)(p)
      updates, state = optimizer.update(g, state)
      return (optax.apply_updates(p, updates), state), loss
    return jax.grad(loss_fn)(p), jax.lax.scan(step, (p, optimizer.init(p)), None, length=40)[1]

  gradients, losses = train(params)
  assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(gradients))
  # Measured: 1.92 at the start, 0.010 after 20 steps, 0.0037 after 40.
  assert losses[0] > 1.0 and losses[-1] < 0.05, (losses[0], losses[-1])


# --------------------------------------------------------------- registry and errors


def test_registry_builds_vit_with_the_data_classes():
  model = registry.build('vit', data_defaults={'num_classes': 10}, patch_size=7, num_layers=1,
                         features=16, num_heads=2)
  assert isinstance(model, ViT) and model.num_classes == 10 and model.mlp_dim is None
  x = jnp.zeros((3, 28, 28, 1))
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  params = nn.unbox(variables)['params']
  assert params['block0']['mlp']['hidden']['kernel'].shape == (16, 64)  # default 4·D
  assert params['head']['kernel'].shape == (16, 10)
  logits = jax.eval_shape(lambda v: model.apply(v, x), variables)
  assert logits.shape == (3, 10) and logits.dtype == jnp.float32
  with pytest.raises(ValueError, match='does not match the data'):
    registry.build('vit', data_defaults={'num_classes': 10}, num_classes=5)


@pytest.mark.parametrize('height, width', [(30, 28), (28, 30)])
def test_image_not_divisible_by_patch_raises_before_compilation(height, width):
  # Either side: a width of 30 was cut into 7 patches, dropping the last two pixel columns.
  model = tiny(patch_size=4)
  message = (f'ViT image size {height}×{width} is not divisible by patch_size=4; use a patch '
             'size that divides both sides or resize the images.')
  # Raised while tracing (eval_shape compiles nothing); JAX appends a note on its own lines.
  with pytest.raises(ValueError) as error:
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, height, width, 1)))
  assert str(error.value).splitlines()[0] == message


@pytest.mark.parametrize('options, message', [
    ({'num_classes': 0}, 'ViT num_classes must be a positive integer, got 0.'),
    ({'patch_size': 0}, 'ViT patch_size must be a positive integer, got 0.'),
    ({'pool': 'max'}, "ViT pool='max'; allowed: cls, mean."),
    ({'positions': '2d'}, "ViT positions='2d'; allowed: sinusoidal, learned, alibi, rotary, none."),
    ({'features': 30, 'num_heads': 4}, 'ViT features=30 must be divisible by num_heads=4.'),
    ({'dropout_rate': 1.0}, r'ViT dropout_rate must lie in \[0, 1\), got 1.0.'),
])
def test_option_errors_are_one_sentence(options, message):
  options = {'num_classes': 10, **options}
  with pytest.raises(ValueError, match=f'^{message}$'):
    registry.build('vit', **options)


@pytest.mark.parametrize('pool', ['cls', 'mean'])
@pytest.mark.parametrize('height, width, patches', [(12, 12, 9), (4, 4, 1)])
def test_images_of_another_size_than_at_init_are_one_sentence(pool, height, width, patches):
  """The learned position table has one row per token of the images `init` saw (N = 6 here)."""
  model = tiny(pool=pool)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(1), images()))
  with pytest.raises(ValueError, match=f'ViT image size {height}×{width} gives {patches} patches '
                                       f'of 4×4, but its learned positions were made for {N} at '
                                       'init; give images of the size it was initialised with.'):
    jax.eval_shape(lambda v: model.apply(v, images(shape=(B, height, width, C))), variables)
  # Unboxed parameters (as a checkpoint restores them) are read alike.
  with pytest.raises(ValueError, match=f'gives {patches} patches'):
    jax.eval_shape(lambda v: model.apply(nn.unbox(v), images(shape=(B, height, width, C))),
                   variables)


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_linformer_takes_fewer_patches_than_at_init_and_refuses_more_in_one_sentence(pool):
  """Linformer's projections have a column per token of the images `init` saw (N = 6 here):
  fewer patches use the first columns, as a model made for them would; more are refused."""
  model = tiny(pool=pool, positions='sinusoidal', attention='linformer',
               attention_options=(('projected_length', 3),))
  boxed = model.init(jax.random.key(1), images())
  variables = nn.unbox(boxed)
  small = images(shape=(B, 4, 8, C))  # 2 patches
  tokens = 2 + (pool == 'cls')

  def first_columns(path, a):
    return a[:, :tokens] if path[-1].key in ('proj_e', 'proj_f') else a

  made_for_small = jax.tree_util.tree_map_with_path(first_columns, variables)
  assert made_for_small['params']['block0']['self_attention']['attend']['projections'][
      'proj_e'].shape == (3, tokens)
  np.testing.assert_allclose(model.apply(variables, small), model.apply(made_for_small, small),
                             rtol=1e-6, atol=1e-6)
  # Boxed parameters (as init returns them) and unboxed ones (as a checkpoint restores them).
  for v in (boxed, variables):
    one_sentence(lambda: model.apply(v, images(shape=(B, 12, 12, C))),
                 f'ViT image size 12×12 gives 9 patches of 4×4, but its Linformer projections '
                 f'were made for at most {N} at init; give images of at most that many patches.')
