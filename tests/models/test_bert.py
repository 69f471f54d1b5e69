"""BERT: shapes, the padding mask, segment embeddings, the tied MLM head, and training."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from data import tokenizers
from models import registry
from models.transformer.bert import BERT, SPECIAL_TOKENS, special_token_id
from tests.messages import one_sentence
from tests.models import dropout_probe
from train import step, tasks
from train.state import init_train_state

V = 11  # tokenizer ids; [PAD] = 11, [CLS] = 12, [SEP] = 13, [MASK] = 14
PAD, CLS, SEP, MASK = (special_token_id(V, t) for t in SPECIAL_TOKENS)


def _bert(**options):
  defaults = dict(vocab_size=V, num_layers=1, features=16, num_heads=2, max_length=16,
                  dropout_rate=0.0)
  return BERT(**{**defaults, **options})


def _init(model, tokens, *args):
  """(variables, apply) of `model` initialised on `tokens`."""
  # Tiny models: dispatching op by op costs less than compiling each function.
  return model.init(jax.random.PRNGKey(0), tokens, *args), model.apply


def test_special_ids_follow_the_tokenizer_ids():
  assert (PAD, CLS, SEP, MASK) == (V, V + 1, V + 2, V + 3)
  # By name, as the module doc fixes them (PAD … MASK above follow SPECIAL_TOKENS' own order).
  assert [special_token_id(V, t) for t in ('[PAD]', '[CLS]', '[SEP]', '[MASK]')] == [
      V, V + 1, V + 2, V + 3]


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_logits_cover_tokens_and_specials_in_float32(dtype):
  model = _bert(dtype=dtype)
  tokens = jnp.array([[CLS, 1, 2, 3, SEP, PAD, PAD], [CLS, 4, MASK, 6, 7, 8, SEP]])
  variables, apply = _init(model, tokens)
  logits = apply(variables, tokens)
  assert logits.shape == (2, 7, V + 4) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(logits)))
  # Parameters stay float32 whatever the compute dtype.
  assert {x.dtype for x in jax.tree.leaves(nn.unbox(variables))} == {jnp.dtype(jnp.float32)}


def test_bfloat16_compute_in_every_block_is_close_to_float32():
  """With dtype=bfloat16 the logits differ from float32's by a small non-zero amount, and the
  embedding, every block's projections and the head's transform compute in bfloat16 while the
  LayerNorms stay float32."""
  tokens = jnp.array([[CLS, 1, 2, 3, SEP, PAD, PAD], [CLS, 4, MASK, 6, 7, 8, SEP]])
  variables, apply = _init(_bert(num_layers=2), tokens)
  logits, state = _bert(num_layers=2, dtype=jnp.bfloat16).apply(
      variables, tokens, capture_intermediates=True, mutable=['intermediates'])
  assert logits.dtype == jnp.float32
  reference = apply(variables, tokens)
  # bfloat16 keeps 8 significant bits (relative step 2^-8 ≈ 0.4%); the largest difference
  # measured is 1.1% of the largest logit (0.21). Zero would mean the compute dtype was ignored.
  scale = np.max(np.abs(reference))
  assert scale > 0.05
  difference = np.max(np.abs(logits - reference))
  assert 0 < difference < 0.05 * scale, (difference, scale)
  outputs = {'/'.join(jax.tree_util.keystr((key,), simple=True) for key in path[:-2]): a.dtype
             for path, a in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]
             if path[-2].key == '__call__'}
  layers = (('self_attention', ('query', 'key', 'value', 'out')), ('mlp', ('hidden', 'output')))
  for name in ['token_embed', 'head_transform'] + [
      f'block{i}/{layer}/{n}' for i in range(2) for layer, names in layers for n in names]:
    assert outputs[name] == jnp.bfloat16, (name, outputs[name])
  for name in ['embed_norm', 'head_norm'] + [f'block{i}/{n}_norm' for i in range(2)
                                             for n in ('self_attention', 'mlp')]:
    assert outputs[name] == jnp.float32, (name, outputs[name])


@pytest.mark.parametrize('positions', ['learned', 'alibi', 'rotary'])
def test_padded_positions_do_not_change_the_other_logits(positions):
  """[CLS a b SEP PAD PAD] gives the same logits at its first four positions as the same
  sequence without padding, whatever segment ids the padded positions hold; a real token
  there does change them."""
  model = _bert(positions=positions, num_segments=2)
  padded = jnp.array([[CLS, 3, 5, SEP, PAD, PAD]] * 3)
  variables, apply = _init(model, padded)
  unpadded = apply(variables, padded[:, :4])
  segments = jnp.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 0]])
  logits = apply(variables, padded, segments)
  np.testing.assert_allclose(logits[:, :4], unpadded, atol=1e-6, rtol=0)
  # Control: the same positions holding a real token reach the others.
  real = apply(variables, padded.at[:, 4].set(7), segments)
  assert np.max(np.abs(real[:, :4] - unpadded)) > 1e-3


def test_with_pad_the_only_special_token_padding_is_still_masked():
  """num_special_tokens=1: id V is [PAD] and still masked out of attention. block0's key mask
  is read by interception in one small compiled function, and no block runs."""
  model = _bert(num_special_tokens=1, positions='none')
  padded = jnp.array([[1, PAD, 3, PAD, PAD]])
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), padded)))
  assert shapes['params']['output_bias'].shape == (V + 1,)

  class Found(Exception):
    """Carries block0's mask out of the model, before any block runs."""

  def read_the_mask(next_fun, args, kwargs, context):
    if context.module.name == 'block0':
      raise Found(kwargs['mask'])
    return next_fun(*args, **kwargs)

  @jax.jit
  def block0_mask(tokens):
    try:
      with nn.intercept_methods(read_the_mask):
        model.apply(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), tokens)
    except Found as found:
      return found.args[0]

  np.testing.assert_array_equal(np.broadcast_to(block0_mask(padded), (1, 1, 5, 5))[0, 0, 0],
                                [True, False, True, False, False])


