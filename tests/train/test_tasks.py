"""Tasks: options checked by name and value, weighted sums, and finalized reports."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data import tokenizers
from tests.messages import one_sentence
from train import tasks


def test_unknown_task_and_unknown_option():
  assert "'regression'" in one_sentence(lambda: tasks.build('regression'))
  message = one_sentence(lambda: tasks.build('classification', label_smooth=0.1))
  assert "'label_smooth'" in message and 'label_smoothing' in message


@pytest.mark.parametrize('value', [2.0, -0.1, 1.0])
def test_label_smoothing_outside_the_unit_interval_is_refused(value):
  message = one_sentence(lambda: tasks.build('classification', label_smoothing=value))
  assert f'task.label_smoothing must lie in [0, 1), got {value!r}' in message


def test_input_key_must_be_a_feature():
  message = one_sentence(lambda: tasks.build('classification', {'features': ('x', 'label')},
                                              input_key='image'))
  assert "'image'" in message and 'label, x' in message


def test_classification_needs_labels_without_printing_the_data():
  meta = {'features': ('text',)}
  message = one_sentence(lambda: tasks.build('classification', meta, input_key='text'))
  assert 'label' in message and len(message) < 200


def _lm(tokenizer, **options):
  units = np.array([len(t) for t in tokenizer.vocab], np.float32) if isinstance(
      tokenizer, tokenizers.CharTokenizer) else np.array(
          [len(b) for b in tokenizer._token_bytes], np.float32)  # pylint: disable=protected-access
  unit = 'char' if isinstance(tokenizer, tokenizers.CharTokenizer) else 'byte'
  return tasks.build('language_model', {'tokenizer': tokenizer, 'token_units': units, 'unit': unit},
                     **options)


class _Fixed:
  """A 'model' that returns fixed logits, so the loss is known in closed form."""

  def __init__(self, logits):
    self.logits = logits

  def __call__(self, tokens):
    return self.logits[:, :tokens.shape[1]]


def test_language_model_loss_is_weighted_per_token_and_reports_bits_per_byte():
  tokenizer = tokenizers.ByteBPETokenizer([('h', 'e')])  # 257 tokens; 'he' is 2 bytes
  task = _lm(tokenizer, sample_length=0)
  vocab = tokenizer.vocab_size
  he, x = tokenizer.encode('he')[0], tokenizer.encode('x')[0]
  tokens = np.array([[x, he, x, he], [he, x, he, x]], np.int32)
  weights = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, vocab)).astype(np.float32)
  # Right next-token guesses at two weighted targets and at the unweighted one (row 0, last).
  for row, position in ((0, 0), (1, 1), (0, 2)):
    logits[row, position, he] = 10.0
  metrics = task.loss(_Fixed(jnp.asarray(logits)), {'tokens': tokens, 'weights': weights})
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, tokens[:, 1:, None], -1)[..., 0]
  totals = {name: (float(np.sum(t)), float(np.sum(w))) for name, (t, w) in metrics.items()}
  nats = (nll * weights).sum()
  np.testing.assert_allclose(totals['loss'], (nats, 5.0), rtol=1e-5)
  # Scored targets: he, x | x, he, x  →  2 + 1 + 1 + 2 + 1 = 7 bytes.
  np.testing.assert_allclose(totals['nats_per_unit'][1], 7.0)
  # Accuracy counts the weighted targets only: 2 right of 5, not 3 of 6.
  assert ((logits.argmax(-1) == tokens[:, 1:]) * weights).sum() == 2
  assert totals['accuracy'] == (2.0, 5.0)
  report = task.finalize(totals)
  np.testing.assert_allclose(report['loss'], nats / 5, rtol=1e-5)
  np.testing.assert_allclose(report['perplexity'], math.exp(nats / 5), rtol=1e-5)
  np.testing.assert_allclose(report['bits_per_byte'], nats / 7 / math.log(2), rtol=1e-5)
  assert report['accuracy'] == pytest.approx(0.4)


def test_language_model_bits_per_char_equal_bits_per_token_for_characters():
  task = _lm(tokenizers.CharTokenizer(list('ab')), sample_length=0)
  report = task.finalize({'loss': (10.0, 4.0), 'accuracy': (1.0, 4.0),
                          'nats_per_unit': (10.0, 4.0)})
  assert report['bits_per_char'] == pytest.approx(2.5 / math.log(2))
  assert report['accuracy'] == 0.25


def test_language_model_options_are_checked():
  tokenizer = tokenizers.CharTokenizer(list('ab'))
  assert "'z'" in one_sentence(lambda: _lm(tokenizer, prompt='z'))
  _lm(tokenizer, prompt='z', sample_length=0)  # no sampling, no prompt to encode
  assert 'top_p' in one_sentence(lambda: _lm(tokenizer, top_p=1.5))
  assert 'temperature' in one_sentence(lambda: _lm(tokenizer, temperature=-1.0))
  assert 'sample_length' in one_sentence(lambda: _lm(tokenizer, sample_length=-3))
  message = one_sentence(lambda: tasks.build('language_model', {}))
  assert 'config.data.tokenizer' in message


def test_finalize_of_an_empty_aggregate_is_nan_not_an_error():
  report = tasks.build('classification').finalize({'loss': (0.0, 0.0)})
  assert math.isnan(report['loss'])
  # A total of 0 over a positive weight is a value of 0 (e.g. no right guess), not NaN.
  report = tasks.build('classification').finalize({'loss': (3.0, 4.0), 'accuracy': (0.0, 4.0)})
  assert report == {'loss': 0.75, 'accuracy': 0.0}


def test_per_channel_normalisation_in_training_and_evaluation():
  task = tasks.build('classification', {'features': ('image', 'label'), 'num_classes': 3},
                     input_mean=(0.5, 0.25), input_std=(2.0, 0.5))
  rng = np.random.default_rng(0)
  images = rng.uniform(size=(4, 3, 3, 2)).astype(np.float32)
  batch = {'input': jnp.asarray(images), 'label': jnp.zeros(4, jnp.int32)}
  expected = np.stack([(images[..., 0] - 0.5) / 2.0, (images[..., 1] - 0.25) / 0.5], -1)
  for train in (False, True):
    out = task.transform({}, batch, train)
    np.testing.assert_allclose(out['input'], expected, rtol=1e-6)


def test_normalisation_follows_augmentation():
  # A crop of a padded image, then normalisation: the crop pads [0, 1] images with 0 first.
  task = tasks.build('classification', {'features': ('image', 'label'), 'num_classes': 3},
                     input_mean=(0.5,), input_std=(0.5,),
                     augment=({'name': 'random_crop', 'padding': 1, 'p': 1.0},))
  images = np.ones((8, 4, 4, 1), np.float32)
  out = task.transform({'augment': jax.random.PRNGKey(0)},
                       {'input': jnp.asarray(images), 'label': jnp.zeros(8, jnp.int32)}, True)
  # Pixels inside the image become (1 − 0.5)/0.5 = 1, padding filled with 0 becomes −1.
  values = set(np.unique(np.asarray(out['input'])).tolist())
  assert values <= {1.0, -1.0} and -1.0 in values


def test_normalisation_options_are_checked():
  meta = {'features': ('image', 'label'), 'num_classes': 3}
  message = one_sentence(lambda: tasks.build('classification', meta, input_mean=(0.5, 0.5),
                                               input_std=(0.5,)))
  assert 'input_mean' in message and 'input_std' in message
  assert 'positive' in one_sentence(lambda: tasks.build('classification', meta, input_mean=(0.5,),
                                                         input_std=(0.0,)))
  task = tasks.build('classification', meta, input_mean=(0.5, 0.5, 0.5), input_std=(1.0, 1.0, 1.0))
  batch = {'input': jnp.zeros((2, 4, 4, 1)), 'label': jnp.zeros(2, jnp.int32)}
  message = one_sentence(lambda: task.transform({}, batch, False))
  assert '3 values' in message and '1 channels' in message


@pytest.mark.parametrize('scale', [0.0, -1.0, float('nan'), float('inf'), True])
def test_classification_refuses_an_input_scale_that_is_not_a_finite_positive_number(scale):
  # NaN trained to a NaN loss, and 0 on blank inputs, without a word.
  message = one_sentence(lambda: tasks.build('classification', {'num_classes': 3},
                                             input_scale=scale))
  assert f'task.input_scale must be a finite positive number, got {scale!r}' in message
  # A NumPy scalar is a number like any other.
  task = tasks.build('classification', {'num_classes': 3}, input_scale=np.float32(0.5))
  np.testing.assert_allclose(task.preprocess({'image': np.array([[2]]), 'label': np.array([0])})[
      'input'], [[1.0]])


def test_classification_scales_the_input_and_scores_soft_labels_by_their_heaviest_class():
  task = tasks.build('classification', {'num_classes': 3}, input_key='pixels', input_scale=1 / 255)
  batch = task.preprocess({'pixels': np.array([[0, 51, 255]], np.uint8), 'label': np.array([2])})
  assert batch['input'].dtype == np.float32 and batch['label'].dtype == np.int32
  np.testing.assert_allclose(batch['input'], [[0.0, 0.2, 1.0]], rtol=1e-6)
  # Mixed labels (after mixup or cutmix): the loss is −Σ_c y_c log softmax(z)_c, and a guess is
  # right when it is the class of largest weight (here rows 0 and 1, not row 2).
  labels = np.array([[0.7, 0.3, 0.0], [0.2, 0.2, 0.6], [0.4, 0.6, 0.0]], np.float32)
  logits = np.array([[2.0, 1.0, 0.0], [0.0, 0.5, 1.0], [3.0, 0.0, 1.0]], np.float32)
  metrics = task.loss(_Fixed(jnp.asarray(logits)), {'input': np.zeros((3, 3), np.float32),
                                                    'label': labels})
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(metrics['loss'][0], -(labels * log_probs).sum(-1), rtol=1e-6)
  np.testing.assert_array_equal(metrics['accuracy'][0], [1.0, 1.0, 0.0])


def test_language_model_reads_all_but_the_last_token_and_predicts_each_next_one():
  # A 'model' that always predicts the token after the one it reads (id + 1): every guess is
  # right exactly when it reads tokens[:, :-1] and is scored against tokens[:, 1:].
  task = _lm(tokenizers.CharTokenizer(list('abcde')), sample_length=0)
  seen = []

  def next_id(inputs_BxT):
    seen.append(np.asarray(inputs_BxT))
    return 2.0 * jax.nn.one_hot(inputs_BxT + 1, 5)

  tokens = np.array([[0, 1, 2, 3], [1, 2, 3, 4]], np.int32)
  metrics = task.loss(next_id, {'tokens': tokens, 'weights': np.ones((2, 3), np.float32)})
  np.testing.assert_array_equal(seen[0], tokens[:, :-1])
  totals = {name: (float(np.sum(t)), float(np.sum(w))) for name, (t, w) in metrics.items()}
  assert totals['accuracy'] == (6.0, 6.0)
  # −log softmax at the predicted id: log(e² + 4) − 2 per target.
  np.testing.assert_allclose(totals['loss'], (6 * (math.log(math.exp(2) + 4) - 2), 6.0),
                             rtol=1e-5)


def test_classification_label_smoothing_applies_to_hard_and_soft_labels():
  # ε = 0.2 over C = 4 classes: the target is 0.8·y + 0.05, so the loss is
  # −Σ_c (0.8 y_c + 0.05) log softmax(z)_c.
  task = tasks.build('classification', {'num_classes': 4}, label_smoothing=0.2)
  logits = np.array([[2.0, -1.0, 0.5, 0.0], [0.0, 3.0, -2.0, 1.0]], np.float32)
  z = logits.astype(np.float64)
  log_q = z - np.log(np.exp(z).sum(-1, keepdims=True))
  inputs = np.zeros((2, 4), np.float32)
  hard = task.loss(_Fixed(jnp.asarray(logits)), {'input': inputs, 'label': np.array([2, 1])})
  np.testing.assert_allclose(hard['loss'][0],
                             -(0.8 * log_q[[0, 1], [2, 1]] + 0.05 * log_q.sum(-1)), rtol=1e-5)
  soft_labels = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], np.float32)
  soft = task.loss(_Fixed(jnp.asarray(logits)), {'input': inputs, 'label': soft_labels})
  np.testing.assert_allclose(soft['loss'][0], -((0.8 * soft_labels + 0.05) * log_q).sum(-1),
                             rtol=1e-5)
  # Accuracy is unaffected: the argmax of row 0 is class 0 (a heaviest class of the soft
  # label by the first index), of row 1 class 1.
  np.testing.assert_array_equal(hard['accuracy'][0], [0.0, 1.0])


def test_augmentation_changes_training_batches_only():
  task = tasks.build('classification', {'features': ('image', 'label'), 'num_classes': 3},
                     augment=({'name': 'random_crop', 'padding': 1, 'p': 1.0},))
  images = np.ones((8, 4, 4, 1), np.float32)
  batch = {'input': jnp.asarray(images), 'label': jnp.arange(8) % 3}
  rngs = {'augment': jax.random.PRNGKey(0)}
  evaluated = task.transform(rngs, batch, False)
  np.testing.assert_array_equal(evaluated['input'], images)
  np.testing.assert_array_equal(evaluated['label'], np.arange(8) % 3)
  trained = task.transform(rngs, batch, True)
  # Crops of the zero-padded images show padding; the labels become one-hot rows.
  assert (np.asarray(trained['input']) == 0).any()
  np.testing.assert_array_equal(trained['label'], np.eye(3)[np.arange(8) % 3])


@pytest.mark.parametrize('options', [{'temperature': 0.0}, {'top_k': 1}, {'top_p': 1e-6}])
def test_language_model_sample_hook_continues_the_prompt_with_the_sampling_options(options):
  # Each option alone makes sampling greedy: every sample is the argmax continuation of the
  # prompt, computed here by rerunning the model on the whole prefix at each step.
  from tests.train.test_sampling import TinyCausalLM  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.CharTokenizer(list('abcdefghijk'))  # the model's 11 ids
  task = _lm(tokenizer, prompt='cab', sample_length=4, num_samples=2, **options)
  model = TinyCausalLM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  tokens = np.array([tokenizer.encode('cab')], np.int32)
  for _ in range(4):
    logits = model.apply(variables, jnp.asarray(tokens))[:, -1]
    tokens = np.concatenate([tokens, np.argmax(np.asarray(logits), -1)[:, None]], 1)
  expected = tokenizer.decode(tokens[0].tolist())
  assert expected.startswith('cab') and len(expected) == 7
  (hook,) = task.eval_hooks()
  out = hook(tasks.HookContext(model, variables, jax.random.PRNGKey(1), 0))
  assert out == {'sample': expected + '\n----\n' + expected}
  assert _lm(tokenizer, sample_length=0).eval_hooks() == []


def test_normalisation_needs_one_value_or_one_per_channel():
  # Two means for three channels are neither one value for all nor one per channel: one
  # sentence, not a broadcasting error from inside the transform.
  task = tasks.build('classification', {'features': ('image', 'label'), 'num_classes': 3},
                     input_mean=(0.5, 0.5), input_std=(1.0, 1.0))
  batch = {'input': jnp.zeros((2, 4, 4, 3)), 'label': jnp.zeros(2, jnp.int32)}
  one_sentence(lambda: task.transform({}, batch, False), '2 values', '3 channels')
  task = tasks.build('classification', {'features': ('image', 'label'), 'num_classes': 3},
                     input_mean=(0.5,), input_std=(0.25,))
  out = task.transform({}, {**batch, 'input': jnp.ones((2, 4, 4, 3))}, False)
  np.testing.assert_allclose(out['input'], np.full((2, 4, 4, 3), 2.0))
