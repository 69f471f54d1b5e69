"""The masked-language-model task: BERT inputs, the 15% / 80-10-10 rule, the loss, the streams.

Rates are checked over tens of thousands of positions against binomial bounds of
5 standard deviations, sqrt(p (1 − p) / n), computed from each count n.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from data import text, tokenizers
from models.transformer.bert import SPECIAL_TOKENS
from tests.messages import one_sentence
from train import step, tasks
from train.state import init_train_state

# Ids of the five-character vocabulary used by the small examples.
A, B, C, D, E = range(5)
PAD, CLS, SEP, MASK = 5, 6, 7, 8


def _task(vocab_size=5, counts=None, **options):
  tokenizer = tokenizers.CharTokenizer([chr(0x4E00 + i) for i in range(vocab_size)])
  counts = np.ones(vocab_size, np.int64) if counts is None else np.asarray(counts)
  return tasks.build('masked_language_model', {'tokenizer': tokenizer, 'token_counts': counts},
                     **options)


def _within(count, n, p, sigmas=5.0):
  """Whether count / n lies within `sigmas` binomial standard deviations of p."""
  return abs(count / n - p) <= sigmas * np.sqrt(p * (1 - p) / n)


# Host side: BERT inputs from text windows.


def test_special_ids_follow_the_tokenizer_ids():
  task = _task()
  assert [task.special_id(t) for t in SPECIAL_TOKENS] == [PAD, CLS, SEP, MASK]


def test_windows_become_cls_text_sep_then_padding():
  """Token j >= 1 of a window is text where weight j − 1 is set; token 0 always is."""
  records = {'tokens': np.array([[A, B, C, D, E], [E, D, C, 0, 0], [B, 0, 0, 0, 0]], np.int32),
             'weights': np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)}
  np.testing.assert_array_equal(_task().preprocess(records)['tokens'], [
      [CLS, A, B, C, D, SEP],
      [CLS, E, D, C, SEP, PAD],
      [CLS, B, SEP, PAD, PAD, PAD]])
  np.testing.assert_array_equal(_task(use_cls_sep=False).preprocess(records)['tokens'], [
      [A, B, C, D], [E, D, C, PAD], [B, PAD, PAD, PAD]])


@pytest.mark.parametrize('n', [23, 21, 6, 2])  # with n − 1 a multiple of 5 too
def test_evaluation_windows_hold_every_token_of_the_text_once(n):
  stream = np.arange(n) % 5
  windows = text.TokenWindows(stream, 5, training=False)
  tokens = _task().preprocess(windows.gather(np.arange(len(windows))))['tokens']
  np.testing.assert_array_equal(tokens[tokens < 5], stream)
  assert np.all(tokens[:, 0] == CLS) and np.sum(tokens == SEP) == len(windows)


# Device side: the masking rule.


def _masked(task, tokens, seed=0):
  return jax.device_get(task.transform({'masking': jax.random.PRNGKey(seed)},
                                       {'tokens': jnp.asarray(tokens)}, True))


def _large_batch(vocab_size, batch=64, length=256, seed=0):
  """BERT inputs of random text, a third of the rows padded after a random length."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab_size, size=(batch, length + 1)).astype(np.int32)
  lengths = np.where(np.arange(batch) % 3 == 0, rng.integers(1, length, size=batch), length)
  weights = (np.arange(length)[None, :] < lengths[:, None] - 1).astype(np.float32)
  return {'tokens': tokens, 'weights': weights}


@pytest.mark.parametrize('mask_rate, probabilities', [(0.15, (0.8, 0.1, 0.1)),
                                                      (0.4, (0.6, 0.3, 0.1))])
def test_masking_follows_the_rates_within_binomial_bounds(mask_rate, probabilities):
  vocab_size = 1000
  task = _task(vocab_size, mask_rate=mask_rate, replace_probabilities=probabilities)
  tokens = task.preprocess(_large_batch(vocab_size))['tokens']
  out = _masked(task, tokens)
  candidates = tokens < vocab_size
  chosen = out['weights'] == 1
  np.testing.assert_array_equal(out['targets'], tokens)
  np.testing.assert_array_equal(out['candidates'], candidates)
  # Specials and padding are never chosen, and stay as they were.
  assert not np.any(chosen & ~candidates)
  np.testing.assert_array_equal(out['tokens'][~candidates], tokens[~candidates])
  # Unchosen text is untouched.
  np.testing.assert_array_equal(out['tokens'][candidates & ~chosen], tokens[candidates & ~chosen])

  n, m = int(candidates.sum()), int(chosen.sum())
  assert n > 12_000, n
  assert _within(m, n, mask_rate), (m / n, mask_rate)
  inputs, targets = out['tokens'][chosen], tokens[chosen]
  p_mask, p_random, p_keep = probabilities
  # A random token equals the original one time in V.
  expected = {'mask': p_mask, 'kept': p_keep + p_random / vocab_size,
              'other': p_random * (1 - 1 / vocab_size)}
  counts = {'mask': np.sum(inputs == task.special_id('[MASK]')), 'kept': np.sum(inputs == targets),
            'other': np.sum((inputs != targets) & (inputs < vocab_size))}
  assert sum(counts.values()) == m
  for kind, p in expected.items():
    assert _within(counts[kind], m, p), (kind, counts[kind] / m, p)


