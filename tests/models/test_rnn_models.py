"""The four recurrent architectures: padding, causality, decoding cache and greedy decoding, and
the attentive `Seq2Seq` against a float64 NumPy loop of its encoder, attention and decoder
equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.sequence import rnn
from models.sequence import rnn_models
from tests.models import dropout_probe
from tests.models.test_rnn import CELL_MODULE, carry_of_example, flax_params, hidden
from tests.models.test_rnn import reference_rnn, equation_step
from tests.models.test_seq_attention import additive_score, dot_score
from tests.models.test_seq_attention import reference as attention_loop
from tests.messages import one_sentence
from train import sampling

SOURCE = jax.random.randint(jax.random.PRNGKey(0), (3, 9), 3, 50)
LENGTHS = jnp.array([9, 5, 2])


def _pad_with_noise(tokens_BxS, lengths_B, value=47):
  """The same sequences with every position past the length overwritten."""
  past_BxS = jnp.arange(tokens_BxS.shape[1])[None] >= lengths_B[:, None]
  return jnp.where(past_BxS, value, tokens_BxS)


@pytest.mark.parametrize('attention', ['none', 'dot', 'additive'])
def test_seq2seq_ignores_source_padding_and_is_causal_in_the_target(attention):
  model = rnn_models.Seq2Seq(64, cell='lstm', features=16, num_layers=2, attention=attention,
                             embed_dim=8)
  targets = jax.random.randint(jax.random.PRNGKey(1), (3, 6), 3, 50)
  variables = model.init(jax.random.PRNGKey(2), targets, SOURCE, LENGTHS)
  logits = model.apply(variables, targets, SOURCE, LENGTHS)
  noisy = model.apply(variables, targets, _pad_with_noise(SOURCE, LENGTHS), LENGTHS)
  np.testing.assert_array_equal(logits, noisy)
  # Changing decoder input t changes no logit before t, and does change logit t.
  changed = model.apply(variables, targets.at[:, 4].set(5), SOURCE, LENGTHS)
  np.testing.assert_array_equal(logits[:, :4], changed[:, :4])
  assert np.abs(logits[:, 4] - changed[:, 4]).max() > 1e-4
  # The source matters.
  other = model.apply(variables, targets, SOURCE.at[:, 0].set(4), LENGTHS)
  assert np.abs(logits - other).max() > 1e-4


def test_attention_weights_are_a_distribution_over_the_valid_source():
  model = rnn_models.Seq2Seq(64, cell='gru', features=16, attention='additive', embed_dim=8,
                             bidirectional_encoder=True)
  targets = jnp.full((3, 4), 7, jnp.int32)
  variables = model.init(jax.random.PRNGKey(0), targets, SOURCE, LENGTHS)
  _, state = model.apply(variables, targets, SOURCE, LENGTHS, mutable=['intermediates'])
  (weights_BxNxS,) = state['intermediates']['attention']
  assert weights_BxNxS.shape == (3, 4, 9)
  valid_BxS = np.arange(9)[None] < np.asarray(LENGTHS)[:, None]
  np.testing.assert_allclose(weights_BxNxS.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.asarray(weights_BxNxS)[~np.broadcast_to(valid_BxS[:, None], (3, 4, 9))] == 0)


# --- Seq2Seq against its equations ---------------------------------------------------------------
# float32 model against the float64 loop below (2 layers, 9 source and 5 target steps, logits up
# to 1.9): the largest difference measured is 2.4e-7 (logits) and 2.3e-7 (attention weights). The
# attention query taken from the bottom decoder layer changes the logits by ≥ 1.2e-3, the context
# left out of the output layer by ≥ 0.4.
SEQ2SEQ_TOL = dict(rtol=0, atol=1e-6)


def cell_equations(kind, cell_params):
  """A Flax cell's parameters as the matrices of the cell equations (column vectors, W x), the
  inverse of `flax_params`; every parameter of the cell is read, as the round trip checks."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), cell_params)
  w = lambda name: p[name]['kernel'].T
  if kind == 'lstm':  # Flax's gate letters i, f, g, o are the equations' i, f, c, o.
    equations = {}
    for flax_gate, gate in zip('ifgo', 'ifco'):
      equations.update({f'W_{gate}': w(f'i{flax_gate}'), f'U_{gate}': w(f'h{flax_gate}'),
                        f'b_{gate}': p[f'h{flax_gate}']['bias']})
  else:  # rnn.GRUCell: 'input' = [W_r | W_z | W_h] and biases, 'gates' = [U_r | U_z], U_h.
    equations = dict(zip(('W_r', 'W_z', 'W_h'), np.split(w('input'), 3)),
                     **dict(zip(('b_r', 'b_z', 'b_h'), np.split(p['input']['bias'], 3))),
                     **dict(zip(('U_r', 'U_z'), np.split(w('gates'), 2))), U_h=w('candidate'))
  jax.tree.map(np.testing.assert_array_equal, flax_params(kind, equations), p)
  return equations


