"""GPT (Radford et al. 2018, 2019) against independent references: decoding through the
key/value cache equals the full causal pass for every position scheme, changing token t leaves
the logits before t bit-identical, tied logits are h Eᵀ, parameter counts follow the
architecture formula, and bad options stop at construction."""

import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.attention import positions as positions_lib
from models.transformer.gpt import GPT
from tests.models import dropout_probe
from train import sampling

V, D, HEADS, LAYERS, MAX_LENGTH = 13, 16, 2, 2, 8
SCHEMES = positions_lib.SCHEMES  # learned, sinusoidal, alibi, rotary, none


def tiny_gpt(**options):
  return GPT(**{'vocab_size': V, 'num_layers': LAYERS, 'features': D, 'num_heads': HEADS,
                'max_length': MAX_LENGTH, **options})


def random_params(model, seed, steps=MAX_LENGTH, scale=0.5):
  """N(0, scale²) draws in the shapes of the model's parameters (LayerNorm scales and every
  bias included, which init ones and zeros), so that every parameter matters and logits are
  of order one; `eval_shape` compiles nothing."""
  tokens = jnp.zeros((1, steps), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), tokens)))['params']
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda a: (rng.normal(size=a.shape) * scale).astype(np.float32),
                                shapes)


def tokens(seed, batch=2, steps=MAX_LENGTH):
  return np.random.default_rng(seed).integers(0, V, size=(batch, steps)).astype(np.int32)


@functools.partial(jax.jit, static_argnums=(0,))
def _full_and_decoded(model, params, tokens_BxT, changed_BxT):
  """Logits of the full causal pass for two token arrays, and of `tokens` decoded through the
  cache (a) one token per call and (b) the first three in one call, then one per call."""
  batch = tokens_BxT.shape[0]
  both = model.apply({'params': params}, jnp.concatenate([tokens_BxT, changed_BxT]))
  full, changed = both[:batch], both[batch:]
  initial_cache = model.init(jax.random.PRNGKey(0), tokens_BxT, decode=True)['cache']

  def step(cache, token_B):
    logits_Bx1xV, mutated = model.apply({'params': params, 'cache': cache}, token_B[:, None],
                                        decode=True, mutable=['cache'])
    return mutated['cache'], logits_Bx1xV[:, 0]

  def one_per_call(cache, tokens_BxS):
    _, logits_SxBxV = jax.lax.scan(step, cache, tokens_BxS.T)
    return logits_SxBxV.transpose(1, 0, 2)

  chunk_logits, mutated = model.apply({'params': params, 'cache': initial_cache},
                                      tokens_BxT[:, :3], decode=True, mutable=['cache'])
  rest = one_per_call(mutated['cache'], tokens_BxT[:, 3:])
  chunk_then_one = jnp.concatenate([chunk_logits, rest], axis=1)
  return full, changed, one_per_call(initial_cache, tokens_BxT), chunk_then_one


CHANGED_AT = 4


def _logits(positions):
  model = tiny_gpt(positions=positions)
  x, changed = tokens(1), tokens(1)
  changed[:, CHANGED_AT] = (changed[:, CHANGED_AT] + 1) % V
  return jax.tree_util.tree_map(np.asarray, _full_and_decoded(
      model, random_params(model, 2), x, changed))


