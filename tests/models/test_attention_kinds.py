"""Attention kinds chosen by config inside MultiHeadAttention and the Transformers
(models/attention/kinds.py): each kind reaches its own function, the exact ones equal exact
attention through the whole layer, Performer's features follow the 'features' stream, and every
combination that cannot work stops with one sentence before compilation."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.attention import core
from models.attention import kinds
from models.attention import linear
from models.attention import positions as positions_lib
from models.attention import sparse
from train import sampling
from train.tasks import base

D, N, T = 8, 2, 12


def draw(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def layer_and_params(**kwargs):
  x = draw((2, T, D), 0)
  layer = core.MultiHeadAttention(N, **kwargs)
  params = layer.init({'params': jax.random.PRNGKey(1), 'features': jax.random.PRNGKey(2)}, x,
                      causal=kwargs.get('attention') != 'linformer')['params']
  params = nn.unbox(params)
  return layer, params, x


def projections(params, x_BxTxD):
  """q, k, v [B, T, N, H] from the layer's own kernels and biases, in NumPy."""
  return [np.einsum('btd,dnh->btnh', x_BxTxD, params[name]['kernel']) + params[name]['bias']
          for name in ('query', 'key', 'value')]


def merge(params, o_BxTxNxH):
  return np.einsum('btnh,nhd->btd', o_BxTxNxH, params['out']['kernel']) + params['out']['bias']


VALID_BxT = np.arange(T)[None, :] < np.array([[T], [7]])


@pytest.mark.parametrize('kind, options, causal', [
    ('chunked', {'query_block': 5, 'key_block': 4}, True),
    ('chunked', {'query_block': 5, 'key_block': 4}, False),
    ('local', {'block': T}, False),  # one block: every key is in the pattern
])
def test_exact_kinds_equal_exact_attention_through_the_layer(kind, options, causal):
  exact, params, x = layer_and_params()
  other = core.MultiHeadAttention(N, attention=kind, attention_options=tuple(options.items()))
  mask = core.key_mask(jnp.asarray(VALID_BxT))
  want = exact.apply({'params': params}, x, causal=causal, mask=mask)
  got = other.apply({'params': params}, x, causal=causal, mask=mask)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind, options, function', [
    ('linear', {'block': 4}, lambda q, k, v, valid: linear.linear_attention(
        q, k, v, causal=True, key_valid_BxS=valid, block=4)),
    ('strided', {'block': 4}, lambda q, k, v, valid: sparse.sparse_attention(
        q, k, v, pattern='strided', block=4, causal=True, key_valid_BxS=valid)),
    ('fixed', {'block': 4, 'summary': 2}, lambda q, k, v, valid: sparse.sparse_attention(
        q, k, v, pattern='fixed', block=4, summary=2, causal=True, key_valid_BxS=valid)),
])
def test_each_kind_is_its_function_between_the_projections(kind, options, function):
  """The layer = W^O · kind(x W^Q, x W^K, x W^V) with the kind's own options and the key mask."""
  layer, params, x = layer_and_params(attention=kind, attention_options=tuple(options.items()))
  got = layer.apply({'params': params}, x, causal=True, mask=core.key_mask(jnp.asarray(VALID_BxT)))
  q, k, v = projections(params, x)
  want = merge(params, np.asarray(function(q, k, v, jnp.asarray(VALID_BxT))))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('kind', kinds.KINDS)