def seq2seq_reference(kind, score, params, targets_in_BxN, source_BxS, lengths_B):
  """Teacher-forced logits [B, N, V] and attention weights [B, N, S] of a `Seq2Seq` from its
  parameters, one example and one step at a time:

    encoder   h_1 … h_S = the reference RNN on the embedded source ([→h_i ; ←h_i] when
              bidirectional); decoder layer l starts from encoder layer l's final forward carry
    step t    c_t = attention(s_{t−1}, h)  with s_{t−1} the TOP decoder layer's previous state
              layer 1 reads [E y_{t−1} ; c_t], layer l > 1 the state of layer l − 1
              logits_t = W_o [s_t ; c_t] + b_o
  """
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  assert set(p) == {'source_input', 'encoder', 'target_embed', 'decoder', 'output'}
  directions = [d for d in ('forward', 'backward') if f'layer0_{d}' in p['encoder']]
  num_layers = len(p['encoder']) // len(directions)
  encoder_cells = [[cell_equations(kind, p['encoder'][f'layer{layer}_{d}'][CELL_MODULE[kind]])
                    for d in directions] for layer in range(num_layers)]
  x_BxSxE = p['source_input']['Embed_0']['embedding'][np.asarray(source_BxS)]
  h_BxSxH, encoder_carries = reference_rnn(kind, encoder_cells, x_BxSxE, lengths_B)
  mask_BxS = np.arange(h_BxSxH.shape[1])[None] < np.asarray(lengths_B)[:, None]
  decoder = p['decoder']
  # 'dot' attention has no parameters.
  assert set(decoder) - {'attention'} == {f'cell{layer}' for layer in range(num_layers)}
  decoder_cells = [cell_equations(kind, decoder[f'cell{layer}']) for layer in range(num_layers)]
  if score == 'dot':
    assert 'attention' not in decoder
    score_fn = dot_score
  else:
    a = decoder['attention']
    score_fn = additive_score({'W': a['query']['kernel'].T, 'b': a['query']['bias'],
                               'U': a['key']['kernel'].T, 'v': a['energy']['kernel'][:, 0]})
  embed_VxE, w_o, b_o = p['target_embed']['embedding'], p['output']['kernel'].T, p['output']['bias']
  batch, steps = targets_in_BxN.shape
  logits_BxNxV = np.zeros((batch, steps, len(b_o)))
  weights_BxNxS = np.zeros((batch, steps, h_BxSxH.shape[1]))
  for b in range(batch):
    carries = [carry_of_example(layer[0], b) for layer in encoder_carries]
    for t in range(steps):
      s_prev = hidden(kind, carries[-1])
      context_1xH, weights_1xS, _ = attention_loop(score_fn, s_prev[None], h_BxSxH[b][None],
                                                   mask_BxS[b][None])
      context, weights_BxNxS[b, t] = context_1xH[0], weights_1xS[0]
      x = np.concatenate([embed_VxE[targets_in_BxN[b, t]], context])  # [E y_{t−1} ; c_t]
      for layer in range(num_layers):
        carries[layer] = equation_step(kind, decoder_cells[layer], carries[layer], x)
        x = hidden(kind, carries[layer])
      logits_BxNxV[b, t] = w_o @ np.concatenate([x, context]) + b_o  # W_o [s_t ; c_t] + b_o
  return logits_BxNxV, weights_BxNxS


