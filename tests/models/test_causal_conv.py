"""Causal dilated convolutions and the WaveNet-style LM (van den Oord et al. 2016) against
a brute-force NumPy loop, the causality and receptive-field properties, full-sequence
logits (for cached decoding) and the float32 model (for bfloat16 compute)."""

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.sequence.causal_conv import CausalConv1D, CausalConvLM

VOCAB = 11


def _perturbed(variables, seed=0):
  # Non-zero biases everywhere, so a dropped bias or a misplaced one shows.
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: leaf + rng.normal(scale=0.3, size=leaf.shape).astype(np.float32),
                      variables)


def _reference_conv(x_BxTxC, kernel_KxCxF, bias_F, dilation):
  """y_t = Σ_j W_j x_{t−j·d} + b, x_s = 0 for s < 0; W_j = kernel[k−1−j] (Flax's tap order)."""
  x = np.asarray(x_BxTxC, np.float64)
  kernel = np.asarray(kernel_KxCxF, np.float64)
  k = kernel.shape[0]
  y = np.zeros(x.shape[:2] + (kernel.shape[-1],))
  for t in range(x.shape[1]):
    y[:, t] = bias_F
    for j in range(k):
      if t - j * dilation >= 0:
        y[:, t] += x[:, t - j * dilation] @ kernel[k - 1 - j]
  return y


@pytest.mark.parametrize('kernel_size, dilation, in_channels, features',
                         [(1, 1, 3, 2), (2, 1, 1, 4), (2, 3, 3, 5), (3, 2, 4, 2), (4, 5, 2, 3)])
def test_causal_conv_equals_brute_force_loop(kernel_size, dilation, in_channels, features):
  # Fails for symmetric ('SAME') padding, padding by k−1 instead of (k−1)·d, a flipped tap
  # order or a dropped bias. T = 12 < (k−1)·d + 1 for the last case, so truncation is covered.
  layer = CausalConv1D(features, kernel_size, dilation)
  x_BxTxC = jax.random.normal(jax.random.key(0), (2, 12, in_channels))
  variables = _perturbed(layer.init(jax.random.key(1), x_BxTxC))
  conv = variables['params']['Conv_0']
  assert conv['kernel'].shape == (kernel_size, in_channels, features)
  expected = _reference_conv(x_BxTxC, conv['kernel'], np.asarray(conv['bias'], np.float64), dilation)
  np.testing.assert_allclose(layer.apply(variables, x_BxTxC), expected, rtol=1e-5, atol=1e-5)


def test_causal_conv_without_bias_has_no_bias_parameter():
  layer = CausalConv1D(3, 2, dilation=2, use_bias=False)
  x_BxTxC = jax.random.normal(jax.random.key(0), (1, 6, 2))
  variables = _perturbed(layer.init(jax.random.key(1), x_BxTxC))
  assert set(variables['params']['Conv_0']) == {'kernel'}
  expected = _reference_conv(x_BxTxC, variables['params']['Conv_0']['kernel'], np.zeros(3), 2)
  np.testing.assert_allclose(layer.apply(variables, x_BxTxC), expected, rtol=1e-5, atol=1e-5)


def _lm_and_variables(tokens_BxT, **options):
  model = CausalConvLM(VOCAB, channels=8, **options)
  return model, _perturbed(model.init(jax.random.key(1), tokens_BxT))


def _sigmoid(z):
  return 1 / (1 + np.exp(-z))


def _reference_lm(params, tokens_BxT, kernel_size, dilations, num_stacks):
  """The docstring's equations in NumPy: embedding, gated blocks, residual and skip sums, head."""
  dense = lambda x, name: x @ np.asarray(params[name]['kernel']) + np.asarray(params[name]['bias'])
  h = np.asarray(params['Embed_0']['embedding'], np.float64)[np.asarray(tokens_BxT)]
  skip = np.zeros_like(h)
  for block, dilation in enumerate(tuple(dilations) * num_stacks):
    conv = params[f'CausalConv1D_{block}']['Conv_0']
    fg = _reference_conv(h, conv['kernel'], np.asarray(conv['bias'], np.float64), dilation)
    f, g = np.split(fg, 2, axis=-1)
    s = dense(np.tanh(f) * _sigmoid(g), f'Dense_{block}')
    h, skip = h + s, skip + s
  blocks = len(dilations) * num_stacks
  out = np.maximum(dense(np.maximum(skip, 0), f'Dense_{blocks}'), 0)
  return dense(out, f'Dense_{blocks + 1}')


