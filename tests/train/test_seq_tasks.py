"""The tagging and sequence-to-sequence tasks: targets, weights, F1 and exact match."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as sk_metrics

from models.sequence.rnn_models import BOS_ID, EOS_ID, PAD_ID
from train import tasks
from train.tasks import seq2seq as seq2seq_lib


def _bound(module, variables):
  return tasks.BoundModel(module, variables['params'], {}, {}, train=False, axis_name=None)


def _nll(logits_NxK, labels_N):
  """−log softmax(logits)[label] per row, in float64."""
  logits_NxK = np.asarray(logits_NxK, np.float64)
  top_N = logits_NxK.max(-1)
  log_z_N = top_N + np.log(np.exp(logits_NxK - top_N[:, None]).sum(-1))
  return log_z_N - logits_NxK[np.arange(len(labels_N)), labels_N]


def test_targets_are_shifted_by_one_with_bos_and_eos():
  texts = np.zeros((2, 4), np.uint8)
  texts[0, :3] = np.frombuffer(b'abc', np.uint8)
  texts[1, :1] = np.frombuffer(b'z', np.uint8)
  inputs, targets, weights = seq2seq_lib.encode_targets(texts, np.array([3, 1]), 4)
  a, b, c, z = (ord(ch) for ch in 'abcz')
  np.testing.assert_array_equal(inputs, [[BOS_ID, a, b, c, PAD_ID], [BOS_ID, z, 0, 0, 0]])
  np.testing.assert_array_equal(targets, [[a, b, c, EOS_ID, PAD_ID], [z, EOS_ID, 0, 0, 0]])
  np.testing.assert_array_equal(weights, [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
  assert seq2seq_lib.decode_text(targets[0]) == 'abc'
  # BOS and padding are dropped, the text stops at the first EOS, other ids show as '?'.
  assert seq2seq_lib.decode_text([BOS_ID, a, PAD_ID, 127, b, EOS_ID, c]) == 'a?b'


class _Oracle(nn.Module):
  """Position t predicts table[:, t] (the table rides in as the 'source' input)."""

  @nn.compact
  def __call__(self, tokens_BxT, table_BxN, *, train=False):
    del train
    self.param('unused', nn.initializers.zeros, ())
    table_BxN = table_BxN.astype(jnp.int32)
    steps, width = tokens_BxT.shape[1], table_BxN.shape[1]
    table_BxT = jnp.pad(table_BxN, ((0, 0), (0, max(0, steps - width))))[:, :steps]
    return 10.0 * jax.nn.one_hot(table_BxT, 128)


def test_exact_match_is_greedy_decoding_equal_up_to_eos():
  task = tasks.build('seq2seq', {'features': ('source', 'target', 'target_length')},
                     source_length_key='', max_target_length=4)
  texts = [b'abc', b'abc', b'abc', b'ab']
  target = np.zeros((4, 4), np.uint8)
  for row, text in enumerate(texts):
    target[row, :len(text)] = np.frombuffer(text, np.uint8)
  a, b, c, d = (ord(ch) for ch in 'abcd')
  decoded = np.array([[a, b, c, EOS_ID, d],       # right, garbage after EOS: a match
                      [a, b, d, EOS_ID, 0],       # one wrong character
                      [a, b, c, d, EOS_ID],       # no EOS where it should be
                      [a, b, EOS_ID, EOS_ID, 0]],  # right
                     np.float32)
  batch = task.preprocess({'source': decoded, 'target': target,
                           'target_length': np.array([len(t) for t in texts])})
  module = _Oracle()
  variables = module.init(jax.random.PRNGKey(0), jnp.ones((4, 5), jnp.int32),
                          jnp.asarray(batch['source']))
  totals = task.eval_metrics(_bound(module, variables), jax.tree.map(jnp.asarray, batch))
  total, weight = (float(np.sum(x)) for x in totals['exact_match'])
  assert (total, weight) == (2.0, 4.0)
  # The teacher-forced accuracy counts the characters and EOS the oracle gets right.
  correct, positions = (float(np.sum(x)) for x in totals['accuracy'])
  assert (correct, positions) == (4 + 3 + 3 + 3, 4 + 4 + 4 + 3)
  # The loss is the mean NLL over the characters and EOS only: the oracle's logits at the padded
  # positions (d against PAD in row 0, EOS against PAD in row 3) count for nothing.
  logits = 10.0 * np.eye(128)[decoded.astype(int)]
  nll = [_nll(logits[row, :len(text) + 1], list(text) + [EOS_ID]) for row, text in enumerate(texts)]
  loss_total, loss_weight = (float(np.sum(x)) for x in totals['loss'])
  assert loss_total / loss_weight == pytest.approx(np.mean(np.concatenate(nll)), rel=1e-6)


def test_target_names_spell_the_label():
  task = tasks.build('seq2seq', {'features': ('image', 'label')}, source_key='image',
                     source_length_key='', source_scale=0.5, target_key='label',
                     target_length_key='', target_names=('zero', 'one'), max_target_length=4)
  batch = task.preprocess({'image': np.full((2, 2, 2), 4, np.uint8), 'label': np.array([1, 0])})
  np.testing.assert_array_equal(batch['source'], np.full((2, 2, 2), 2.0))
  assert seq2seq_lib.decode_text(batch['target'][0]) == 'one'
  assert seq2seq_lib.decode_text(batch['target'][1]) == 'zero'
  np.testing.assert_array_equal(batch['weights'].sum(1), [4, 5])
  with pytest.raises(ValueError, match='label 2'):
    task.preprocess({'image': np.zeros((1, 2, 2)), 'label': np.array([2])})


def test_target_names_of_another_class_count_are_refused_when_the_task_is_built():
  # Nine names for ten classes used to train until a batch first held the label 9.
  meta = {'features': ('image', 'label'), 'num_classes': 10}
  options = dict(source_key='image', source_length_key='', target_key='label',
                 target_length_key='', max_target_length=5)
  with pytest.raises(ValueError) as info:
    tasks.build('seq2seq', meta, target_names=tuple('abcdefghi'), **options)
  assert str(info.value) == ("task.target_names has 9 names, but the data set's 'label' has 10 "
                             'classes: give one name per class.')
  assert tasks.build('seq2seq', meta, target_names=tuple('abcdefghij'), **options).target_names


def test_target_names_must_be_nonempty_printable_ascii():
  # An empty name would train an EOS-only target, and DEL (127) is a token id past the 127
  # logits of the character codes; the printable ends, space (32) and '~' (126), are names.
  options = dict(source_key='image', source_length_key='', target_key='label',
                 target_length_key='', max_target_length=4)
  meta = {'features': ('image', 'label')}
  for name in ('', 'a\x7f', 'a\x1f'):
    with pytest.raises(ValueError) as info:
      tasks.build('seq2seq', meta, target_names=('ok', name), **options)
    assert str(info.value) == (f'task.target_names entry {name!r} must be 1 to '
                               'max_target_length=4 printable ASCII characters.')
  assert tasks.build('seq2seq', meta, target_names=(' ', '~~~~'), **options).target_names


def test_a_negative_label_has_no_target_name():
  # Label -1 would otherwise index the last name and train on it silently.
  task = tasks.build('seq2seq', {'features': ('image', 'label')}, source_key='image',
                     source_length_key='', target_key='label', target_length_key='',
                     target_names=('zero', 'one'), max_target_length=4)
  with pytest.raises(ValueError, match='has no entry in task.target_names'):
    task.preprocess({'image': np.zeros((2, 2, 2)), 'label': np.array([0, -1])})


class _CopyInput(nn.Module):
  """Position t predicts the decoder input it reads at t (the source is ignored)."""

  @nn.compact
  def __call__(self, tokens_BxT, source_BxS, *, train=False):
    del source_BxS, train
    self.param('unused', nn.initializers.zeros, ())
    return 10.0 * jax.nn.one_hot(tokens_BxT, 128)


def test_teacher_forcing_reads_bos_and_the_target_and_scores_the_target_then_eos():
  # Read BOS a b b / BOS a a against a b b EOS / a a EOS: a model copying its input is right
  # where the input equals the target, at (0, 2) and (1, 1) only, 2 of the 7 weighted steps.
  task = tasks.build('seq2seq', {'features': ('source', 'target', 'target_length')},
                     source_length_key='', max_target_length=4)
  target = np.zeros((2, 4), np.uint8)
  target[0, :3] = np.frombuffer(b'abb', np.uint8)
  target[1, :2] = np.frombuffer(b'aa', np.uint8)
  batch = task.preprocess({'source': np.zeros((2, 3)), 'target': target,
                           'target_length': np.array([3, 2])})
  module = _CopyInput()
  variables = module.init(jax.random.PRNGKey(0), batch['decoder_input'], batch['source'])
  totals = {name: (float(np.sum(t)), float(np.sum(w))) for name, (t, w) in task.loss(
      _bound(module, variables), jax.tree.map(jnp.asarray, batch)).items()}
  assert totals['accuracy'] == (2.0, 7.0)
  # −log softmax(10·onehot(input))[target] = log(e^10 + 127) − 10·[input = target].
  expected = 7 * np.log(np.exp(10.0) + 127) - 10 * 2
  np.testing.assert_allclose(totals['loss'], (expected, 7.0), rtol=1e-5)


def test_a_target_longer_than_max_target_length_is_one_sentence():
  task = tasks.build('seq2seq', {'features': ('source', 'target', 'target_length')},
                     source_length_key='', max_target_length=4)
  records = {'source': np.zeros((2, 3)), 'target': np.full((2, 5), ord('a'), np.uint8),
             'target_length': np.array([4, 5])}
  with pytest.raises(ValueError) as info:
    task.preprocess(records)
  assert str(info.value) == 'A target has 5 characters, more than task.max_target_length=4.'
  records['target_length'] = np.array([4, 4])  # the longest allowed
  np.testing.assert_array_equal(task.preprocess(records)['weights'], np.ones((2, 5)))


@pytest.mark.parametrize('options, message', [
    (dict(source_key='src'), "source_key='src'"),
    (dict(max_target_length=0), 'max_target_length'),
    (dict(target_key='label', target_length_key='', target_names=('toolongname',),
          max_target_length=4), 'toolongname'),
])
def test_seq2seq_option_errors(options, message):
  meta = {'features': ('source', 'source_length', 'target', 'target_length', 'label')}
  with pytest.raises(ValueError, match=message):
    tasks.build('seq2seq', meta, **options)


class _NarrowLogits(nn.Module):
  """Logits over the first 100 ids only, as a model with vocab_size=100 gives."""

  @nn.compact
  def __call__(self, tokens_BxT, source_BxS, lengths_B, *, train=False):
    del source_BxS, lengths_B, train
    return nn.Embed(100, 100)(jnp.minimum(tokens_BxT, 99))


def test_a_model_with_fewer_logits_than_character_codes_is_one_sentence():
  # 'z' (122) as a target of a 100-way output used to give a NaN loss at every step, each
  # step skipped, and no error.
  task = tasks.build('seq2seq', {'features': ('source', 'source_length', 'target',
                                              'target_length')}, max_target_length=3)
  batch = task.preprocess({'source': np.full((2, 4), ord('a'), np.uint8),
                           'source_length': np.array([4, 4]),
                           'target': np.full((2, 3), ord('z'), np.uint8),
                           'target_length': np.array([3, 2])})
  module = _NarrowLogits()
  variables = module.init(jax.random.PRNGKey(0), batch['decoder_input'], batch['source'],
                          batch['source_length'])
  with pytest.raises(ValueError) as info:
    task.loss(_bound(module, variables), jax.tree.map(jnp.asarray, batch))
  assert str(info.value) == (
      "The seq2seq task's tokens are character codes up to 126 (printable ASCII), but the model "
      'gives 100 logits; set model.vocab_size to at least 127.')


class _ZeroLogits(nn.Module):
  """Zero logits over `vocab_size` ids."""
  vocab_size: int

  @nn.compact
  def __call__(self, tokens_BxT, source_BxS, lengths_B, *, train=False):
    del source_BxS, lengths_B, train
    bias = self.param('bias', nn.initializers.zeros, (self.vocab_size,))
    return jnp.zeros(tokens_BxT.shape + (self.vocab_size,)) + bias


def test_a_model_needs_a_logit_for_every_character_code_up_to_126():
  # 126 logits (ids 0 … 125) leave '~' (126) without one; 127 is the smallest output size.
  task = tasks.build('seq2seq', {'features': ('source', 'source_length', 'target',
                                              'target_length')}, max_target_length=2)
  batch = jax.tree.map(jnp.asarray, task.preprocess({
      'source': np.full((1, 2), ord('a'), np.uint8), 'source_length': np.array([2]),
      'target': np.full((1, 2), ord('~'), np.uint8), 'target_length': np.array([2])}))
  for vocab_size, refused in ((126, True), (127, False)):
    module = _ZeroLogits(vocab_size)
    variables = module.init(jax.random.PRNGKey(0), batch['decoder_input'], batch['source'],
                            batch['source_length'])
    if refused:
      with pytest.raises(ValueError, match='gives 126 logits; set model.vocab_size to at least 127'):
        task.loss(_bound(module, variables), batch)
    else:
      metrics = task.loss(_bound(module, variables), batch)
      # Uniform logits: −log(1/127) at each of the 3 weighted steps.
      np.testing.assert_allclose(float(np.sum(metrics['loss'][0])), 3 * np.log(127), rtol=1e-6)


class _FixedLogits(nn.Module):
  """Returns the logits it is given as input (so a test chooses the predictions)."""

  @nn.compact
  def __call__(self, logits_BxTxK, lengths_B, *, train=False):
    del lengths_B, train
    self.param('unused', nn.initializers.zeros, ())
    return logits_BxTxK


@pytest.mark.parametrize('positive_tag', [1, 0, np.int64(1)])  # a NumPy integer is a tag too
def test_tagging_f1_over_batches_equals_sklearn_over_the_valid_steps(positive_tag):
  rng = np.random.default_rng(0)
  task = tasks.build('tagging', {'features': ('input', 'tags', 'length')}, positive_tag=positive_tag)
  module = _FixedLogits()
  sums = {}
  all_true, all_pred, all_nll = [], [], []
  for _ in range(3):  # three batches, summed like an evaluation over a split
    logits = rng.normal(size=(4, 6, 2)).astype(np.float32)
    tags = rng.integers(0, 2, size=(4, 6))
    lengths = rng.integers(1, 7, size=4)
    batch = task.preprocess({'input': logits, 'tags': tags, 'length': lengths})
    variables = module.init(jax.random.PRNGKey(0), batch['input'], batch['length'])
    metrics = task.eval_metrics(_bound(module, variables), jax.tree.map(jnp.asarray, batch))
    for name, (total, weight) in metrics.items():
      old = sums.get(name, (0.0, 0.0))
      sums[name] = (old[0] + float(np.sum(total)), old[1] + float(np.sum(weight)))
    for row, length in enumerate(lengths):
      all_true.extend(tags[row, :length])
      all_pred.extend(np.argmax(logits[row, :length], -1))
      all_nll.extend(_nll(logits[row, :length], tags[row, :length]))
  values = task.finalize(sums)
  # The loss is the mean NLL over the valid steps only, not over the padded ones too.
  assert values['loss'] == pytest.approx(np.mean(all_nll), rel=1e-6)
  assert values['f1'] == pytest.approx(
      sk_metrics.f1_score(all_true, all_pred, pos_label=positive_tag), abs=1e-6)
  assert values['accuracy'] == pytest.approx(sk_metrics.accuracy_score(all_true, all_pred),
                                             abs=1e-6)


def test_tagging_without_a_positive_tag_reports_no_f1():
  task = tasks.build('tagging', positive_tag=-1)
  module = _FixedLogits()
  batch = task.preprocess({'input': np.zeros((2, 3, 2), np.float32), 'tags': np.zeros((2, 3)),
                           'length': np.array([3, 2])})
  variables = module.init(jax.random.PRNGKey(0), batch['input'], batch['length'])
  assert set(task.eval_metrics(_bound(module, variables), batch)) == {'loss', 'accuracy'}


def test_tagging_rejects_tags_that_do_not_align_with_the_inputs():
  task = tasks.build('tagging')
  with pytest.raises(ValueError, match='one tag per input step'):
    task.preprocess({'input': np.zeros((2, 5), np.int32), 'tags': np.zeros((2, 4)),
                     'length': np.array([5, 5])})


def test_tagging_refuses_a_positive_tag_the_model_does_not_have():
  # positive_tag=2 of a two-tag model used to report an F1 of NaN, and -2 no F1 at all.
  task = tasks.build('tagging', positive_tag=2)
  module = _FixedLogits()
  batch = task.preprocess({'input': np.zeros((2, 3, 2), np.float32), 'tags': np.zeros((2, 3)),
                           'length': np.array([3, 2])})
  variables = module.init(jax.random.PRNGKey(0), batch['input'], batch['length'])
  with pytest.raises(ValueError) as info:
    task.eval_metrics(_bound(module, variables), batch)
  assert str(info.value) == ("task.positive_tag=2 is not one of the model's 2 tags (0 to 1); give "
                             'one of them, or -1 for no F1.')
  with pytest.raises(ValueError) as info:
    tasks.build('tagging', positive_tag=-2)
  assert str(info.value) == ('task.positive_tag must be a tag (an integer >= 0) or -1 for no F1, '
                             'got -2.')


@pytest.mark.parametrize('tag', [True, False, 1.0])
def test_tagging_positive_tag_must_be_an_integer_not_a_bool_or_float(tag):
  # True is an int to Python, but as a tag it is a config mistake, not tag 1.
  with pytest.raises(ValueError) as info:
    tasks.build('tagging', positive_tag=tag)
  assert str(info.value) == ('task.positive_tag must be a tag (an integer >= 0) or -1 for no F1, '
                             f'got {tag!r}.')