def drawn_parameters(model, *args, seed):
  """Every parameter `model.init` creates (names and shapes from `eval_shape`: no init program is
  compiled), drawn anew: kernels U(±1.7/√fan_in), biases and embeddings U(±1), so no bias is 0
  and a dropped or misplaced term changes the logits; the additive score's v is U(±3)."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args))['params']
  rng = np.random.default_rng(seed)

  def draw(path, s):
    if path[-2].key == 'energy':  # attention weights far from uniform
      scale = 3.0
    else:
      scale = 1.7 / np.sqrt(s.shape[0]) if path[-1].key == 'kernel' else 1.0
    return jnp.asarray(rng.uniform(-scale, scale, s.shape), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.mark.parametrize('cell, attention, bidirectional', [
    ('lstm', 'dot', False), ('gru', 'dot', False), ('lstm', 'additive', True),
    ('gru', 'additive', True)])
def test_seq2seq_logits_follow_the_encoder_decoder_attention_equations(cell, attention,
                                                                        bidirectional):
  model = rnn_models.Seq2Seq(64, cell=cell, features=8, num_layers=2, embed_dim=6,
                             bidirectional_encoder=bidirectional, attention=attention,
                             attention_features=7)
  targets = jax.random.randint(jax.random.PRNGKey(3), (3, 5), 3, 64)
  params = drawn_parameters(model, targets, SOURCE, LENGTHS, seed=4)

  @jax.jit
  def run(params):
    logits, state = model.apply({'params': params}, targets, SOURCE, LENGTHS,
                                mutable=['intermediates'])
    return logits, state['intermediates']['attention'][0]

  logits_BxNxV, weights_BxNxS = run(params)
  expected_logits, expected_weights = seq2seq_reference(cell, attention, params,
                                                        np.asarray(targets), SOURCE, LENGTHS)
  np.testing.assert_allclose(logits_BxNxV, expected_logits, **SEQ2SEQ_TOL)
  np.testing.assert_allclose(weights_BxNxS, expected_weights, **SEQ2SEQ_TOL)


@pytest.mark.parametrize('attention', ['none', 'additive'])
def test_greedy_generation_with_and_without_cache_equals_a_python_loop(attention):
  model = rnn_models.Seq2Seq(64, cell='lstm', features=16, num_layers=2, attention=attention,
                             embed_dim=8)
  variables = model.init(jax.random.PRNGKey(2), jnp.ones((3, 4), jnp.int32), SOURCE, LENGTHS)
  prompt = jnp.full((3, 1), rnn_models.BOS_ID, jnp.int32)
  outputs = {}
  for use_cache in (True, False):
    outputs[use_cache] = sampling.generate(
        model, variables, prompt, jax.random.PRNGKey(0), num_new_tokens=6, temperature=0.0,
        use_cache=use_cache, inputs=(SOURCE, LENGTHS), return_logits=True)
  tokens, apply = prompt, jax.jit(model.apply)
  for _ in range(6):  # rerun the whole decoder on the growing prefix
    logits = apply(variables, tokens, SOURCE, LENGTHS)[:, -1]
    tokens = jnp.concatenate([tokens, jnp.argmax(logits, -1)[:, None].astype(jnp.int32)], 1)
  np.testing.assert_array_equal(outputs[True][0], tokens)
  np.testing.assert_array_equal(outputs[False][0], tokens)
  np.testing.assert_allclose(outputs[True][1], outputs[False][1], atol=1e-5)


def test_language_model_cache_gives_the_logits_of_the_full_prefix():
  model = rnn_models.RNNLanguageModel(60, cell='gru', features=16, num_layers=2, embed_dim=8)
  variables = model.init(jax.random.PRNGKey(0), SOURCE)
  cached = sampling.generate(model, variables, SOURCE[:, :3], jax.random.PRNGKey(1),
                             num_new_tokens=6, use_cache=True, return_logits=True)
  full = sampling.generate(model, variables, SOURCE[:, :3], jax.random.PRNGKey(1),
                           num_new_tokens=6, use_cache=False, return_logits=True)
  np.testing.assert_array_equal(cached[0], full[0])
  np.testing.assert_allclose(cached[1], full[1], atol=1e-5)


def vector_to_sequence_reference(kind, params, targets_in_BxN, vectors):
  """Teacher-forced logits [B, N, V] of a `VectorToSequence` from its parameters, one example and
  one step at a time: decoder layer l starts from tanh(W v + b) of its own 'start{l}' Dense layer
  (LSTM: c and h from 'start{l}_c' and 'start{l}_h'), layer 1 reads E y_{t−1}, layer l > 1 the
  state of layer l − 1, and logits_t = W_o s_t + b_o."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  num_layers = len(p['decoder'])
  starts = [f'start{layer}{part}' for layer in range(num_layers)
            for part in (('_c', '_h') if kind == 'lstm' else ('',))]
  assert set(p) == {*starts, 'target_embed', 'decoder', 'output'}
  decoder_cells = [cell_equations(kind, p['decoder'][f'cell{layer}']) for layer in range(num_layers)]
  start = lambda name, v: np.tanh(p[name]['kernel'].T @ v + p[name]['bias'])
  embed_VxE, w_o, b_o = p['target_embed']['embedding'], p['output']['kernel'].T, p['output']['bias']
  v_BxD = np.asarray(vectors, np.float64).reshape(len(vectors), -1)
  batch, steps = targets_in_BxN.shape
  logits_BxNxV = np.zeros((batch, steps, len(b_o)))
  for b in range(batch):
    carries = [(start(f'start{layer}_c', v_BxD[b]), start(f'start{layer}_h', v_BxD[b]))
               if kind == 'lstm' else start(f'start{layer}', v_BxD[b])
               for layer in range(num_layers)]
    for t in range(steps):
      x = embed_VxE[targets_in_BxN[b, t]]
      for layer in range(num_layers):
        carries[layer] = equation_step(kind, decoder_cells[layer], carries[layer], x)
        x = hidden(kind, carries[layer])
      logits_BxNxV[b, t] = w_o @ x + b_o
  return logits_BxNxV