def test_attention_is_bidirectional():
  """The first position's logits depend on the last token (a causal model's would not)."""
  tokens = jnp.array([[CLS, 1, 2, 3, 4, SEP], [CLS, 1, 2, 3, 9, SEP]])
  variables, apply = _init(_bert(), tokens)
  logits = apply(variables, tokens)
  assert np.max(np.abs(logits[0, 0] - logits[1, 0])) > 1e-3


def test_segment_embeddings_only_when_num_segments_is_positive():
  tokens = jnp.array([[CLS, 1, 2, SEP, 3, 4, SEP]] * 2)
  variables, apply = _init(_bert(), tokens)
  assert 'segment_embed' not in variables['params']
  message = one_sentence(lambda: apply(variables, tokens, jnp.zeros_like(tokens)))
  assert 'num_segments=0' in message

  variables, apply = _init(_bert(num_segments=2), tokens)
  table = variables['params']['segment_embed'].value
  assert table.shape == (2, 16)
  # Drawn N(0, 0.02²) as the token table (BERT's initializer_range); the standard deviation
  # of 32 draws is within 50% of 0.02 with near certainty (its standard error is 12.5%).
  np.testing.assert_allclose(np.std(table), 0.02, rtol=0.5)
  sentences_ab = jnp.array([[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]])
  logits_none = apply(variables, tokens)
  logits = apply(variables, tokens, sentences_ab)
  # No segment ids means segment 0 everywhere; sentence B changes the outputs.
  np.testing.assert_allclose(logits[0], logits_none[0], atol=1e-6, rtol=0)
  assert np.max(np.abs(logits[1] - logits_none[1])) > 1e-3
  message = one_sentence(lambda: apply(variables, tokens, sentences_ab[:, :3]))
  assert '(2, 3)' in message and '(2, 7)' in message


