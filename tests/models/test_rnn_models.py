"""The four recurrent architectures: padding, causality, decoding cache and greedy decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.sequence import rnn
from models.sequence import rnn_models
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


def test_vector_to_sequence_starts_the_decoder_from_the_vector():
  model = registry.build('vector_to_sequence', vocab_size=64, cell='lstm', features=8,
                         num_layers=2, embed_dim=4)
  vectors = jax.random.uniform(jax.random.PRNGKey(0), (2, 8, 8, 1))
  targets = jnp.full((2, 5), 9, jnp.int32)
  variables = model.init(jax.random.PRNGKey(1), targets, vectors)
  logits = model.apply(variables, targets, vectors)
  assert logits.shape == (2, 5, 64)
  # Same decoder inputs, different vectors: different sequences; the batch rows are independent.
  assert np.abs(logits[0] - logits[1]).max() > 1e-4
  swapped = model.apply(variables, targets, vectors[::-1])
  np.testing.assert_allclose(swapped, logits[::-1], atol=1e-6)


@pytest.mark.parametrize('readout', ['last', 'mean', 'max'])
def test_classifier_readouts_ignore_padding(readout):
  model = rnn_models.RNNClassifier(4, cell='gru', features=8, bidirectional=True,
                                   readout=readout, vocab_size=60, embed_dim=4)
  variables = model.init(jax.random.PRNGKey(0), SOURCE, LENGTHS)
  logits = model.apply(variables, SOURCE, LENGTHS)
  np.testing.assert_allclose(model.apply(variables, _pad_with_noise(SOURCE, LENGTHS), LENGTHS),
                             logits, atol=1e-6)


def test_classifier_last_readout_is_the_final_states_of_both_directions():
  model = rnn_models.RNNClassifier(4, cell='lstm', features=8, bidirectional=True, readout='last')
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 7))
  variables = model.init(jax.random.PRNGKey(1), x)
  params = variables['params']
  # The encoder alone, then the head applied by hand to [→h_T ; ←h_1].
  encoder = rnn.RNN('lstm', 8, bidirectional=True)
  _, carries = encoder.apply({'params': params['RNN_0']}, x[..., None])
  (forward, backward), = carries
  summary = jnp.concatenate([forward[1], backward[1]], -1)
  head = params['Dense_0']
  np.testing.assert_allclose(model.apply(variables, x), summary @ head['kernel'] + head['bias'],
                             rtol=1e-5, atol=1e-6)


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