@pytest.mark.parametrize('positions', SCHEMES)
def test_decoding_through_the_cache_matches_the_full_causal_pass(positions):
  full, _, one_by_one, chunk_then_one = _logits(positions)
  assert np.abs(full).max() > 1.0  # logits of order one, so the tolerance means something
  # The largest difference measured is 7.2e-7 (logits up to 3.4).
  np.testing.assert_allclose(one_by_one, full, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunk_then_one, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('positions', SCHEMES)
def test_changing_token_t_leaves_earlier_logits_bit_identical(positions):
  # The same compiled function as the cache test (same model and shapes).
  full, changed, _, _ = _logits(positions)
  np.testing.assert_array_equal(changed[:, :CHANGED_AT], full[:, :CHANGED_AT])
  assert (np.abs(changed[:, CHANGED_AT] - full[:, CHANGED_AT]).max(-1) > 1e-3).all()


def test_chunked_attention_decodes_through_the_cache_as_the_full_pass():
  # The cache holds every earlier key, so a decoding call is exact attention of its queries
  # over the cache (causal from the cache index on), whatever kind the full pass uses: here
  # blocks of 3 queries and 2 keys, a first call of three tokens, then one per call.
  model = tiny_gpt(attention='chunked', attention_options=(('query_block', 3), ('key_block', 2)))
  full, _, one_by_one, chunk_then_one = jax.tree_util.tree_map(np.asarray, _full_and_decoded(
      model, random_params(model, 2), tokens(1), tokens(3)))
  assert np.abs(full).max() > 1.0
  np.testing.assert_allclose(one_by_one, full, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunk_then_one, full, rtol=1e-5, atol=1e-5)


def test_generate_with_and_without_the_cache_agree():
  model = tiny_gpt(num_layers=1, positions='learned')
  params = random_params(model, 3)
  prompt = tokens(4, steps=3)
  out = {}
  for use_cache in (True, False):
    out[use_cache] = sampling.generate(model, {'params': params}, prompt, jax.random.PRNGKey(5),
                                       num_new_tokens=MAX_LENGTH - 3, use_cache=use_cache,
                                       return_logits=True)
  (tokens_cached, logits_cached), (tokens_full, logits_full) = out[True], out[False]
  np.testing.assert_array_equal(tokens_cached, tokens_full)
  np.testing.assert_array_equal(tokens_cached[:, :3], prompt)
  # The largest differences measured are 7.2e-7 here and 1.0e-6 below (logits up to 3.4).
  np.testing.assert_allclose(logits_cached, logits_full, rtol=0, atol=1e-5)
  # Those are the logits of one full pass over the generated sequence at positions 2 … 6.
  full = model.apply({'params': params}, tokens_full)
  np.testing.assert_allclose(logits_full, full[:, 2:-1], rtol=0, atol=1e-5)


# ---- structure -------------------------------------------------------------------------------

def count_by_hand(*, tied, pre_norm, learned):
  """V·D (tokens) + T_max·D (learned positions) + L·[2·2D (two LayerNorms) + 4·(D² + D)
  (Q, K, V, out) + (D·F + F) + (F·D + D) (MLP)] + 2D (final LayerNorm, pre-LN) + D·V (untied)."""
  f = 4 * D
  block = 2 * 2 * D + 4 * (D * D + D) + (D * f + f) + (f * D + D)
  return (V * D + (MAX_LENGTH * D if learned else 0) + LAYERS * block
          + (2 * D if pre_norm else 0) + (0 if tied else D * V))


@pytest.mark.parametrize('tied, pre_norm, positions, expected', [
    # 208 + 128 + 2·3280 + 32 = 6928, by the formula above with V=13, D=16, L=2, F=64, T=8.
    (True, True, 'learned', 6928),
    (False, True, 'learned', 6928 + 208),
    (True, False, 'learned', 6928 - 32),
    (True, True, 'rotary', 6928 - 128),
])
def test_parameter_counts_follow_the_architecture(tied, pre_norm, positions, expected):
  model = tiny_gpt(tie_embeddings=tied, pre_norm=pre_norm, positions=positions)
  params = random_params(model, 0)
  assert count_by_hand(tied=tied, pre_norm=pre_norm, learned=positions == 'learned') == expected
  assert sum(a.size for a in jax.tree_util.tree_leaves(params)) == expected
  top = {'token_embed', *[f'block{i}' for i in range(LAYERS)]}
  top |= {'position_embed'} if positions == 'learned' else set()
  top |= {'final_norm'} if pre_norm else set()
  top |= set() if tied else {'output'}
  assert set(params) == top
  assert set(params['block0']) == {'self_attention_norm', 'self_attention', 'mlp_norm', 'mlp'}


@pytest.mark.parametrize('tied, pre_norm', [(True, True), (False, True), (True, False)])
def test_logits_are_the_normalised_last_state_times_the_output_matrix(tied, pre_norm):
  """pre-LN: h = final_norm(block_L output); post-LN: h = block_L output, whose last sub-layer
  is already a LayerNorm. Either way (h − β)/γ has zero mean and unit variance per position,
  and logits = h Eᵀ (tied) or h W_out."""
  model = tiny_gpt(tie_embeddings=tied, pre_norm=pre_norm, positions='rotary')
  params = random_params(model, 6)
  norm_path = ('final_norm',) if pre_norm else (f'block{LAYERS - 1}', 'mlp_norm')
  last = 'final_norm' if pre_norm else f'block{LAYERS - 1}'
  logits, state = jax.jit(lambda params, x: model.apply(
      {'params': params}, x, capture_intermediates=lambda module, _: module.name == last,
      mutable=['intermediates']))(params, tokens(7))
  h_BxTxD = np.asarray(state['intermediates'][last]['__call__'][0], np.float64)
  norm = functools.reduce(lambda tree, key: tree[key], norm_path, params)
  standardised = (h_BxTxD - norm['bias']) / norm['scale']
  # Measured: |mean| ≤ 1.1e-7, |variance − 1| ≤ 3.2e-7 (LayerNorm's ε = 1e-6), logits 2.8e-7.
  np.testing.assert_allclose(standardised.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(standardised.var(-1), 1.0, atol=1e-5)
  out_DxV = params['token_embed']['embed']['embedding'].T if tied else params['output']['kernel']
  np.testing.assert_allclose(logits, h_BxTxD @ np.asarray(out_DxV, np.float64), rtol=1e-5,
                             atol=1e-5)


def test_training_drops_out_the_embedding_sum_before_the_first_block():
  # h⁰ = dropout(E[x_t] + P[t]): in training with rate 0.5 each entry of block0's input is 0 or
  # the sum scaled by 1/(1 − 0.5) = 2 (inverted dropout), about half of each; at evaluation
  # it is the sum itself.
  model = tiny_gpt(num_layers=1, dropout_rate=0.5)
  params = random_params(model, 4)
  x = tokens(5)
  table = params['token_embed']['embed']['embedding']
  expected_BxTxD = np.asarray(table, np.float64)[x] + params['position_embed']['embedding'][None]

  def block_input(train):
    (h0,) = dropout_probe.first_block_inputs(lambda: model.apply(
        {'params': params}, x, train=train, rngs={'dropout': jax.random.PRNGKey(0)})).values()
    return h0

  np.testing.assert_allclose(block_input(False), expected_BxTxD, rtol=1e-6, atol=1e-6)
  dropout_probe.assert_inverted_dropout(block_input(True), expected_BxTxD, 0.5, rtol=1e-6,
                                        atol=1e-6)


def test_training_drops_out_the_sub_layer_outputs_of_every_block():
  # Residual dropout (Vaswani et al. 2017, §5.4; GPT-2): the model's rate reaches its blocks,
  # so block0's residual sum is x + drop(a) with each entry of drop(a) 0 or 2a at rate 0.5.
  model = tiny_gpt(num_layers=1, dropout_rate=0.5)
  params = random_params(model, 4)
  x = tokens(5)
  sums = jax.jit(lambda params: dropout_probe.first_residual_sums(lambda: model.apply(
      {'params': params}, x, train=True, rngs={'dropout': jax.random.PRNGKey(0)}),
      pre_norm=True))(params)
  (x_BxTxD, a_BxTxD, s_BxTxD), = sums.values()
  dropout_probe.assert_inverted_dropout(np.asarray(s_BxTxD) - np.asarray(x_BxTxD), a_BxTxD, 0.5,
                                        rtol=1e-5, atol=1e-5)


# ---- options and errors ---------------------------------------------------------------------

def test_training_leaves_the_mlp_hidden_units_undropped():
  # GPT-2's (and nanoGPT's) MLP drops only its output, so with dropout 0.5 the output layer
  # still reads GELU(hidden) exactly; ViT's drops its hidden units too (test_vit.py).
  model = tiny_gpt(num_layers=1, dropout_rate=0.5)
  x = tokens(3)
  params = random_params(model, 4)
  hidden, read = dropout_probe.first_mlp_hidden_units(lambda: model.apply(
      {'params': params}, x, train=True, rngs={'dropout': jax.random.PRNGKey(0)}))
  np.testing.assert_array_equal(read, hidden)


def test_learned_positions_beyond_max_length_raise_and_sinusoidal_extrapolate():
  too_long = jnp.zeros((1, MAX_LENGTH + 1), jnp.int32)
  model = tiny_gpt(num_layers=1, positions='learned')
  with pytest.raises(ValueError, match=f'{MAX_LENGTH + 1} positions exceed max_length={MAX_LENGTH}'
                                       ' of the learned position embedding'):
    jax.eval_shape(model.init, jax.random.PRNGKey(0), too_long)
  with pytest.raises(ValueError, match=f'exceed max_length={MAX_LENGTH}'):
    jax.eval_shape(functools.partial(model.init, decode=True), jax.random.PRNGKey(0), too_long)
  # A formula has no last row: sinusoidal positions (and those inside attention) go on.
  for positions in ('sinusoidal', 'alibi', 'rotary'):
    shapes = jax.eval_shape(tiny_gpt(num_layers=1, positions=positions).init,
                            jax.random.PRNGKey(0), too_long)
    assert 'position_embed' not in shapes['params']


@pytest.mark.parametrize('options, message', [
    (dict(features=30, num_heads=4), 'features=30 must be divisible by num_heads=4'),
    (dict(positions='absolute'), "positions='absolute'; allowed: sinusoidal, learned, alibi"),
    (dict(features=12, num_heads=4, positions='rotary'), 'even head width, got 3'),
    (dict(num_layers=0), 'num_layers must be a positive integer, got 0'),
    (dict(dropout_rate=1.0), 'dropout_rate must lie in \\[0, 1\\), got 1.0'),
    (dict(vocab_size=0), 'vocab_size must be a positive integer, got 0'),
    (dict(vocab_size=12.5), 'vocab_size must be a positive integer, got 12.5'),
    # Only mlp_dim may be None (the default 4·D); a None layer count is refused at
    # construction, not left to fail inside the first call.
    (dict(num_layers=None), 'num_layers must be a positive integer, got None'),
    (dict(max_length=0), 'max_length must be a positive integer, got 0'),
    # Each projected Linformer key mixes every position, the future ones included.
    (dict(attention='linformer'), 'GPT is causal and Linformer attention cannot be'),
])
def test_bad_options_raise_at_construction(options, message):
  with pytest.raises(ValueError, match=message):
    tiny_gpt(**options)


def test_generation_reads_max_length_tokens_and_uses_the_cache_of_exact_and_chunked_only():
  # The sampler's protocol (train/sampling.py): `max_context` tokens at most, the cache only when
  # `has_cache`; kernel approximations such as 'performer' keep no keys and values.
  assert tiny_gpt().max_context == MAX_LENGTH
  assert tiny_gpt(positions='rotary', max_length=5).max_context == 5
  assert tiny_gpt().has_cache and tiny_gpt(attention='chunked').has_cache
  assert not tiny_gpt(attention='performer').has_cache


def test_bfloat16_compute_dtypes():
  """Every projection computes in bfloat16; parameters, LayerNorms and logits stay float32."""
  model = tiny_gpt(dtype=jnp.bfloat16)
  x = jnp.zeros((1, 4), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)
  assert {a.dtype for a in jax.tree_util.tree_leaves(nn.unbox(variables))} == {jnp.dtype('float32')}
  logits, state = jax.eval_shape(lambda variables: model.apply(
      variables, x, capture_intermediates=True, mutable=['intermediates']), variables)
  assert logits.dtype == jnp.float32
  outputs = {'/'.join(path[:-2]): leaf.dtype for path, leaf in _flatten(state['intermediates'])
             if path[-2] == '__call__'}
  layers = (('self_attention', ('query', 'key', 'value', 'out')), ('mlp', ('hidden', 'output')))
  projections = [f'block{i}/{layer}/{name}' for i in range(LAYERS) for layer, names in layers
                 for name in names]
  for name in projections + ['token_embed', 'token_embed/embed']:
    assert outputs[name] == jnp.bfloat16, (name, outputs[name])
  for name in ['final_norm'] + [f'block{i}/{n}_norm' for i in range(LAYERS)
                                for n in ('self_attention', 'mlp')]:
    assert outputs[name] == jnp.float32, (name, outputs[name])


def _flatten(tree, path=()):
  if isinstance(tree, dict):
    for key, value in tree.items():
      yield from _flatten(value, path + (key,))
  elif isinstance(tree, (tuple, list)):
    for i, value in enumerate(tree):
      yield from _flatten(value, path + (i,))
  else:
    yield path, tree


def test_bfloat16_compute_is_close_to_float32():
  params = random_params(tiny_gpt(), 8)
  x = tokens(9, batch=4)
  forward = jax.jit(lambda model, params, x: model.apply({'params': params}, x), static_argnums=0)
  logits_f32 = np.asarray(forward(tiny_gpt(), params, x))
  logits_bf16 = forward(tiny_gpt(dtype=jnp.bfloat16), params, x)
  assert logits_bf16.dtype == jnp.float32
  error = np.linalg.norm(np.asarray(logits_bf16) - logits_f32) / np.linalg.norm(logits_f32)
  # bfloat16 keeps 8 significant bits (relative rounding 2^-9 ≈ 0.2%); through two blocks the
  # measured relative error is 0.44%. Zero would mean the compute dtype was ignored.
  assert 0 < error < 0.02, error
  # The same most likely next token wherever float32's top two logits are not nearly tied.
  top2 = np.sort(logits_f32, -1)[..., -2:]
  clear = top2[..., 1] - top2[..., 0] > 0.1
  assert clear.sum() >= 16  # 25 of 32 positions
  np.testing.assert_array_equal(np.argmax(logits_bf16, -1)[clear], np.argmax(logits_f32, -1)[clear])


def test_registry_builds_gpt_from_a_config():
  model = registry.build('gpt', vocab_size=V, num_layers=LAYERS, features=D, num_heads=HEADS,
                         max_length=MAX_LENGTH, dtype='bfloat16')
  assert model == tiny_gpt(dtype=jnp.bfloat16)
  from_data = registry.build('gpt', data_defaults={'vocab_size': V}, num_layers=LAYERS, features=D,
                             num_heads=HEADS, max_length=MAX_LENGTH)
  assert from_data == tiny_gpt()
  with pytest.raises(ValueError, match='config.model.vocab_size=7 does not match the data'):
    registry.build('gpt', vocab_size=7, data_defaults={'vocab_size': V})
  with pytest.raises(ValueError, match="positions='absolute'"):
    registry.build('gpt', vocab_size=V, positions='absolute')
  shapes = nn.unbox(jax.eval_shape(from_data.init, jax.random.PRNGKey(0),
                                   jnp.zeros((2, 5), jnp.int32)))
  assert shapes['params']['token_embed']['embed']['embedding'].shape == (V, D)


def test_scaled_embeddings_equal_a_table_multiplied_by_root_d():
  """scale_embeddings reads √D·E[x]: the same logits as an unscaled model whose input table
  is √D·E (untied, so the output layer does not see the table)."""
  scaled = tiny_gpt(tie_embeddings=False, positions='sinusoidal', scale_embeddings=True)
  params = random_params(scaled, 8)
  tokens = jnp.asarray(np.random.default_rng(9).integers(0, V, (2, MAX_LENGTH)), jnp.int32)
  table_params = jax.tree_util.tree_map(lambda x: x, params)
  table_params['token_embed']['embed']['embedding'] = (
      params['token_embed']['embed']['embedding'] * np.sqrt(D))
  unscaled = tiny_gpt(tie_embeddings=False, positions='sinusoidal')
  got = scaled.apply({'params': params}, tokens)
  np.testing.assert_allclose(got, unscaled.apply({'params': table_params}, tokens),
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(got, unscaled.apply({'params': params}, tokens), atol=1e-2)


def test_initial_embedding_and_output_scales():
  """GPT-2's initialisation: the token table E ~ N(0, 0.02²), and the untied output layer
  LeCun normal (std 1/√D). A table drawn at std 1 would give tied logits h Eᵀ of order √D
  at the start instead of about 0.02·√D."""
  model = GPT(vocab_size=512, num_layers=1, features=64, num_heads=2, max_length=4,
              tie_embeddings=False)
  params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))
  table = np.asarray(params['params']['token_embed']['embed']['embedding'])
  output = np.asarray(params['params']['output']['kernel'])
  # 32,768 entries each: the standard error of a standard deviation is ≈ 0.4 %.
  np.testing.assert_allclose(table.std(), 0.02, rtol=0.03)
  np.testing.assert_allclose(output.std(), 1 / np.sqrt(64), rtol=0.03)
  # The learned position table P too is N(0, 0.02²) (256 entries: standard error ≈ 4.4 %).
  positions = np.asarray(params['params']['position_embed']['embedding'])
  np.testing.assert_allclose(positions.std(), 0.02, rtol=0.2)
  # Every LayerNorm starts as plain standardisation (γ = 1, β = 0) and every bias at 0.
  flat = flax.traverse_util.flatten_dict(params['params'])
  norms = [path for path in flat if path[-2].endswith('norm')]
  assert len(norms) == 2 * 3  # block0's two and the final one, each a scale and a bias
  for path, value in flat.items():
    if path[-1] in ('scale', 'bias'):
      np.testing.assert_array_equal(value, float(path[-1] == 'scale'), err_msg=str(path))


@pytest.mark.parametrize('tokens_in, described', [
    (np.zeros((MAX_LENGTH,), np.int32), r'int32 of shape \(8,\)'),  # one sequence, no batch axis
    (np.zeros((2, MAX_LENGTH), np.float32), r'float32 of shape \(2, 8\)'),
])
def test_tokens_without_a_batch_axis_or_not_integers_are_one_sentence(tokens_in, described):
  model = tiny_gpt()
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens(0)))
  with pytest.raises(ValueError, match='A Transformer reads token ids as integers of shape '
                                       r'\[batch, length\], got ' + described + r'\.'):
    jax.eval_shape(lambda v: model.apply(v, tokens_in), variables)