def test_training_drops_out_the_normalised_embedding_sum():
  # h⁰ = dropout(LayerNorm(E[x] + P + S)) (BERT's embedding layer: LayerNorm, then dropout):
  # in training with rate 0.5 each entry of block0's input is 0 or twice the LayerNorm's
  # output, which is block0's input at evaluation. Dropout before the LayerNorm would give
  # rows normalised after dropping, with no entry 0.
  model = _bert(num_segments=2, dropout_rate=0.5)
  tokens = jnp.array([[CLS, 1, 2, SEP, 3, 4, SEP], [CLS, 5, MASK, SEP, 6, SEP, PAD]])
  segments = jnp.array([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
  variables, apply = _init(model, tokens, segments)

  def block_input(train):
    (h0,) = dropout_probe.first_block_inputs(lambda: apply(
        variables, tokens, segments, train=train, rngs={'dropout': jax.random.PRNGKey(1)})).values()
    return h0

  dropout_probe.assert_inverted_dropout(block_input(True), block_input(False), 0.5, rtol=1e-5,
                                        atol=1e-6)


def test_training_drops_out_the_sub_layer_outputs_of_every_block():
  # Residual dropout (§3.1 of BERT, after Vaswani et al. 2017, §5.4): the model's rate reaches
  # its post-LN blocks, whose first LayerNorm reads x + drop(a), each entry of drop(a) 0 or 2a.
  model = _bert(dropout_rate=0.5)
  tokens = jnp.array([[CLS, 1, 2, SEP, 3, 4, SEP], [CLS, 5, MASK, SEP, 6, SEP, PAD]])
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))
  rng = np.random.default_rng(2)
  variables = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(np.float32), variables)
  sums = jax.jit(lambda variables: dropout_probe.first_residual_sums(lambda: model.apply(
      variables, tokens, train=True, rngs={'dropout': jax.random.PRNGKey(1)}),
      pre_norm=False))(variables)
  (x_BxTxD, a_BxTxD, s_BxTxD), = sums.values()
  dropout_probe.assert_inverted_dropout(np.asarray(s_BxTxD) - np.asarray(x_BxTxD), a_BxTxD, 0.5,
                                        rtol=1e-5, atol=1e-5)


def test_head_is_tied_to_the_token_embedding():
  """logits = LayerNorm(GELU(W h + b)) Eᵀ + c with E the input embedding: no other output
  matrix, the formula holds on the captured head output, and changing E[v] of a token v
  absent from the input moves only logit column v."""
  model = _bert()
  tokens = jnp.array([[CLS, 1, 2, MASK, 4, SEP]])
  variables = nn.unbox(model.init(jax.random.PRNGKey(0), tokens))
  params = variables['params']
  matrices = [jax.tree_util.keystr(path)
              for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
              if x.ndim == 2 and V + 4 in x.shape]
  assert matrices == ["['token_embed']['embed']['embedding']"]
  embedding = params['token_embed']['embed']['embedding']
  logits, state = model.apply(variables, tokens, capture_intermediates=True)
  z = state['intermediates']['head_norm']['__call__'][0]
  np.testing.assert_allclose(logits, z @ embedding.T + params['output_bias'], atol=1e-5, rtol=1e-5)

  v = 7  # not in the input
  moved = jax.tree.map(lambda x: x, params)
  moved['token_embed']['embed']['embedding'] = embedding.at[v].add(
      jax.random.normal(jax.random.PRNGKey(1), (16,)))
  new_logits = model.apply({'params': moved}, tokens)
  changed = np.max(np.abs(np.asarray(new_logits - logits)), axis=(0, 1))
  assert changed[v] > 1e-2 and np.all(np.delete(changed, v) <= 1e-6), changed


def test_linformer_projects_max_length_positions():
  # BERT is bidirectional, so Linformer attention (refused for the causal GPT) is allowed, its
  # projections made for max_length positions, not for the length of the batch it saw first.
  shapes = jax.eval_shape(_bert(attention='linformer').init, jax.random.PRNGKey(0),
                          jnp.zeros((1, 8), jnp.int32))
  projections = shapes['params']['block0']['self_attention']['attend']['projections']
  assert nn.unbox(projections['proj_e']).shape[-1] == 16  # max_length