@pytest.mark.parametrize('kernel_size, dilations, num_stacks', [(2, (1, 2), 2), (3, (1, 4), 1)])
def test_lm_equals_numpy_wavenet_equations(kernel_size, dilations, num_stacks):
  # Fails if the gate swaps tanh and σ, the residual or a skip term is dropped, the skip sum
  # keeps only the last block, or the head's ReLUs are misplaced.
  tokens_BxT = jax.random.randint(jax.random.key(5), (2, 10), 0, VOCAB)
  model, variables = _lm_and_variables(tokens_BxT, kernel_size=kernel_size, dilations=dilations,
                                       num_stacks=num_stacks)
  expected = _reference_lm(variables['params'], tokens_BxT, kernel_size, dilations, num_stacks)
  np.testing.assert_allclose(model.apply(variables, tokens_BxT), expected, rtol=1e-5, atol=1e-5)


def _changed(tokens, rng):
  # A different token at every position (never the same one by chance).
  return (tokens + rng.integers(1, VOCAB, size=tokens.shape)) % VOCAB


def test_output_at_t_ignores_every_later_input():
  # Fails if any layer sees the future (symmetric padding, a right-shifted buffer).
  rng = np.random.default_rng(0)
  seq_len = 16
  tokens_T = rng.integers(0, VOCAB, size=seq_len)
  # Row t keeps tokens ≤ t and replaces every later one.
  tokens_TxT = np.stack([np.concatenate([tokens_T[:t + 1], _changed(tokens_T[t + 1:], rng)])
                         for t in range(seq_len)])
  model, variables = _lm_and_variables(tokens_TxT, kernel_size=3, dilations=(1, 2, 4))
  base_T1xV = model.apply(variables, tokens_T[None])[0]
  logits_TxTxV = model.apply(variables, tokens_TxT)
  for t in range(seq_len):
    np.testing.assert_allclose(logits_TxTxV[t, :t + 1], base_T1xV[:t + 1], rtol=0, atol=1e-6)
    if t + 1 < seq_len:  # The change was real: the next output does move.
      assert np.abs(logits_TxTxV[t, t + 1] - base_T1xV[t + 1]).max() > 1e-5


@pytest.mark.parametrize('kernel_size, dilations, num_stacks',
                         [(2, (1, 2, 4), 2), (3, (1, 3), 1), (1, (1,), 1)])
def test_receptive_field_is_exactly_as_stated(kernel_size, dilations, num_stacks):
  # Fails if dilations are ignored or repeated wrongly (a smaller field), or if the padding is
  # off by one (a larger one); also if `receptive_field` misstates the formula.
  model = CausalConvLM(VOCAB, kernel_size=kernel_size, dilations=dilations, num_stacks=num_stacks)
  field = model.receptive_field
  assert field == num_stacks * sum((kernel_size - 1) * d for d in dilations) + 1
  rng = np.random.default_rng(1)
  seq_len = field + 5
  tokens_T = rng.integers(0, VOCAB, size=seq_len)
  positions = range(field, seq_len)
  inside_NxT = np.stack([tokens_T] * len(positions))  # Changes x_{t−R+1}.
  outside_NxT = inside_NxT.copy()  # Changes x_{t−R}.
  for row, t in enumerate(positions):
    inside_NxT[row, t - field + 1] = _changed(tokens_T[t - field + 1], rng)
    outside_NxT[row, t - field] = _changed(tokens_T[t - field], rng)
  model, variables = _lm_and_variables(tokens_T[None], kernel_size=kernel_size, dilations=dilations,
                                       num_stacks=num_stacks)
  # The unchanged sequence in a batch of the same shape, so that every row is computed by the
  # same compiled program (a batch of 1 may sum in another order, ~1e-6 apart).
  base_NxTxV = model.apply(variables, np.stack([tokens_T] * len(positions)))
  inside_NxTxV = model.apply(variables, inside_NxT)
  outside_NxTxV = model.apply(variables, outside_NxT)
  for row, t in enumerate(positions):
    moved = np.abs(inside_NxTxV[row, t] - base_NxTxV[row, t]).max()
    assert moved > 1e-5, f'x_{t - field + 1} does not reach the output at t={t}'
    np.testing.assert_allclose(outside_NxTxV[row, t], base_NxTxV[row, t], rtol=0, atol=1e-6)