def test_random_replacements_are_uniform_over_the_tokenizer_ids():
  vocab_size = 10
  task = _task(vocab_size, mask_rate=1.0, replace_probabilities=(0.0, 1.0, 0.0))
  tokens = task.preprocess(_large_batch(vocab_size, batch=32))['tokens']
  out = _masked(task, tokens)
  replaced = out['tokens'][tokens < vocab_size]
  assert replaced.max() < vocab_size  # never a special token
  frequencies = np.bincount(replaced, minlength=vocab_size)
  for count in frequencies:
    assert _within(count, replaced.size, 1 / vocab_size), frequencies
  # Independent of the original token: replacements equal it one time in V.
  assert _within(np.sum(replaced == tokens[tokens < vocab_size]), replaced.size, 1 / vocab_size)


def test_unchanged_positions_are_predicted_too():
  """With p_keep = 1 the input is the text itself, yet every chosen position is a target."""
  task = _task(mask_rate=1.0, replace_probabilities=(0.0, 0.0, 1.0))
  tokens = np.array([[CLS, A, B, C, SEP, PAD]])
  out = _masked(task, tokens)
  np.testing.assert_array_equal(out['tokens'], tokens)
  np.testing.assert_array_equal(out['weights'], [[0, 1, 1, 1, 0, 0]])
  metrics = task.loss(_Fixed(np.zeros((1, 6, 9), np.float32)), out)
  assert float(np.sum(metrics['loss'][1])) == 3
  np.testing.assert_allclose(np.sum(metrics['loss'][0]), 3 * np.log(9), rtol=1e-6)


# The loss.


class _Fixed:
  """A 'model' that returns fixed logits, so the metrics are known in closed form."""

  def __init__(self, logits):
    self.logits = jnp.asarray(logits)

  def __call__(self, tokens):
    assert tokens.shape == self.logits.shape[:2]
    return self.logits


def test_loss_is_the_token_weighted_cross_entropy_at_the_chosen_positions():
  """Rows with 2 and 1 chosen positions (one of them unchanged): every metric is a sum over
  the 3 positions divided by 3, not a mean of row means."""
  counts = np.array([3, 10, 1, 0, 2])
  task = _task(counts=counts)
  batch = {'tokens': np.array([[CLS, MASK, B, D, SEP], [CLS, A, C, MASK, SEP]]),
           'targets': np.array([[CLS, A, B, D, SEP], [CLS, A, C, E, SEP]]),
           'weights': np.array([[0, 1, 1, 0, 0], [0, 0, 0, 1, 0]], np.float32),
           'candidates': np.array([[0, 1, 1, 1, 0], [0, 1, 1, 1, 0]], np.float32)}
  logits = np.random.default_rng(0).normal(size=(2, 5, 9)).astype(np.float32)
  logits[0, 1, A] += 10.0  # right; the others are whatever the draw gives
  metrics = task.loss(_Fixed(logits), batch)
  totals = {name: (float(np.sum(t)), float(np.sum(w))) for name, (t, w) in metrics.items()}

  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  chosen = [(0, 1), (0, 2), (1, 3)]
  targets = [batch['targets'][b, t] for b, t in chosen]
  nll = [-log_probs[b, t, y] for (b, t), y in zip(chosen, targets)]
  correct = [np.argmax(logits[b, t]) == y for (b, t), y in zip(chosen, targets)]
  assert correct[0]
  np.testing.assert_allclose(totals['loss'], (sum(nll), 3.0), rtol=1e-6)
  np.testing.assert_allclose(totals['accuracy'], (sum(correct), 3.0))
  # The most frequent training token is B (10 of 16): right at one of A, B, E.
  assert totals['unigram_accuracy'] == (1.0, 3.0)
  unigram_nll = [-np.log((counts[y] + 1) / (16 + 5)) for y in targets]
  np.testing.assert_allclose(totals['unigram_loss'], (sum(unigram_nll), 3.0), rtol=1e-6)
  assert totals['masked_fraction'] == (3.0, 6.0)
  report = task.finalize(totals)
  np.testing.assert_allclose(report['loss'], sum(nll) / 3, rtol=1e-6)
  np.testing.assert_allclose(report['perplexity'], np.exp(sum(nll) / 3), rtol=1e-6)
  assert report['masked_fraction'] == 0.5


def test_a_model_without_the_special_tokens_is_refused():
  task = _task()
  batch = _masked(task, np.array([[CLS, A, B, SEP]]))
  message = one_sentence(lambda: task.loss(_Fixed(np.zeros((1, 4, 5))), batch))
  assert '(9)' in message and 'gives 5' in message and 'num_special_tokens=4' in message


# The random streams, through the train and eval steps.