def test_bad_options_stop_inone_sentence():
  assert 'num_segments must be an integer >= 0, got -1' in one_sentence(
      lambda: _bert(num_segments=-1))
  # True is an int to Python, but no count of segments (it would silently mean 1).
  assert 'num_special_tokens must be an integer >= 0, got True' in one_sentence(
      lambda: _bert(num_special_tokens=True))
  assert 'num_special_tokens=5' in one_sentence(lambda: _bert(num_special_tokens=5))
  assert 'divisible by num_heads=3' in one_sentence(lambda: _bert(num_heads=3))
  assert "positions='relative'" in one_sentence(lambda: _bert(positions='relative'))
  model = _bert(max_length=4)
  message = one_sentence(lambda: jax.eval_shape(model.init, jax.random.PRNGKey(0),
                                                 jnp.zeros((1, 6), jnp.int32)))
  assert '6 positions exceed max_length=4' in message


def test_defaults_are_the_papers():
  # Devlin et al. 2019 (§3, App. A.2): post-LN blocks, learned positions up to 512, dropout 0.1,
  # MLP width 4·D; the four special tokens, and no segment embedding unless asked for.
  model = BERT(vocab_size=V)
  assert (model.pre_norm, model.positions, model.max_length, model.dropout_rate) == (
      False, 'learned', 512, 0.1)
  assert (model.num_special_tokens, model.num_segments) == (4, 0)
  assert model.attention == 'exact' and model.use_bias
  params = jax.eval_shape(lambda: nn.unbox(_bert().init(
      jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))))['params']
  assert params['block0']['mlp']['hidden']['kernel'].shape == (16, 64)


def test_registry_fills_the_vocabulary_from_the_data():
  model = registry.build('bert', data_defaults={'vocab_size': 300}, num_layers=1, features=16,
                         num_heads=2)
  assert isinstance(model, BERT) and model.vocab_size == 300 and model.num_embeddings == 304


def test_bert_trains_with_the_masked_language_model_task_through_the_step():
  """Forty Adam steps on windows that each repeat one token lower the masked-token loss
  (averaged over steps, each with fresh masks) from about ln(V + 4) ≈ 2.7 to below a quarter
  of it, far below the unigram loss ln V ≈ 2.4: the model reads the unmasked positions.
  Measured: 2.59 over the first three steps, 0.25 over the last five."""
  tokenizer = tokenizers.CharTokenizer([chr(ord('a') + i) for i in range(V)])
  rows = np.arange(16) % V
  task = tasks.build('masked_language_model',
                     {'tokenizer': tokenizer, 'token_counts': np.ones(V, np.int64)}, mask_rate=0.3)
  batch = task.preprocess({'tokens': np.repeat(rows[:, None], 9, 1).astype(np.int32),
                           'weights': np.ones((16, 8), np.float32)})
  model = _bert(features=32, max_length=10, use_bias=False)
  tx = optax.adam(1e-2)
  state = jax.jit(lambda rng: init_train_state(model, task, tx, rng, batch))(jax.random.PRNGKey(0))
  train_step = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                         learning_rate_fn=optax.constant_schedule(1e-2)))
  losses = []
  for _ in range(40):
    state, metrics = train_step(state, batch)
    assert not int(metrics['skipped'])
    losses.append(float(metrics['totals']['loss'][0] / metrics['totals']['loss'][1]))
  before, after = np.mean(losses[:3]), np.mean(losses[-5:])
  assert abs(before - np.log(V + 4)) < 0.2, before
  assert after < before / 4, (before, after)


def test_tokens_that_are_not_integers_are_one_sentence():
  model = _bert()
  with pytest.raises(ValueError, match='A Transformer reads token ids as integers of shape '
                                       r'\[batch, length\], got float32 of shape \(2, 6\)\.'):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((2, 6), jnp.float32)))