@pytest.mark.parametrize('cell', ['lstm', 'gru'])
def test_vector_to_sequence_starts_the_decoder_from_the_vector(cell):
  # The decoder without attention, started from carries computed from the vector in NumPy: the
  # largest difference measured is 3.0e-7 (logits up to 2.0).
  model = registry.build('vector_to_sequence', vocab_size=64, cell=cell, features=8,
                         num_layers=2, embed_dim=4)
  vectors = jax.random.uniform(jax.random.PRNGKey(0), (3, 8, 8, 1))
  targets = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 3, 64)
  params = drawn_parameters(model, targets, vectors, seed=6)
  logits = jax.jit(model.apply)({'params': params}, targets, vectors)
  assert logits.shape == (3, 5, 64)
  np.testing.assert_allclose(
      logits, vector_to_sequence_reference(cell, params, np.asarray(targets), vectors),
      **SEQ2SEQ_TOL)


@pytest.mark.parametrize('readout', ['last', 'mean', 'max'])
def test_classifier_readouts_ignore_padding(readout):
  model = rnn_models.RNNClassifier(4, cell='gru', features=8, bidirectional=True,
                                   readout=readout, vocab_size=60, embed_dim=4)
  variables = model.init(jax.random.PRNGKey(0), SOURCE, LENGTHS)
  logits = model.apply(variables, SOURCE, LENGTHS)
  np.testing.assert_allclose(model.apply(variables, _pad_with_noise(SOURCE, LENGTHS), LENGTHS),
                             logits, atol=1e-6)


def test_classifier_with_a_vocabulary_refuses_real_valued_inputs():
  # Token ids as floats (e.g. converted by the classification task) would otherwise skip the
  # embedding and be read as one real-valued feature per step.
  model = rnn_models.RNNClassifier(4, cell='gru', features=8, vocab_size=60, embed_dim=4)
  with pytest.raises(ValueError, match='vocab_size=60 but got float32 inputs'):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), SOURCE.astype(jnp.float32), LENGTHS))