class _PerPositionModel(nn.Module):
  """Logits from each input token alone: cheap, and the loss still sees the masked inputs."""

  @nn.compact
  def __call__(self, tokens_BxS, *, train=False):
    return nn.Dense(9)(nn.Embed(9, 8)(tokens_BxS))


def test_steps_draw_fresh_masks_and_evaluation_repeats_its_masks():
  """Step t masks with stream_key(fold_in(rng, t), 'masking'); eval batch i with the eval
  stream of i, identically at every evaluation."""
  task, model = _task(), _PerPositionModel()
  rng = np.random.default_rng(0)
  batch = task.preprocess({'tokens': rng.integers(0, 5, size=(8, 17)).astype(np.int32),
                           'weights': np.ones((8, 16), np.float32)})
  tx = optax.sgd(0.0)
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  train_step = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                         learning_rate_fn=optax.constant_schedule(0.0)))
  eval_step = jax.jit(functools.partial(step.eval_step, model=model, task=task))

  def loss_with(key):
    masked = task.transform({'masking': tasks.stream_key(key, 'masking')}, batch, True)
    bound = tasks.BoundModel(model, state.params, {}, {}, train=False, axis_name=None)
    total, weight = task.loss(bound, masked)['loss']
    return float(jnp.sum(total) / jnp.sum(weight)), np.asarray(masked['weights'])

  train_losses = []
  for t in (3, 4):
    _, metrics = train_step(state.replace(step=jnp.int32(t)), batch)
    train_losses.append(float(metrics['totals']['loss'][0] / metrics['totals']['loss'][1]))
    expected, _ = loss_with(jax.random.fold_in(state.rng, t))
    np.testing.assert_allclose(train_losses[-1], expected, rtol=1e-6)
  masks = [loss_with(jax.random.fold_in(state.rng, t))[1] for t in (3, 4)]
  assert np.sum(masks[0] != masks[1]) > 10 and train_losses[0] != train_losses[1]

  eval_batch = {**batch, 'mask': np.ones(8, np.int32)}
  evaluate = lambda index: jax.device_get(eval_step(state, eval_batch, np.int32(index)))
  first, again, other = evaluate(2), evaluate(2), evaluate(3)
  for name in first:
    np.testing.assert_array_equal(first[name], again[name])
  eval_key = jax.random.fold_in(jax.random.fold_in(state.rng, step._EVAL_STREAM), 2)  # pylint: disable=protected-access
  expected, eval_mask = loss_with(eval_key)
  np.testing.assert_allclose(first['loss'][0] / first['loss'][1], expected, rtol=1e-6)
  assert first['loss'][1] == eval_mask.sum() and not np.array_equal(eval_mask, masks[0])
  assert other['loss'][0] != first['loss'][0]


# Options.


@pytest.mark.parametrize('options, fragment', [
    ({'mask_rate': 0.0}, 'task.mask_rate must lie in (0, 1], got 0.0'),
    ({'mask_rate': 1.5}, 'task.mask_rate must lie in (0, 1], got 1.5'),
    ({'replace_probabilities': (0.8, 0.2)}, 'got (0.8, 0.2)'),
    ({'replace_probabilities': (0.8, 0.1, 0.2)}, 'summing to 1'),
    ({'replace_probabilities': (1.1, -0.1, 0.0)}, 'got (1.1, -0.1, 0.0)'),
    ({'use_cls_sep': 'yes'}, "task.use_cls_sep must be True or False, got 'yes'"),
])
def test_bad_options_stop_inone_sentence(options, fragment):
  assert fragment in one_sentence(lambda: _task(**options))


def test_the_task_needs_text_data_and_its_token_counts():
  assert 'config.data.tokenizer' in one_sentence(
      lambda: tasks.build('masked_language_model', {'features': ('image', 'label')}))
  tokenizer = tokenizers.CharTokenizer(list('abcde'))
  message = one_sentence(lambda: tasks.build('masked_language_model',
                                              {'tokenizer': tokenizer,
                                               'token_counts': np.ones(4)}))
  assert 'token_counts' in message and '(4,)' in message and '5 token ids' in message


def test_token_records_and_windows_whose_text_is_not_a_prefix_are_refused():
  # A data set's token records (associative_recall weights only its answers) were turned into
  # [PAD]s with [SEP] in the middle of the text, without a word.
  tokenizer = tokenizers.CharTokenizer(list('abcde'))
  message = one_sentence(lambda: tasks.build(
      'masked_language_model', {'tokenizer': tokenizer, 'token_counts': np.ones(5),
                                'unit': 'token'}))
  assert message == ("The masked_language_model task needs windows of text (config.data."
                     "tokenizer 'char' or 'byte_bpe'), not a data set's token records "
                     "(tokenizer='dataset').")
  records = {'tokens': np.array([[A, B, C, D, E]], np.int32),
             'weights': np.array([[0, 1, 0, 1]], np.float32)}
  message = one_sentence(lambda: _task().preprocess(records))
  assert message.startswith('The masked_language_model task needs windows whose weighted '
                            'positions are a prefix of the window')
