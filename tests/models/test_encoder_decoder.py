"""The Transformer encoder–decoder (Vaswani et al. 2017) against independent references: cached
greedy decoding equals decoding without the cache and the teacher-forced pass over the decoded
prefix, decoder input t changes no logit before t, source padding changes no logit, post-LN
blocks output LayerNorm(x + f(x)) and pre-LN blocks x + f(LayerNorm(x)), the logits equal a
float64 NumPy forward pass of the whole model, and a tiny model learns a few pairs exactly
through the train step."""

import functools

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import registry
from models.sequence.rnn_models import BOS_ID
from models.transformer.encoder_decoder import TransformerSeq2Seq
from tests.models import dropout_probe
from tests.models.test_attention import padding_allowed
from tests.models.test_transformer_reference import (perturbed_params, reference_block,
                                                     reference_layer_norm)
from train import sampling, step, tasks
from train.state import init_train_state

SOURCE = np.random.default_rng(0).integers(3, 120, size=(3, 9)).astype(np.int32)
LENGTHS = np.array([9, 5, 2], np.int32)
TARGETS = np.random.default_rng(1).integers(3, 120, size=(3, 6)).astype(np.int32)


def _model(**options):
  return TransformerSeq2Seq(128, **{'num_layers': 2, 'features': 16, 'num_heads': 2,
                                    'max_length': 16, **options})


def _random_params(model, seed=0, scale=0.5):
  """N(0, scale²) draws in the shapes of the model's parameters (biases included, so that every
  parameter matters and logits are of order one), but LayerNorm scales 1 and offsets 0;
  `eval_shape` compiles nothing."""
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), TARGETS, SOURCE,
                                                      LENGTHS)))['params']
  rng = np.random.default_rng(seed)
  flat = {}
  for key, shape in flax.traverse_util.flatten_dict(shapes).items():
    if key[-2].endswith('_norm'):
      flat[key] = np.full(shape.shape, 1.0 if key[-1] == 'scale' else 0.0, np.float32)
    else:
      flat[key] = (rng.normal(size=shape.shape) * scale).astype(np.float32)
  return flax.traverse_util.unflatten_dict(flat)


@functools.cache
def _apply(model, **options):
  """`model.apply` compiled once per model (a whole program compiles faster than op by op)."""
  return jax.jit(functools.partial(model.apply, **options))


def _layer_norm(x):
  """(x − mean) / √(var + ε) over the width, ε = 1e-6 (flax's default), scale 1 and offset 0."""
  x = np.asarray(x, np.float64)
  return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)