@pytest.mark.parametrize('readout', ['mean', 'max'])
def test_classifier_summary_of_an_empty_sequence_is_zero(readout):
  # No valid step: the summary is 0, so the logits are the head's bias (a max over no steps
  # would be −inf and the logits NaN).
  model = rnn_models.RNNClassifier(3, cell='gru', features=4, readout=readout, vocab_size=60,
                                   embed_dim=4)
  lengths = np.array([5, 0, 2], np.int32)
  variables = model.init(jax.random.PRNGKey(0), SOURCE, lengths)
  logits = np.asarray(model.apply(variables, SOURCE, lengths))
  np.testing.assert_array_equal(logits[1], variables['params']['Dense_0']['bias'])
  assert np.isfinite(logits).all() and not np.allclose(logits[0], logits[1])


@pytest.mark.parametrize('readout', ['mean', 'max'])
def test_classifier_mean_and_max_readouts_are_over_the_valid_steps(readout):
  # The encoder's outputs past a sequence's length are 0, so an unmasked mean (dividing by T)
  # or max (where every valid output of a unit is negative) differs from this reference.
  model = rnn_models.RNNClassifier(4, cell='gru', features=8, bidirectional=True, readout=readout)
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 7))
  lengths = np.array([7, 4, 2], np.int32)
  variables = model.init(jax.random.PRNGKey(1), x, lengths)
  params = variables['params']
  y_BxTxH, _ = rnn.RNN('gru', 8, bidirectional=True).apply({'params': params['RNN_0']},
                                                          x[..., None], lengths)
  y_BxTxH = np.asarray(y_BxTxH, np.float64)
  pool = np.mean if readout == 'mean' else np.max
  summary = np.stack([pool(y_BxTxH[b, :n], axis=0) for b, n in enumerate(lengths)])
  assert (y_BxTxH[2, :2] < 0).all(axis=0).any()  # a unit an unmasked max would read as 0
  head = params['Dense_0']
  np.testing.assert_allclose(model.apply(variables, x, lengths),
                             summary @ head['kernel'] + head['bias'], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('cell', ['lstm', 'gru'])
def test_classifier_last_readout_is_the_final_states_of_both_directions(cell):
  # The head applied by hand to the reference RNN's top layer: the forward state at each example's
  # last valid step and the backward state at step 0. The largest difference measured is 1.6e-7;
  # reading the forward state at step T − 1 whatever the length changes the logits by ≥ 0.16, the
  # first layer's states instead of the second's by ≥ 0.6.
  model = rnn_models.RNNClassifier(4, cell=cell, features=8, num_layers=2, bidirectional=True,
                                   readout='last')
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 7))
  lengths = np.array([7, 4, 2], np.int32)
  params = drawn_parameters(model, x, lengths, seed=5)
  assert set(params) == {'RNN_0', 'Dense_0'}
  cells = [[cell_equations(cell, params['RNN_0'][f'layer{layer}_{d}'][CELL_MODULE[cell]])
            for d in ('forward', 'backward')] for layer in range(2)]
  y_BxTx2H, _ = reference_rnn(cell, cells, np.asarray(x, np.float64)[..., None], lengths)
  summary = np.stack([np.concatenate([y_BxTx2H[b, n - 1, :8], y_BxTx2H[b, 0, 8:]])
                      for b, n in enumerate(lengths)])
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['Dense_0'])
  np.testing.assert_allclose(jax.jit(model.apply)({'params': params}, x, lengths),
                             summary @ head['kernel'] + head['bias'], rtol=0, atol=1e-6)


def test_tagger_outputs_one_distribution_per_step_that_depends_on_both_sides():
  model = rnn_models.RNNTagger(3, vocab_size=60, embed_dim=4, features=8)
  variables = model.init(jax.random.PRNGKey(0), SOURCE, LENGTHS)
  logits = model.apply(variables, SOURCE, LENGTHS)
  assert logits.shape == (3, 9, 3)
  changed = model.apply(variables, SOURCE.at[0, 6].set(4), LENGTHS)
  # Bidirectional: step 2 sees a change at step 6 (forward-only would not).
  assert np.abs(logits[0, 2] - changed[0, 2]).max() > 1e-5