def test_no_queries_give_an_empty_output_and_no_keys_give_zeros(kind):
  # Every kind but exact divided by zero or reduced over no keys.
  options = (('projected_length', 4),) if kind == 'linformer' else ()
  causal = kind != 'linformer'
  layer, params, x = layer_and_params(attention=kind, attention_options=options)
  out = layer.apply({'params': params}, x[:, :0], causal=causal)
  assert out.shape == (2, 0, D)
  q = jnp.asarray(draw((2, 3, N, D // N), 4))
  none_BxSxNxH = jnp.zeros((2, 0, N, D // N))
  attend = kinds.Attend(kind, options)
  if kind in sparse.PATTERNS:  # Self-attention only: 3 queries and no keys stay refused.
    with pytest.raises(ValueError, match='sparse_attention is self-attention'):
      attend.init(jax.random.PRNGKey(0), q, none_BxSxNxH, none_BxSxNxH)
    return
  # No key to attend: the row is fully masked, which every kind returns as zeros.
  out, _ = attend.init_with_output(jax.random.PRNGKey(0), q, none_BxSxNxH, none_BxSxNxH,
                                   causal=False)
  np.testing.assert_array_equal(out, np.zeros((2, 3, N, D // N)))


@pytest.mark.parametrize('kind', ['linear', 'local', 'strided'])
def test_rotary_positions_reach_each_kind_as_it_takes_them(kind):
  # Linear attention rotates its own features, in the numerator only (RoFormer eq. 19); the
  # other kinds take q and k rotated, as exact attention does.
  options = (('block', 4),)
  layer, params, x = layer_and_params(attention=kind, attention_options=options,
                                      positions='rotary', rotary_base=100.0)
  got = layer.apply({'params': params}, x, causal=True)
  q, k, v = (jnp.asarray(a) for a in projections(params, x))
  positions = jnp.arange(T)
  if kind == 'linear':
    out = linear.linear_attention(q, k, v, causal=True, block=4,
                                  rotary=(positions, positions, 100.0))
  else:
    q, k = (positions_lib.rotate(a, positions, 100.0) for a in (q, k))
    out = sparse.sparse_attention(q, k, v, pattern=kind, block=4, causal=True)
  np.testing.assert_allclose(got, merge(params, np.asarray(out)), rtol=1e-4, atol=1e-5)
  # Rotary positions reach a kind that takes q and k rotated only that way.
  with pytest.raises(ValueError, match="attention='local' takes q and k already rotated"):
    kinds.Attend('local', options).init(jax.random.PRNGKey(0), q, k, v, causal=True,
                                        rotary=(positions, positions, 100.0))


@pytest.mark.parametrize('kind, function, options', [
    ('linear', 'linear_attention', {'block': 3}),
    ('performer', 'performer_attention', {'block': 3, 'num_features': 8}),
    ('chunked', 'chunked_attention', {'query_block': 3, 'key_block': 6}),
    ('local', 'sparse_attention', {'block': 3, 'query_blocks': 2}),
])
def test_options_that_leave_the_result_unchanged_still_reach_the_kind(
    monkeypatch, kind, function, options):
  # Block sizes change how a kind computes, not what, so the equalities above would pass
  # with the options dropped; the call itself must receive them.
  library = {'linear': kinds.linear_lib, 'performer': kinds.performer_lib,
             'chunked': kinds.chunked_lib, 'local': kinds.sparse_lib}[kind]
  calls = []
  original = getattr(library, function)
  monkeypatch.setattr(library, function, lambda *a, **kw: calls.append(kw) or original(*a, **kw))
  layer, params, x = layer_and_params(attention=kind, attention_options=tuple(options.items()))
  calls.clear()  # The ones from init.
  layer.apply({'params': params}, x, causal=True)
  (received,) = calls
  for name, value in options.items():
    if name != 'num_features':  # Performer's feature count sets the features drawn instead.
      assert received[name] == value, (name, received)


# Each kind's defaults as README's table of attention kinds gives them: (library, function,
# the keyword arguments it receives).
DOCUMENTED_DEFAULTS = {
    'chunked': ('chunked_lib', 'chunked_attention', {'query_block': 512, 'key_block': 512}),
    'linear': ('linear_lib', 'linear_attention', {'block': 64}),
    'performer': ('performer_lib', 'performer_attention', {'block': 64}),
    'linformer': ('linformer_lib', 'linformer_attention', {}),
    'local': ('sparse_lib', 'sparse_attention', {'block': 128, 'query_blocks': 4}),
    'strided': ('sparse_lib', 'sparse_attention', {'block': 128, 'query_blocks': 4}),
    'fixed': ('sparse_lib', 'sparse_attention', {'block': 128, 'summary': 8, 'query_blocks': 4}),
}


@pytest.mark.parametrize('kind', sorted(DOCUMENTED_DEFAULTS))
def test_a_kind_without_options_runs_with_its_documented_defaults(monkeypatch, kind):
  # Most defaults change how a kind computes, not what, so no comparison of values notices a
  # key block of 256 or 128 Performer features where the README promises 512 and 256.
  library_name, function, defaults = DOCUMENTED_DEFAULTS[kind]
  library = getattr(kinds, library_name)
  calls = []
  original = getattr(library, function)
  monkeypatch.setattr(library, function,
                      lambda *a, **kw: calls.append((a, kw)) or original(*a, **kw))
  q, k, v = (jnp.asarray(draw((1, 6, 1, 4), seed)) for seed in (5, 6, 7))
  kinds.Attend(kind).init_with_output(jax.random.PRNGKey(0), q, k, v,
                                      causal=kind != 'linformer')
  ((args, received),) = calls
  for name, value in defaults.items():
    assert received[name] == value, (name, received)
  if kind == 'performer':  # num_features 256, orthogonal True
    features_MxH = np.asarray(args[3])
    assert features_MxH.shape == (256, 4)
    gram = features_MxH[:4] @ features_MxH[:4].T
    assert np.abs(gram - np.diag(np.diag(gram))).max() < 1e-4
  if kind == 'linformer':  # projected_length 256, share_kv False
    proj_e_KxL, proj_f_KxL = map(np.asarray, args[3:5])
    assert proj_e_KxL.shape == proj_f_KxL.shape == (256, 6)
    assert not np.array_equal(proj_e_KxL, proj_f_KxL)


@pytest.mark.parametrize('orthogonal', [True, False])
def test_performer_attends_with_the_features_its_options_ask_for(monkeypatch, orthogonal):
  # num_features and orthogonal set the features drawn, not an argument of
  # performer_attention, so the test above cannot see them; a layer that drew its default 256
  # orthogonal features whatever the config said passed every other test.
  used = []
  original = kinds.performer_lib.performer_attention
  monkeypatch.setattr(kinds.performer_lib, 'performer_attention',
                      lambda q, k, v, features_MxH, **kw: used.append(np.asarray(features_MxH))
                      or original(q, k, v, features_MxH, **kw))
  layer, params, x = layer_and_params(
      attention='performer', attention_options=(('num_features', 6), ('orthogonal', orthogonal)))
  used.clear()  # The one from init.
  for train in (False, True):
    layer.apply({'params': params}, x, causal=True, train=train,
                rngs={'features': jax.random.PRNGKey(3)})
  assert len(used) == 2
  head_dim = D // N
  for features_MxH in used:
    assert features_MxH.shape == (6, head_dim)
    # Rows are orthogonal within each block of H = 4 (here rows 0–3 and 4–5); Gaussian rows
    # drawn independently are not (their dot products are of order H).
    for block_BxH in (features_MxH[:head_dim], features_MxH[head_dim:]):
      gram = block_BxH @ block_BxH.T
      off_diagonal = np.abs(gram - np.diag(np.diag(gram))).max()
      assert (off_diagonal < 1e-4) == orthogonal, gram


def test_performer_draws_features_from_its_stream_in_training_and_a_fixed_draw_otherwise():
  layer, params, x = layer_and_params(attention='performer',
                                      attention_options=(('num_features', 8), ('block', 4)))
  apply = lambda train, seed: np.asarray(layer.apply(
      {'params': params}, x, causal=True, train=train, rngs={'features': jax.random.PRNGKey(seed)}))
  assert not np.allclose(apply(True, 0), apply(True, 1))  # a new draw per step key
  np.testing.assert_array_equal(apply(True, 0), apply(True, 0))
  np.testing.assert_array_equal(apply(False, 0), apply(False, 1))  # evaluation: no stream read
  gpt = registry.build('gpt', vocab_size=5, num_layers=1, features=D, num_heads=N,
                       attention='performer')
  keys = base.stream_keys(jax.random.PRNGKey(0), base.Task(), gpt)
  assert set(keys) == {'dropout', 'features'}
  assert set(base.stream_keys(jax.random.PRNGKey(0), base.Task(),
                              registry.build('gpt', vocab_size=5))) == {'dropout'}


def test_performer_evaluation_draws_differ_between_layers(monkeypatch):
  # At evaluation each layer takes a fixed draw of its own (keyed by its path), so the two
  # layers of a GPT do not share one set of random features.
  used = []
  original = kinds.performer_lib.performer_attention
  monkeypatch.setattr(kinds.performer_lib, 'performer_attention',
                      lambda q, k, v, features_MxH, **kw: used.append(features_MxH)
                      or original(q, k, v, features_MxH, **kw))
  gpt = registry.build('gpt', vocab_size=5, num_layers=2, features=D, num_heads=N,
                       attention='performer', attention_options={'num_features': 4})
  tokens = jnp.zeros((1, 3), jnp.int32)

  @jax.jit
  def features_of_each_layer(rngs):
    variables = gpt.init(rngs, tokens)
    used.clear()  # The draws of init.
    gpt.apply(variables, tokens)
    return list(used)

  draws = features_of_each_layer({'params': jax.random.PRNGKey(0),
                                  'features': jax.random.PRNGKey(1)})
  assert len(draws) == 2  # one per layer
  first_layer_MxH, second_layer_MxH = map(np.asarray, draws)
  assert first_layer_MxH.shape == (4, D // N)
  assert not np.allclose(first_layer_MxH, second_layer_MxH, atol=1e-3)


@pytest.mark.parametrize('share_kv', [False, True])
def test_linformer_layer_owns_its_projections_sized_by_max_length(share_kv):
  layer = core.MultiHeadAttention(N, attention='linformer', max_length=16,
                                  attention_options=(('projected_length', 4),
                                                     ('share_kv', share_kv)))
  x = draw((2, T, D), 3)
  params = nn.unbox(layer.init(jax.random.PRNGKey(0), x)['params'])
  own = params['attend']['projections']
  # With share_kv one matrix E projects both the keys and the values (F = E).
  assert jax.tree.map(np.shape, own) == (
      {'proj_e': (4, 16)} if share_kv else {'proj_e': (4, 16), 'proj_f': (4, 16)})
  e = own['proj_e']
  f = e if share_kv else own['proj_f']
  q, k, v = projections(params, x)
  want = merge(params, np.asarray(kinds.linformer_lib.linformer_attention(q, k, v, e, f)))
  np.testing.assert_allclose(layer.apply({'params': params}, x), want, rtol=1e-4, atol=1e-5)
  exact = registry.build('gpt', vocab_size=5, num_layers=1, features=D, num_heads=N)
  assert 'attend' not in nn.unbox(exact.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
                                  ['params'])['block0']['self_attention']


def test_config_mappings_become_hashable_options():
  import ml_collections
  model = registry.build('bert', vocab_size=9, num_layers=1, features=D, num_heads=N,
                         attention='performer',
                         attention_options=ml_collections.ConfigDict({'num_features': 4}))
  assert model.attention_options == (('num_features', 4),)
  hash(model)


def test_models_without_a_cached_kind_generate_without_the_cache():
  gpt = registry.build('gpt', vocab_size=5, num_layers=1, features=D, num_heads=N,
                       max_length=8, attention='linear', attention_options={'block': 4})
  assert not sampling.supports_cache(gpt)
  assert sampling.supports_cache(registry.build('gpt', vocab_size=5, attention='chunked'))
  variables = gpt.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  tokens = np.asarray(sampling.generate(gpt, variables, np.array([[1, 3]], np.int32),
                                        jax.random.PRNGKey(1), num_new_tokens=4, temperature=0.0))
  # Greedy decoding by brute force: each new token is the argmax after its whole prefix.
  for t in range(2, 6):
    logits = gpt.apply(variables, jnp.asarray(tokens[:, :t]))
    assert tokens[0, t] == int(np.argmax(logits[0, -1]))


@pytest.mark.parametrize('build, message', [
    (lambda: registry.build('gpt', vocab_size=5, attention='flash'),
     "GPT attention='flash'; allowed: exact, chunked, linear, performer, linformer, local"),
    (lambda: registry.build('bert', vocab_size=5, attention='performer',
                            attention_options={'features': 8}),
     "BERT attention_options has 'features', which attention='performer' does not take; "
     'allowed: num_features, orthogonal, block.'),
    (lambda: registry.build('vit', num_classes=3, attention='local',
                            attention_options={'block': 0}),
     'ViT attention_options.block must be a positive integer, got 0.'),
    # True is an int in Python: a check of isinstance(value, int) alone takes it as a block of 1.
    (lambda: registry.build('gpt', vocab_size=5, attention='local',
                            attention_options={'block': True}),
     'GPT attention_options.block must be a positive integer, got True.'),
    # A value that is not a mapping (e.g. --config.model.attention_options=64) used to stop
    # with dict()'s own message, which names neither the option nor the value.
    (lambda: registry.build('gpt', vocab_size=5, attention='chunked', attention_options='64'),
     "GPT attention_options='64' is not a mapping of option names to values; "
     "attention='chunked' takes: query_block, key_block."),
    (lambda: registry.build('bert', vocab_size=5, attention='linear', attention_options=64),
     "BERT attention_options=64 is not a mapping of option names to values; "
     "attention='linear' takes: block."),
    (lambda: registry.build('gpt', vocab_size=5, attention='linformer'),
     'GPT is causal and Linformer attention cannot be'),
    (lambda: registry.build('gpt', vocab_size=5, attention='performer', positions='alibi'),
     "GPT positions='alibi' adds a bias to the attention scores, which only attention='exact' "
     "takes; use rotary positions with 'performer'."),
    (lambda: registry.build('gpt', vocab_size=5, attention='linear', positions='alibi'),
     "GPT positions='alibi' adds a bias to the attention scores, which only attention='exact' "
     "takes; use rotary positions with 'linear'."),
    # Chunked attention is exact attention but takes no bias: the check must refuse it, not
    # leave the refusal to the first call.
    (lambda: registry.build('gpt', vocab_size=5, attention='chunked', positions='alibi'),
     "GPT positions='alibi' adds a bias to the attention scores, which only attention='exact' "
     "takes; use rotary positions with 'chunked'."),
    # Linformer mixes the rotated keys over positions, so its scores depend on more than
    # offsets: it was accepted.
    (lambda: registry.build('bert', vocab_size=5, attention='linformer', positions='rotary'),
     "BERT positions='rotary' makes scores depend on the offset between positions only through "
     "the dot product qᵀk, which attention='linformer' does not score by; use sinusoidal or "
     'learned positions with it.'),
    (lambda: registry.build('vit', num_classes=3, attention='linformer', positions='alibi'),
     "ViT positions='alibi' adds a bias to the attention scores, which only attention='exact' "
     "takes; use sinusoidal or learned positions with 'linformer'."),
])
def test_impossible_combinations_stop_with_one_sentence(build, message):
  with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
    build()


def test_decoding_and_general_masks_are_refused_by_kinds_that_cannot_take_them():
  layer, params, x = layer_and_params(attention='linear', attention_options=(('block', 4),))
  with pytest.raises(ValueError, match="attention='linear' has no key/value cache"):
    layer.init(jax.random.PRNGKey(0), x, causal=True, decode=True)
  query_mask = jnp.ones((2, 1, T, T), bool)
  with pytest.raises(ValueError, match=r"takes a mask of valid keys \[B, 1, 1, S\] only"):
    layer.apply({'params': params}, x, causal=True, mask=query_mask)


@pytest.mark.parametrize('mask', [VALID_BxT[1:, None, None, :],
                                  np.array([True, False]).reshape(2, 1, 1, 1)],
                         ids=['one_mask_for_every_row', 'all_keys_or_none_per_row'])
def test_a_key_mask_that_broadcasts_equals_its_full_form(mask):
  # [1, 1, 1, S] (one mask for every row) and [B, 1, 1, 1] (all keys or none, per row)
  # broadcast to [B, 1, 1, S]; refusing them, or reading them otherwise, fails here.
  q, k, v = (jnp.asarray(draw((2, T, N, D // N), seed)) for seed in (5, 6, 7))
  attend = kinds.Attend('linear', (('block', 4),))
  got = attend.apply({}, q, k, v, causal=True, mask=jnp.asarray(mask))
  full = jnp.asarray(np.broadcast_to(mask, (2, 1, 1, T)))
  np.testing.assert_array_equal(got, attend.apply({}, q, k, v, causal=True, mask=full))


@pytest.mark.parametrize('mask', [np.ones((2, 1, 1, T - 1), bool), np.ones((3, 1, 1, T), bool),
                                  np.ones((2, 1, 1, T), np.float32)])
def test_a_key_mask_of_the_wrong_length_batch_or_dtype_is_one_sentence(mask):
  layer, params, x = layer_and_params(attention='linear', attention_options=(('block', 4),))
  message = (r"attention='linear' takes a mask of valid keys \[B, 1, 1, S\] only, bool and "
             rf"broadcasting to \(2, 1, 1, {T}\); got {mask.dtype} of shape "
             + re.escape(str(mask.shape)) + r'\.')
  with pytest.raises(ValueError, match=message):
    layer.apply({'params': params}, x, causal=True, mask=mask)


def test_check_of_option_values_and_positions_for_every_kind():
  kinds.check('GPT', 'fixed', {'block': 1, 'summary': 1, 'query_blocks': 1})  # the smallest
  with pytest.raises(ValueError, match='GPT attention_options.block must be a positive integer, '
                                       'got 4.0.'):
    kinds.check('GPT', 'local', {'block': 4.0})
  # An option of other kinds: chunked attention takes no 'block'.
  with pytest.raises(ValueError, match="has 'block', which attention='chunked' does not take"):
    kinds.check('GPT', 'chunked', {'block': 64})
  for kind, name in (('performer', 'orthogonal'), ('linformer', 'share_kv')):
    with pytest.raises(ValueError, match=f'GPT attention_options.{name} must be True or False, '
                                         'got 1.'):
      kinds.check('GPT', kind, {name: 1})
  for kind in kinds.KINDS:
    # Rotary positions keep scores relative for every kind that scores by qᵀk: all but
    # Linformer. ALiBi's bias reaches exact attention only.
    if kind != 'linformer':
      kinds.check('GPT', kind, causal=True, positions='rotary')
    if kind != 'exact':
      with pytest.raises(ValueError, match="GPT positions='alibi' adds a bias"):
        kinds.check('GPT', kind, positions='alibi')


def test_only_performer_reads_a_random_stream_and_only_exact_kinds_decode_from_the_cache():
  # The cache decodes by exact attention over the cached keys: right for exact and chunked
  # attention only, not for the sparse patterns or the approximations.
  for kind in kinds.KINDS:
    assert kinds.stream_names(kind) == (('features',) if kind == 'performer' else ()), kind
    assert (kind in kinds.CACHED) == (kind in ('exact', 'chunked')), kind


@pytest.mark.parametrize('kind, library, function', [
    ('chunked', 'chunked_lib', 'chunked_attention'), ('linear', 'linear_lib', 'linear_attention'),
    ('performer', 'performer_lib', 'performer_attention'),
    ('linformer', 'linformer_lib', 'linformer_attention')])
def test_each_kind_receives_the_key_mask_and_causality_it_is_given(monkeypatch, kind, library,
                                                                  function):
  # Cross-attention, 3 queries over 5 keys, not causal: each row's valid keys [B, S] from the
  # mask [B, 1, 1, S]. Only the call is checked (the kind, its features and projections are
  # replaced), which is cheap.
  calls = []
  monkeypatch.setattr(getattr(kinds, library), function,
                      lambda q, *a, **kw: calls.append(kw) or jnp.zeros_like(q))
  monkeypatch.setattr(kinds.performer_lib, 'draw_features', lambda *a: None)
  monkeypatch.setattr(kinds.linformer_lib, 'LinformerProjections', lambda *a, **kw: lambda: (0, 0))
  q = jnp.zeros((2, 3, 1, 4))
  k = jnp.zeros((2, 5, 1, 4))
  valid_BxS = np.array([[True, True, True, False, False], [True, False, True, True, True]])
  kinds.Attend(kind).init(jax.random.PRNGKey(0), q, k, k, causal=False,
                          mask=jnp.asarray(valid_BxS[:, None, None, :]))
  (received,) = calls
  assert received['causal'] is False
  np.testing.assert_array_equal(received['key_valid_BxS'], valid_BxS)


def test_no_keys_give_zeros_of_the_value_width_and_query_dtype():
  # Value heads may be wider than query heads: [B, T, N, H_v], in the inputs' bfloat16.
  q, k, v = (jax.ShapeDtypeStruct(shape, jnp.bfloat16)
             for shape in ((1, 2, 1, 4), (1, 0, 1, 4), (1, 0, 1, 6)))
  out = jax.eval_shape(lambda q, k, v: kinds.Attend('linear').init_with_output(
      jax.random.PRNGKey(0), q, k, v)[0], q, k, v)
  assert (out.shape, out.dtype) == ((1, 2, 1, 6), jnp.bfloat16)


def test_a_bias_on_a_kind_other_than_exact_is_refused():
  # Chunked attention is exact attention, but takes no bias: it must not drop ALiBi silently.
  q = jnp.zeros((1, 2, 1, 4))
  with pytest.raises(ValueError, match="attention='chunked' takes no additive bias"):
    kinds.Attend('chunked').init(jax.random.PRNGKey(0), q, q, q, bias=jnp.zeros((1, 2, 2)))