def _sinusoidal(steps, width):
  """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)), written out."""
  table = np.zeros((steps, width))
  for p in range(steps):
    for i in range(width // 2):
      table[p, 2 * i] = np.sin(p / 10000 ** (2 * i / width))
      table[p, 2 * i + 1] = np.cos(p / 10000 ** (2 * i / width))
  return table


def _reference_seq2seq(params, targets_BxN, source_BxS, lengths_B, *, num_layers, pre_norm,
                       tie_embeddings):
  """float64: h⁰ = √D·E_src[x] + PE, encoder blocks over the valid source keys (then a
  LayerNorm if pre-LN) give the memory hᴸ; g⁰ = √D·E_tgt[y] + PE, decoder blocks with causal
  self-attention and cross-attention to hᴸ (then a LayerNorm if pre-LN);
  logits = gᴸ E_tgtᵀ or gᴸ W_out."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  encoder, decoder = p['encoder'], p['decoder']
  allowed_Bx1x1xS = padding_allowed(lengths_B, source_BxS.shape[1])

  def embed(table_VxD, tokens_BxT):
    width = table_VxD.shape[1]
    return np.sqrt(width) * table_VxD[tokens_BxT] + _sinusoidal(tokens_BxT.shape[1], width)[None]

  h = embed(encoder['source_embed']['embed']['embedding'], source_BxS)
  for layer in range(num_layers):
    h = reference_block(encoder[f'block{layer}'], h, pre_norm=pre_norm, allowed=allowed_Bx1x1xS)
  if pre_norm:
    h = reference_layer_norm(encoder['final_norm'], h)
  table_VxD = decoder['target_embed']['embed']['embedding']
  g = embed(table_VxD, targets_BxN)
  for layer in range(num_layers):
    g = reference_block(decoder[f'block{layer}'], g, h, pre_norm=pre_norm, causal=True,
                        memory_allowed=allowed_Bx1x1xS)
  if pre_norm:
    g = reference_layer_norm(decoder['final_norm'], g)
  return g @ (table_VxD.T if tie_embeddings else decoder['output']['kernel'])


@pytest.mark.parametrize('pre_norm, tie_embeddings', [(False, True), (True, False)])
def test_logits_match_a_float64_reference_of_the_whole_forward_pass(pre_norm, tie_embeddings):
  # Every parameter N(0, 0.3²) around its initial centre (LayerNorm scales ≠ 1, biases ≠ 0), so
  # the encoder's final LayerNorm and every other piece changes the logits.
  model = _model(pre_norm=pre_norm, tie_embeddings=tie_embeddings)
  params = perturbed_params(model, 3, TARGETS, SOURCE, LENGTHS)
  logits_BxNxV = _apply(model)({'params': params}, TARGETS, SOURCE, LENGTHS)
  expected_BxNxV = _reference_seq2seq(params, TARGETS, SOURCE, LENGTHS, num_layers=2,
                                      pre_norm=pre_norm, tie_embeddings=tie_embeddings)
  assert logits_BxNxV.shape == (3, 6, 128)
  # float32 against float64, logits up to 4.7: the largest differences measured are 1.4e-6
  # (post-LN) and 1.9e-6 (pre-LN).
  np.testing.assert_allclose(logits_BxNxV, expected_BxNxV, rtol=1e-6, atol=1e-5)


def test_cached_greedy_decoding_equals_decoding_without_the_cache_and_the_whole_prefix():
  # Pre-LN: with these random parameters post-LN decodes one token over and over.
  model = _model(tie_embeddings=False, pre_norm=True)
  variables = {'params': _random_params(model)}
  prompt = np.full((3, 1), BOS_ID, np.int32)
  outputs = {use_cache: sampling.generate(
      model, variables, prompt, jax.random.PRNGKey(0), num_new_tokens=7, temperature=0.0,
      use_cache=use_cache, inputs=(SOURCE, LENGTHS), return_logits=True)
             for use_cache in (True, False)}
  tokens, logits = outputs[True]
  np.testing.assert_array_equal(tokens, outputs[False][0])
  np.testing.assert_allclose(logits, outputs[False][1], atol=1e-5)
  # Reference: one teacher-forced pass over the decoded prefix gives every step's logits,
  # and each token is the argmax of the logits before it.
  full = _apply(model)(variables, tokens[:, :-1], SOURCE, LENGTHS)
  np.testing.assert_allclose(logits, full, atol=1e-5)
  np.testing.assert_array_equal(tokens[:, 1:], np.argmax(full, -1))
  assert len(np.unique(tokens[:, 1:])) > 3  # not a degenerate constant decoding


@pytest.mark.parametrize('positions', ['sinusoidal', 'rotary'])
def test_a_cached_call_of_several_targets_moves_the_position_by_their_number(positions):
  # The sampler reads one token per call; a caller may read a prefix in one. Three targets in
  # the first cached call, then one per call: each call's logits are the teacher-forced pass's,
  # which needs the position to move by 3 after the first call, not by 1: the decoder's counter
  # for the sinusoidal table, the attention's cache index for rotary angles.
  model = _model(tie_embeddings=False, pre_norm=True, positions=positions)
  variables = {'params': _random_params(model)}
  cache = model.init(jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS, decode=True)['cache']
  decoded = []
  for start, stop in ((0, 3), (3, 4), (4, 5), (5, 6)):
    logits, mutated = _apply(model, decode=True, mutable='cache')(
        {**variables, 'cache': cache}, TARGETS[:, start:stop], SOURCE, LENGTHS)
    cache = mutated['cache']
    decoded.append(logits)
  full = _apply(model)(variables, TARGETS, SOURCE, LENGTHS)
  np.testing.assert_allclose(np.concatenate(decoded, axis=1), full, atol=1e-5)


@pytest.mark.parametrize('use_cache', [True, False])
def test_decoding_reads_no_more_positions_than_it_predicts_from(use_cache):
  # L = 1 + 7 tokens are decoded from positions 0 … 6 only; the cache was sized, and the
  # window without it read, for all 8, so a learned table of exactly 7 positions (enough to
  # train on these targets) raised at the first evaluation.
  model = _model(tie_embeddings=False, pre_norm=True, positions='learned', max_length=9)
  variables = {'params': _random_params(model)}
  tight = _model(tie_embeddings=False, pre_norm=True, positions='learned', max_length=7)
  params = flax.traverse_util.flatten_dict(variables['params'])
  params = flax.traverse_util.unflatten_dict(
      {k: v[:7] if 'position_embed' in k else v for k, v in params.items()})
  source, lengths = SOURCE[:, :7], np.minimum(LENGTHS, 7)
  prompt = np.full((3, 1), BOS_ID, np.int32)
  decode = lambda m, v: sampling.generate(m, v, prompt, jax.random.PRNGKey(0), num_new_tokens=7,
                                          temperature=0.0, use_cache=use_cache,
                                          inputs=(source, lengths))
  # The first 7 rows of the larger table are the smaller one's, so both decode alike.
  np.testing.assert_array_equal(decode(tight, {'params': params}), decode(model, variables))


# Variants of (TARGETS, SOURCE) stacked on the batch axis, so one compiled call serves them all;
# 125 is a token neither holds.
_PAST_BxS = np.arange(SOURCE.shape[1])[None] >= LENGTHS[:, None]
_VARIANTS = {
    'base': (TARGETS, SOURCE),
    'target 1 changed': (np.where(np.arange(6) == 1, 125, TARGETS), SOURCE),
    'target 4 changed': (np.where(np.arange(6) == 4, 125, TARGETS), SOURCE),
    'padding 0': (TARGETS, np.where(_PAST_BxS, 0, SOURCE)),
    'padding 47': (TARGETS, np.where(_PAST_BxS, 47, SOURCE)),
    'source 1 changed': (TARGETS, np.where(np.arange(9) == 1, 125, SOURCE)),
}


@functools.cache
def _variant_logits():
  """{variant: logits [3, 6, V]} with the source lengths, the base without lengths, and row 2
  alone with its source cut at its length 2."""
  model = _model()
  params = _random_params(model)

  @jax.jit
  def run(params):
    apply = lambda *inputs: model.apply({'params': params}, *inputs)
    targets = np.concatenate([t for t, _ in _VARIANTS.values()])
    sources = np.concatenate([s for _, s in _VARIANTS.values()])
    stacked = apply(targets, sources, np.tile(LENGTHS, len(_VARIANTS)))
    return (stacked.reshape((len(_VARIANTS), 3) + stacked.shape[1:]), apply(TARGETS, SOURCE),
            apply(TARGETS[2:], SOURCE[2:, :2], LENGTHS[2:]))

  stacked, unmasked, alone = jax.device_get(run(params))
  return dict(zip(_VARIANTS, stacked)), unmasked, alone


def test_changing_decoder_input_t_changes_no_logit_before_t():
  logits = _variant_logits()[0]
  for t in (1, 4):
    changed = logits[f'target {t} changed']
    np.testing.assert_array_equal(logits['base'][:, :t], changed[:, :t])
    assert np.abs(logits['base'][:, t] - changed[:, t]).max(-1).min() > 1e-3


def test_source_padding_changes_no_logit():
  logits, unmasked, alone = _variant_logits()
  np.testing.assert_array_equal(logits['padding 0'], logits['base'])
  np.testing.assert_array_equal(logits['padding 47'], logits['base'])
  # Reference: row 2 with no padding at all (its source cut at its length); the logits are of
  # order 3, and the other shapes round differently (measured up to 3e-6).
  np.testing.assert_allclose(alone[0], logits['base'][2], atol=1e-5)
  # Without lengths every position is a key: the full-length row is unchanged, the others differ.
  np.testing.assert_allclose(unmasked[0], logits['base'][0], atol=1e-5)
  assert np.abs(unmasked[1:] - logits['base'][1:]).max(axis=(1, 2)).min() > 1e-3
  # A valid source token matters (source position 1 is valid in every row).
  assert np.abs(logits['source 1 changed'] - logits['base']).max(axis=(1, 2)).min() > 1e-3


def _block_outputs(model, params):
  """{stack: ([output of each block], output of the final norm or None)} for both stacks."""
  _, state = _apply(model, capture_intermediates=True, mutable=('intermediates',))(
      {'params': params}, TARGETS, SOURCE, LENGTHS)
  outputs = {}
  for stack in ('encoder', 'decoder'):
    captured = state['intermediates'][stack]
    blocks = [captured[f'block{layer}']['__call__'][0] for layer in range(model.num_layers)]
    final = captured['final_norm']['__call__'][0] if 'final_norm' in captured else None
    outputs[stack] = blocks, final
  return outputs


@pytest.mark.parametrize('pre_norm', [None, False, True])
def test_post_ln_blocks_output_normalised_rows_and_pre_ln_blocks_do_not(pre_norm):
  # None: the default, post-LN as in the paper.
  model = _model() if pre_norm is None else _model(pre_norm=pre_norm)
  for stack, (blocks, final) in _block_outputs(model, _random_params(model)).items():
    rows = np.concatenate([np.asarray(b).reshape(-1, model.features) for b in blocks])
    if pre_norm:
      # The residual stream is not normalised; the final LayerNorm is.
      assert np.abs(rows.std(-1) - 1).max() > 0.1, stack
      rows = np.asarray(final).reshape(-1, model.features)
    else:
      assert final is None
    np.testing.assert_allclose(rows.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(rows.std(-1), 1, atol=1e-5)


@pytest.mark.parametrize('pre_norm', [False, True])
def test_with_zero_sublayers_pre_ln_is_the_identity_and_post_ln_a_layer_norm(pre_norm):
  # Zero output projections make every sub-layer f(x) = 0: pre-LN gives x + f(LN(x)) = x,
  # post-LN gives LayerNorm(x + f(x)) = LayerNorm(x), once per sub-layer.
  model = _model(pre_norm=pre_norm)
  flat = flax.traverse_util.flatten_dict(_random_params(model))
  flat = {key: np.zeros_like(value) if key[-2] == 'out' or key[-3:-1] == ('mlp', 'output')
          else value for key, value in flat.items()}
  params = flax.traverse_util.unflatten_dict(flat)
  outputs = _block_outputs(model, params)
  width = model.features
  for stack, tokens, sublayers in (('encoder', SOURCE, 2), ('decoder', TARGETS, 3)):
    embed = 'source_embed' if stack == 'encoder' else 'target_embed'
    table = params[stack][embed]['embed']['embedding']
    # x⁰ = √D·E[x] + PE (Vaswani et al. 2017, §3.4 and §3.5).
    x = np.sqrt(width) * table[tokens] + _sinusoidal(tokens.shape[1], width)[None]
    blocks, final = outputs[stack]
    for block in blocks:
      if not pre_norm:
        for _ in range(sublayers):
          x = _layer_norm(x)
      np.testing.assert_allclose(block, x, atol=1e-5)
    if pre_norm:
      np.testing.assert_allclose(final, _layer_norm(x), atol=1e-5)


def test_training_drops_out_the_embedding_sums_and_sub_layer_outputs_of_both_stacks():
  # x⁰ = dropout(√D·E[x] + PE) (§3.4, §3.5, §5.4): in training with rate 0.5 each entry of
  # block0's input x, in the encoder and in the decoder, is 0 or the sum scaled by
  # 1/(1 − 0.5) = 2, about half of each. The rate reaches the blocks too (residual dropout,
  # §5.4): block0's first LayerNorm (post-LN) reads x + drop(a), each entry of drop(a) 0 or 2a.
  model = _model(num_layers=1, dropout_rate=0.5)
  params = _random_params(model)
  sums = jax.jit(lambda params: dropout_probe.first_residual_sums(lambda: model.apply(
      {'params': params}, TARGETS, SOURCE, LENGTHS, train=True,
      rngs={'dropout': jax.random.PRNGKey(0)}), pre_norm=False))(params)
  assert set(sums) == {'encoder', 'decoder'}
  width = model.features
  for stack, embed, tokens in (('encoder', 'source_embed', SOURCE),
                               ('decoder', 'target_embed', TARGETS)):
    x_BxTxD, a_BxTxD, s_BxTxD = sums[stack]
    table = np.asarray(params[stack][embed]['embed']['embedding'], np.float64)
    expected = np.sqrt(width) * table[tokens] + _sinusoidal(tokens.shape[1], width)[None]
    dropout_probe.assert_inverted_dropout(x_BxTxD, expected, 0.5, rtol=1e-5, atol=1e-5,
                                          err_msg=stack)
    dropout_probe.assert_inverted_dropout(np.asarray(s_BxTxD) - np.asarray(x_BxTxD), a_BxTxD,
                                          0.5, rtol=1e-5, atol=1e-5, err_msg=stack)


def test_the_feed_forward_layers_are_four_times_as_wide_by_default():
  # Vaswani et al. 2017, §3.3: d_ff = 4·d_model (2048 for 512), in every block of both stacks.
  params = jax.eval_shape(lambda: nn.unbox(_model().init(
      jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS)))['params']
  for stack in ('encoder', 'decoder'):
    for block in ('block0', 'block1'):
      mlp = params[stack][block]['mlp']
      assert mlp['hidden']['kernel'].shape == (16, 64), (stack, block)
      assert mlp['output']['kernel'].shape == (64, 16), (stack, block)


def test_registry_builds_it_with_its_options_and_float32_parameters():
  model = registry.build('transformer_seq2seq', vocab_size=100, source_vocab_size=60,
                         num_layers=1, features=16, num_heads=2, mlp_dim=24,
                         tie_embeddings=False, dtype='bfloat16')
  assert isinstance(model, TransformerSeq2Seq) and model.dtype == jnp.bfloat16
  variables = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.PRNGKey(0), TARGETS % 100, SOURCE % 60, LENGTHS)))
  params = variables['params']
  assert params['encoder']['source_embed']['embed']['embedding'].shape == (60, 16)
  assert params['decoder']['target_embed']['embed']['embedding'].shape == (100, 16)
  assert params['decoder']['output']['kernel'].shape == (16, 100)
  assert params['encoder']['block0']['mlp']['hidden']['kernel'].shape == (16, 24)
  assert 'cross_attention' in params['decoder']['block0']
  assert 'cross_attention' not in params['encoder']['block0']
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  logits = jax.eval_shape(model.apply, variables, TARGETS % 100, SOURCE % 60, LENGTHS)
  assert logits.shape == (3, 6, 100) and logits.dtype == jnp.float32
  tied, post_ln = (jax.eval_shape(lambda m=m: nn.unbox(m.init(
      jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS)))['params']['decoder']
                    for m in (_model(pre_norm=True), _model()))
  assert 'output' not in tied and 'final_norm' in tied
  assert 'final_norm' not in post_ln  # post-LN by default: the blocks end in a LayerNorm


@pytest.mark.parametrize('positions', ['rotary', 'alibi'])
def test_rotary_and_alibi_models_run_with_no_position_table(positions):
  # Rotary and ALiBi positions are relative offsets within one sequence: they act in the
  # encoder's and the decoder's self-attention, and cross-attention (queries of the target,
  # keys of the source) must take none, or the model cannot run. No table is added to the
  # embeddings (`eval_shape`: nothing runs).
  model = _model(num_layers=1, positions=positions)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS))
  params = flax.traverse_util.flatten_dict(nn.unbox(variables)['params'])
  assert not [path for path in params if 'position_embed' in path]
  logits = jax.eval_shape(lambda v: model.apply(v, TARGETS, SOURCE, LENGTHS), variables)
  assert logits.shape == (3, 6, 128)


def test_bfloat16_compute_in_every_projection_of_both_stacks():
  """dtype=bfloat16 reaches every projection, the cross-attention's included; parameters,
  LayerNorms and logits stay float32 (`eval_shape`: nothing runs)."""
  model = _model(num_layers=1, dtype=jnp.bfloat16)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS))
  assert {a.dtype for a in jax.tree.leaves(nn.unbox(variables))} == {jnp.dtype('float32')}
  logits, state = jax.eval_shape(lambda v: model.apply(
      v, TARGETS, SOURCE, LENGTHS, capture_intermediates=True, mutable=['intermediates']),
      variables)
  assert logits.dtype == jnp.float32
  outputs = {'/'.join(str(key.key) for key in path[:-2]): a.dtype
             for path, a in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]
             if path[-2].key == '__call__'}
  attention = ('query', 'key', 'value', 'out')
  layers = {'encoder': {'self_attention': attention, 'mlp': ('hidden', 'output')},
            'decoder': {'self_attention': attention, 'cross_attention': attention,
                        'mlp': ('hidden', 'output')}}
  for stack, sublayers in layers.items():
    for layer, names in sublayers.items():
      for name in names:
        assert outputs[f'{stack}/block0/{layer}/{name}'] == jnp.bfloat16, (stack, layer, name)
      assert outputs[f'{stack}/block0/{layer}_norm'] == jnp.float32, (stack, layer)


@pytest.mark.parametrize('options, message', [
    (dict(features=30), 'features=30 must be divisible by num_heads=4'),
    (dict(positions='relative'), "positions='relative'"),
    (dict(dropout_rate=1.0), 'dropout_rate must lie in'),
    (dict(dropout_rate=None), r'dropout_rate must lie in \[0, 1\), got None'),  # was a TypeError
    (dict(num_layers=0), 'num_layers must be a positive integer, got 0'),
    (dict(source_vocab_size=0), 'source_vocab_size must be None'),
])
def test_bad_options_raise_one_sentence_naming_the_value(options, message):
  with pytest.raises(ValueError, match=message) as error:
    registry.build('transformer_seq2seq', vocab_size=128, num_heads=4, **options)
  assert str(error.value).endswith('.') and str(error.value).count('. ') == 0


@pytest.mark.parametrize('positions, source, message', [
    ('sinusoidal', np.zeros((3, 9), np.float32), 'token ids'),
    ('learned', np.ones((3, 20), np.int32), '20 positions exceed max_length=16'),
])
def test_bad_inputs_raise_a_value_error_naming_them(positions, source, message):
  model = _model(positions=positions)
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), TARGETS, source, LENGTHS))


def test_a_tiny_model_learns_to_reverse_six_words_through_the_train_step():
  words = ['abc', 'hello', 'xy', 'jax', 'flax', 'q']
  source = np.zeros((len(words), 6), np.uint8)
  target = np.zeros((len(words), 5), np.uint8)
  for row, word in enumerate(words):
    source[row, :len(word)] = np.frombuffer(word.encode(), np.uint8)
    target[row, :len(word)] = np.frombuffer(word[::-1].encode(), np.uint8)
  lengths = np.array([len(w) for w in words], np.int32)
  task = tasks.build('seq2seq', {'features': ('source', 'source_length', 'target',
                                              'target_length')}, max_target_length=5)
  batch = task.preprocess({'source': source, 'source_length': lengths, 'target': target,
                           'target_length': lengths})
  # No biases: fewer parameter leaves, which train_step's finiteness guard compiles slowly.
  model = _model(num_layers=1, features=32, use_bias=False)
  tx = optax.adam(5e-3)
  state = jax.jit(lambda key: init_train_state(model, task, tx, key, batch))(jax.random.PRNGKey(0))
  train_step = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                         learning_rate_fn=optax.constant_schedule(5e-3)))
  eval_step = jax.jit(functools.partial(step.eval_step, model=model, task=task))
  eval_batch = {**batch, 'mask': np.ones(len(words), np.int32)}

  def exact_match(state):
    total, weight = eval_step(state, eval_batch, 0)['exact_match']
    return float(total) / float(weight)

  assert exact_match(state) == 0.0
  for _ in range(100):
    state, metrics = train_step(state, batch)
  assert int(metrics['skipped']) == 0
  loss_total, loss_weight = metrics['totals']['loss']
  assert float(loss_total) / float(loss_weight) < 0.1
  assert exact_match(state) == 1.0


def test_targets_of_another_batch_than_the_source_are_one_sentence():
  model = _model()
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), TARGETS, SOURCE, LENGTHS))
  with pytest.raises(ValueError, match=r"reads targets \[batch, length\] of the source's batch 3, "
                                       r'got targets of shape \(2, 6\)\.'):
    jax.eval_shape(lambda v: model.apply(v, TARGETS[:2], SOURCE, LENGTHS), variables)
  more_targets = np.concatenate([TARGETS, TARGETS[:1]])  # a larger batch is as wrong
  with pytest.raises(ValueError, match=r"of the source's batch 3, got targets of shape \(4, 6\)"):
    jax.eval_shape(lambda v: model.apply(v, more_targets, SOURCE, LENGTHS), variables)
  # One source sentence without its batch axis is named, not an IndexError further on.
  with pytest.raises(ValueError, match=r'reads a source of token ids \[batch, length\], got '
                                       r'int32 of shape \(9,\)\.'):
    jax.eval_shape(lambda v: model.apply(v, TARGETS[:1], SOURCE[0], LENGTHS[:1]), variables)