@pytest.mark.parametrize('options, message', [
    (dict(attention='dot', bidirectional_encoder=True), 'additive'),
    (dict(attention='additive', source='vector'), 'vector'),
    (dict(attention='luong'), 'attention'),
    (dict(cell='rnn'), 'cell'),
    (dict(features=0), 'features'),
])
def test_seq2seq_option_errors_name_the_value(options, message):
  with pytest.raises(ValueError, match=message):
    registry.build('seq2seq', vocab_size=64, **options)


@pytest.mark.parametrize('name, options, message', [
    ('seq2seq', dict(vocab_size=64, attention='additive', attention_features=0),
     'Seq2Seq attention_features must be a positive integer, got 0.'),
    ('seq2seq', dict(vocab_size=64, embed_dim=-1),
     'Seq2Seq embed_dim must be a positive integer, got -1.'),
    # 0 was read as "not given" and replaced by vocab_size.
    ('seq2seq', dict(vocab_size=64, source_vocab_size=0),
     'Seq2Seq source_vocab_size must be None or a positive integer, got 0.'),
    ('vector_to_sequence', dict(vocab_size=0),
     'Seq2Seq vocab_size must be a positive integer, got 0.'),
    ('rnn_classifier', dict(num_classes=0),
     'RNNClassifier num_classes must be a positive integer, got 0.'),
    ('rnn_classifier', dict(num_classes=3, vocab_size=60, embed_dim=2.5),
     'RNNClassifier embed_dim must be a positive integer, got 2.5.'),
    ('rnn_tagger', dict(num_tags=0), 'RNNTagger num_tags must be a positive integer, got 0.'),
    ('rnn_tagger', dict(num_tags=2, vocab_size=-3),
     'RNNTagger vocab_size must be None or a positive integer, got -3.'),
    ('rnn_lm', dict(vocab_size=60, embed_dim=0),
     'RNNLanguageModel embed_dim must be a positive integer, got 0.'),
])
def test_sizes_that_are_not_positive_integers_stop_at_construction(name, options, message):
  # Each was accepted and failed inside init (ZeroDivisionError, a negative shape) without
  # naming the option, or, for source_vocab_size=0, silently replaced.
  with pytest.raises(ValueError) as error:
    registry.build(name, **options)
  assert str(error.value) == message


@pytest.mark.parametrize('name, options', [
    ('rnn_classifier', dict(num_classes=3, vocab_size=60)),
    ('rnn_tagger', dict(num_tags=3, vocab_size=60)),
    ('rnn_lm', dict(vocab_size=60)),
    ('seq2seq', dict(vocab_size=60)),
])
def test_an_unroll_that_scan_does_not_take_stops_at_construction(name, options):
  # 2.5 failed inside init with a shape TypeError, '2' with a '<' TypeError, -1 in scan's own
  # message that names no model; a bool, 0 (every step) and any positive integer are scan's.
  owner = type(registry.build(name, **options)).__name__
  for unroll in (2.5, '2', -1, None):
    one_sentence(lambda: registry.build(name, **options, unroll=unroll),
                 f'{owner} unroll must be', repr(unroll))
  for unroll in (True, False, 0, 4, np.int64(2)):
    assert registry.build(name, **options, unroll=unroll).unroll == unroll


@pytest.mark.parametrize('readout', ['mean', 'max'])
def test_classifier_lengths_as_a_list_give_the_logits_of_the_array(readout):
  # The 'mean' and 'max' masks indexed the list with [:, None] (a TypeError).
  model = rnn_models.RNNClassifier(4, cell='gru', features=8, readout=readout, vocab_size=60,
                                   embed_dim=4)
  variables = model.init(jax.random.PRNGKey(0), SOURCE, LENGTHS)
  np.testing.assert_array_equal(model.apply(variables, SOURCE, [9, 5, 2]),
                                model.apply(variables, SOURCE, LENGTHS))