@pytest.mark.parametrize('kernel_size, dilations, num_stacks, chunk',
                         [(2, (1, 2, 4, 8), 1, 1), (3, (1, 3), 2, 1), (1, (1,), 1, 1),
                          (2, (1, 2, 4, 8), 1, 5)])  # The last one feeds 5 tokens per call.
def test_cached_decoding_equals_full_forward_pass(kernel_size, dilations, num_stacks, chunk):
  # Fails if the buffer is not shifted, shifted the wrong way, holds outputs instead of
  # inputs, or is not zero at the start (which stands for the left padding).
  batch, seq_len = 2, 19
  tokens_BxT = jax.random.randint(jax.random.key(2), (batch, seq_len), 0, VOCAB)
  model = CausalConvLM(VOCAB, channels=8, kernel_size=kernel_size, dilations=dilations, num_stacks=num_stacks)
  init_logits_BxTxV, variables = model.init_with_output(jax.random.key(1), tokens_BxT, decode=True)
  # The first call (inside init) creates the cache and computes on the full input.
  np.testing.assert_allclose(init_logits_BxTxV, model.apply({'params': variables['params']}, tokens_BxT),
                             rtol=1e-6, atol=1e-6)
  params = _perturbed(variables['params'])
  full_BxTxV = model.apply({'params': params}, tokens_BxT)
  cache = variables['cache']
  steps = []
  for start in range(0, seq_len, chunk):
    logits_BxSxV, updates = model.apply({'params': params, 'cache': cache},
                                        tokens_BxT[:, start:start + chunk], decode=True, mutable=['cache'])
    cache = updates['cache']
    steps.append(logits_BxSxV)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full_BxTxV, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', ['bfloat16', jnp.bfloat16])
def test_bfloat16_compute_keeps_float32_params_and_logits_close_to_float32(dtype):
  # Fails if params are created in bfloat16 (`dtype` passed as `param_dtype`), if the logits
  # are left in bfloat16, or if `dtype` is silently ignored (then the logits would be equal).
  tokens_BxT = jax.random.randint(jax.random.key(3), (2, 32), 0, 65)
  model_f32, model_bf16 = CausalConvLM(65), CausalConvLM(65, dtype=dtype)
  variables = model_bf16.init(jax.random.key(1), tokens_BxT)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  logits_bf16 = model_bf16.apply(variables, tokens_BxT)
  logits_f32 = model_f32.apply(variables, tokens_BxT)
  assert logits_bf16.dtype == jnp.float32
  assert not np.array_equal(logits_bf16, logits_f32)
  # bfloat16 keeps 8 significant bits (relative rounding error up to 2⁻⁸ ≈ 0.4%) and the
  # default model rounds through ~17 layers, so a few percent of the logit scale is expected
  # (about 1% here); a wrong gate, residual or skip would move the logits by O(100%) of it.
  scale = np.abs(logits_f32).max()
  np.testing.assert_allclose(logits_bf16, logits_f32, rtol=0, atol=0.05 * scale)


def _dtypes_of(jaxpr, primitives):
  """The dtypes of the operands (or, for a gather, the result) of every such equation."""
  dtypes = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in primitives:
      variables = eqn.outvars if eqn.primitive.name == 'gather' else eqn.invars
      dtypes += [v.aval.dtype for v in variables if hasattr(v.aval, 'dtype')]
    for sub in jax_core.jaxprs_in_params(eqn.params):
      dtypes += _dtypes_of(sub, primitives)
  return dtypes