def _small_seq2seq(attention):
  """(model, targets, variables) of a small GRU Seq2Seq over SOURCE."""
  model = rnn_models.Seq2Seq(60, cell='gru', features=8, embed_dim=4, attention=attention,
                             attention_features=4)
  targets = SOURCE[:, :4]
  return model, targets, model.init(jax.random.PRNGKey(0), targets, SOURCE, LENGTHS)


@pytest.mark.parametrize('attention', ['none', 'additive'])
def test_seq2seq_source_lengths_as_a_list_give_the_logits_of_the_array(attention):
  model, targets, variables = _small_seq2seq(attention)
  np.testing.assert_array_equal(model.apply(variables, targets, SOURCE, [9, 5, 2]),
                                model.apply(variables, targets, SOURCE, LENGTHS))


def test_seq2seq_embeds_the_source_with_a_table_of_the_source_vocabulary():
  # Source ids (3 … 49) past the 8 target ids: a source table of vocab_size rows would have no
  # row for them (NaN embeddings, or clipped to the last row when jitted).
  model = rnn_models.Seq2Seq(8, source_vocab_size=50, features=8, embed_dim=4)
  targets = jnp.array([[1, 5, 7], [1, 3, 4], [1, 6, 6]])
  variables = model.init(jax.random.PRNGKey(0), targets, SOURCE, LENGTHS)
  assert variables['params']['source_input']['Embed_0']['embedding'].shape == (50, 4)
  assert variables['params']['target_embed']['embedding'].shape == (8, 4)
  logits = model.apply(variables, targets, SOURCE, LENGTHS)
  assert logits.shape == (3, 3, 8) and np.isfinite(logits).all()


@pytest.mark.parametrize('attention', ['none', 'additive'])
def test_seq2seq_targets_of_another_batch_than_the_source_are_one_sentence(attention):
  model, targets, variables = _small_seq2seq(attention)
  with pytest.raises(ValueError, match=r'Seq2Seq reads targets \[B, N\] and a source of the same '
                                       r'batch B, got targets of shape \(2, 4\) and a source of '
                                       r'shape \(3, 9\)\.'):
    model.apply(variables, targets[:2], SOURCE, LENGTHS)


def test_seq2seq_attention_over_an_empty_source_is_one_sentence():
  model = rnn_models.Seq2Seq(60, cell='gru', features=8, embed_dim=4, attention='dot')
  targets = SOURCE[:, :4]
  variables = model.init(jax.random.PRNGKey(0), targets, SOURCE, LENGTHS)
  with pytest.raises(ValueError, match=r"attention='dot' needs a source of at least one step to "
                                       r'attend over, got shape \(3, 0\)\.'):
    model.apply(variables, targets, SOURCE[:, :0])


DROPOUT_MODELS = {
    'classifier': (lambda rate: rnn_models.RNNClassifier(4, features=8, num_layers=2, vocab_size=60,
                                                         embed_dim=4, dropout_rate=rate),
                   (SOURCE, LENGTHS)),
    'tagger': (lambda rate: rnn_models.RNNTagger(3, vocab_size=60, embed_dim=4, features=8,
                                                 dropout_rate=rate), (SOURCE, LENGTHS)),
    'language_model': (lambda rate: rnn_models.RNNLanguageModel(60, features=8, embed_dim=4,
                                                                dropout_rate=rate), (SOURCE,)),
    'seq2seq': (lambda rate: rnn_models.Seq2Seq(60, features=8, embed_dim=4, attention='additive',
                                                attention_features=8, dropout_rate=rate),
                (SOURCE[:, :5], SOURCE, LENGTHS)),
}


@pytest.mark.parametrize('name', DROPOUT_MODELS)
def test_dropout_acts_in_training_only(name):
  """At inference a model with dropout computes what the same parameters compute without it; in
  training some activations are dropped, so the logits differ."""
  build, args = DROPOUT_MODELS[name]
  model, plain = build(0.3), build(0.0)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), *args)
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(
      lambda a: a.shape, jax.eval_shape(plain.init, jax.random.PRNGKey(0), *args))

  @jax.jit
  def run(variables):
    return (plain.apply(variables, *args), model.apply(variables, *args),
            model.apply(variables, *args, train=True, rngs={'dropout': jax.random.PRNGKey(1)}))

  expected, inference, trained = run(variables)
  np.testing.assert_allclose(inference, expected, rtol=1e-6, atol=1e-6)
  assert np.max(np.abs(np.asarray(trained) - np.asarray(expected))) > 1e-3


def _training_calls(model, args, paths):
  """{path: [(positional inputs, output)]} of the calls of the model's direct submodules named in
  `paths`, and every direct nn.Dropout's, in one training apply (not traced: concrete arrays)."""
  calls = {}

  def record(next_fun, call_args, kwargs, context):
    out = next_fun(*call_args, **kwargs)
    path = context.module.path
    if context.method_name == '__call__' and len(path) == 1 and (
        path[0] in paths or isinstance(context.module, nn.Dropout)):
      calls.setdefault('dropout' if isinstance(context.module, nn.Dropout) else path[0],
                       []).append((call_args, out))
    return out

  variables = model.init(jax.random.PRNGKey(0), *args)
  with nn.intercept_methods(record):
    model.apply(variables, *args, train=True, rngs={'dropout': jax.random.PRNGKey(1)})
  return calls


def _dropped(calls, x):
  """The output of the one dropout that read `x`, checked to be inverted dropout of it at rate 0.3."""
  x = np.asarray(x)
  found = [np.asarray(out) for (inp, *_), out in calls.get('dropout', [])
           if np.shape(inp) == x.shape and np.array_equal(np.asarray(inp), x)]
  assert len(found) == 1, 'no dropout reads this tensor'
  # Past a sequence's length the RNN's outputs are 0, dropped or not: the kept share is of the rest.
  nonzero = x != 0
  np.testing.assert_array_equal(found[0][~nonzero], 0)
  dropout_probe.assert_inverted_dropout(found[0][nonzero], x[nonzero], 0.3, rtol=1e-6, atol=1e-7)
  return found[0]


@pytest.mark.parametrize('name', DROPOUT_MODELS)
def test_dropout_sits_where_each_model_says(name):
  """Every dropout site of the docstrings, checked on what flows between the submodules: the
  language model drops its embeddings and the RNN's outputs before the output layer (Zaremba et
  al. 2014), the tagger and the classifier the input of their head, Seq2Seq the source and
  target embeddings and the input of its output layer. The test above sees only that some
  activation is dropped, so any one of these dropouts could go missing unseen."""
  build, args = DROPOUT_MODELS[name]
  paths = {'classifier': ('RNN_0', 'Dense_0'), 'tagger': ('RNN_0', 'Dense_0'),
           'language_model': ('SequenceInput_0', 'RNN_0', 'Dense_0'),
           'seq2seq': ('source_input', 'encoder', 'target_embed', 'output')}[name]
  calls = _training_calls(build(0.3), args, paths)
  first = lambda path: calls[path][0]
  if name == 'language_model':
    np.testing.assert_array_equal(first('RNN_0')[0][0],
                                  _dropped(calls, first('SequenceInput_0')[1]))
  if name in ('language_model', 'tagger'):
    np.testing.assert_array_equal(first('Dense_0')[0][0], _dropped(calls, first('RNN_0')[1][0]))
  if name == 'classifier':  # the 'last' readout: the top layer's final states
    carries = first('RNN_0')[1][1]
    summary = jnp.concatenate([rnn.hidden_state(c) for c in carries[-1]], axis=-1)
    np.testing.assert_array_equal(first('Dense_0')[0][0], _dropped(calls, summary))
  if name == 'seq2seq':
    np.testing.assert_array_equal(first('encoder')[0][0], _dropped(calls, first('source_input')[1]))
    _dropped(calls, first('target_embed')[1])  # read by the scanned decoder
    # The output layer reads a dropped [s_t; c_t], 8 + 8 wide.
    head_input = np.asarray(first('output')[0][0])
    sources = [np.asarray(inp) for (inp, *_), out in calls['dropout']
               if np.shape(out) == head_input.shape and np.array_equal(np.asarray(out), head_input)]
    assert len(sources) == 1 and sources[0].shape[-1] == 16
    _dropped(calls, sources[0])