def test_bfloat16_compute_reaches_the_embedding_every_convolution_and_dense_layer():
  # Fails if a layer drops `dtype`: the logits stay close to float32 either way.
  model = CausalConvLM(VOCAB, channels=8, dilations=(1, 2), dtype='bfloat16')
  tokens_BxT = jnp.zeros((1, 6), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens_BxT)  # traced, not run
  jaxpr = jax.make_jaxpr(model.apply)(variables, tokens_BxT).jaxpr
  primitives = ('gather', 'conv_general_dilated', 'dot_general')
  dtypes = _dtypes_of(jaxpr, primitives)
  # One lookup, 2 convolutions and 2 + 2 dense layers (two operands each).
  assert len(dtypes) == 1 + 2 * 2 + 4 * 2 and set(dtypes) == {jnp.dtype(jnp.bfloat16)}, dtypes


def test_dropout_acts_only_in_training():
  # Fails if dropout runs at evaluation or never runs (e.g. `deterministic` inverted).
  tokens_BxT = jax.random.randint(jax.random.key(4), (2, 12), 0, VOCAB)
  model, variables = _lm_and_variables(tokens_BxT, dropout_rate=0.5, dilations=(1, 2))
  plain = CausalConvLM(VOCAB, channels=8, dilations=(1, 2))
  np.testing.assert_array_equal(model.apply(variables, tokens_BxT), plain.apply(variables, tokens_BxT))
  train_a = model.apply(variables, tokens_BxT, train=True, rngs={'dropout': jax.random.key(0)})
  train_b = model.apply(variables, tokens_BxT, train=True, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(train_a, plain.apply(variables, tokens_BxT))
  assert not np.allclose(train_a, train_b)


@pytest.mark.parametrize('options, value', [
    (dict(vocab_size=0), '0'),
    (dict(channels=-1), '-1'),
    (dict(kernel_size=0), '0'),
    (dict(num_stacks=0), '0'),
    (dict(channels=16.0), '16.0'),  # a float from a config: the Embed and Dense need an int
    (dict(dilations=()), '()'),
    (dict(dilations=(1, 0, 2)), '(1, 0, 2)'),
    (dict(dilations=(1, 2.5)), '(1, 2.5)'),
    (dict(dropout_rate=1.0), '1.0'),
    (dict(dropout_rate=-0.1), '-0.1'),
])
def test_invalid_options_raise_one_sentence_naming_the_value(options, value):
  options = {'vocab_size': VOCAB, **options}
  with pytest.raises(ValueError) as error:
    CausalConvLM(**options)
  message = str(error.value)
  assert value in message and message.endswith('.') and '. ' not in message


@pytest.mark.parametrize('option', ['features', 'kernel_size', 'dilation'])
def test_invalid_conv_options_raise(option):
  options = {'features': 2, 'kernel_size': 2, 'dilation': 1, option: 0}
  with pytest.raises(ValueError, match=f'{option} must be a positive integer, got 0.'):
    CausalConv1D(**options).init(jax.random.key(0), jnp.zeros((1, 4, 3)))


def test_registry_builds_default_model_with_the_stated_parameter_count():
  # Fails if a block lacks its 1×1 convolution, the gate has C instead of 2C channels, or the
  # head is missing a layer: the count is the architecture written as a formula.
  model = registry.build('causal_conv_lm', None, vocab_size=65)
  assert isinstance(model, CausalConvLM) and model.receptive_field == 128
  tokens_BxT = jnp.zeros((1, 8), jnp.int32)
  variables = model.init(jax.random.key(0), tokens_BxT)
  vocab, channels, k, blocks = 65, 128, 2, 7
  embed = vocab * channels
  block = (k * channels * 2 * channels + 2 * channels) + (channels * channels + channels)
  head = (channels * channels + channels) + (channels * vocab + vocab)
  assert sum(leaf.size for leaf in jax.tree.leaves(variables)) == embed + blocks * block + head == 609345
  assert model.apply(variables, tokens_BxT).shape == (1, 8, vocab)
