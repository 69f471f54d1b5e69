"""The generated `associative_recall` data set against a reading of its own.

Records are read back token by token with the vocabulary written out here
(k0 … k2047, v0 … v63, ?), each answer is found by scanning the pairs for the
query key, and the first draws of each split are recomputed from the
docstring's recipe (SHAKE-256 bytes, sorted with Python's `sorted`), never
with the generator's code.
"""

import collections
import hashlib

import ml_collections
import numpy as np
import pytest

from data import datasets
from data import inputs
from data import pipeline
from data.builders import associative_recall
from tests.data.test_datasets import assert_one_sentence
from train import tasks

SIZES = {'train': 20_000, 'validation': 500, 'test': 1_000}
LENGTH = 16  # T: 7 pairs, a marker, a query key and its value = 17 tokens
PAIRS = 7
VOCAB = [f'k{i}' for i in range(2048)] + [f'v{i}' for i in range(64)] + ['?']
KEYS, VALUES, MARKER = range(0, 2048), range(2048, 2112), 2112


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('recall')


@pytest.fixture(scope='module')
def prepared(data_dir):
  """split -> the arrays of its records at length 16."""
  return {split: pipeline.InMemorySource(datasets.load('associative_recall', split,
                                                       data_dir=data_dir, length=LENGTH)).arrays
          for split in SIZES}


def read(tokens) -> tuple[list[tuple[int, int]], int, int]:
  """(pairs as (key, value) ids, query key, answer) of a record, checking its layout."""
  tokens = [int(t) for t in tokens]
  *body, marker, query, answer = tokens
  assert marker == MARKER and query in KEYS and answer in VALUES, tokens
  pairs = list(zip(body[0::2], body[1::2]))
  assert len(body) % 2 == 0 and all(k in KEYS and v in VALUES for k, v in pairs), tokens
  return pairs, query, answer


def reference_draw(split: str, index: int, length: int) -> list[int]:
  """Draw `index` of `split` by the module docstring's recipe, in plain Python."""
  pairs = (length - 2) // 2
  stream = hashlib.shake_256(f'0:{split}:{index}'.encode()).digest(4 * 2048 + pairs + 8)
  numbers = [int.from_bytes(stream[4 * j:4 * j + 4], 'big') for j in range(2048)]
  keys = sorted(range(2048), key=lambda j: (numbers[j], j))[:pairs]
  values = [2048 + b % 64 for b in stream[4 * 2048:4 * 2048 + pairs]]
  q = int.from_bytes(stream[-8:], 'big') % pairs
  return [t for pair in zip(keys, values) for t in pair] + [MARKER, keys[q], values[q]]


def test_tokenizer_reads_and_writes_the_readable_form():
  tokenizer = associative_recall.Tokenizer()
  assert tokenizer.vocab == VOCAB and tokenizer.vocab_size == 2113
  ids = tokenizer.encode('k12 v7 k2047 v63 ? k12 v7')
  assert ids == [12, 2055, 2047, 2111, 2112, 12, 2055]
  assert tokenizer.decode(ids) == 'k12 v7 k2047 v63 ? k12 v7'
  for text, part in (('k12 x3', "'x3'"), ('k2048', "'k2048'"), ('\n', 'no')):
    with pytest.raises(ValueError) as error:
      tokenizer.encode(text)
    assert_one_sentence(str(error.value), part)


def test_split_sizes_and_record_layout(prepared):
  assert {split: len(arrays['tokens']) for split, arrays in prepared.items()} == SIZES
  for arrays in prepared.values():
    assert arrays['tokens'].dtype == np.int16 and arrays['tokens'].shape[1:] == (LENGTH + 1,)
    assert arrays['weights'].dtype == np.uint8 and arrays['weights'].shape[1:] == (LENGTH,)
    # The prediction at the query key, of the last token, is the only one scored.
    assert np.all(arrays['weights'][:, :-1] == 0) and np.all(arrays['weights'][:, -1] == 1)


def test_each_answer_is_the_value_paired_with_the_query_key(prepared):
  for arrays in prepared.values():
    for tokens, distance in zip(arrays['tokens'], arrays['distance']):
      pairs, query, answer = read(tokens)
      assert len(pairs) == PAIRS
      keys = [k for k, _ in pairs]
      assert len(set(keys)) == PAIRS, f'repeated key in {tokens}'
      matches = [i for i, (k, _) in enumerate(pairs) if k == query]
      assert len(matches) == 1 and pairs[matches[0]][1] == answer, tokens
      value_position, query_position = 2 * matches[0] + 1, len(tokens) - 2
      assert distance == query_position - value_position


def test_query_pairs_and_values_are_uniform(prepared):
  distances = collections.Counter(prepared['train']['distance'].tolist())
  assert sorted(distances) == list(range(2, 2 * PAIRS + 1, 2))
  expected = SIZES['train'] / PAIRS  # sd = sqrt(n p (1 - p)) ≈ 49
  assert all(abs(count - expected) < 250 for count in distances.values()), distances
  values = collections.Counter(prepared['train']['tokens'][:, 1:-3:2].ravel().tolist())
  assert sorted(values) == list(VALUES)


def test_records_are_the_documented_draws(prepared):
  for split in SIZES:
    for i in range(3):
      assert prepared[split]['tokens'][i].tolist() == reference_draw(split, i, LENGTH), (split, i)
  # At the experiment's length too (1,023 pairs), where most keys take part.
  assert associative_recall.draw('test', 5, 2048).tolist() == reference_draw('test', 5, 2048)


def test_generating_again_gives_the_same_records(prepared):
  again = associative_recall.generate(LENGTH)
  for split in SIZES:
    np.testing.assert_array_equal(again[split], prepared[split]['tokens'])


def test_held_out_records_are_distinct_and_never_in_train():
  # At T = 4 there are 2048 * 64 possible examples, so draws do collide.
  records = associative_recall.generate(4)
  seen = {split: [row.tobytes() for row in rows] for split, rows in records.items()}
  held_out = seen['validation'] + seen['test']
  assert len(set(held_out)) == len(held_out)
  assert not set(seen['train']) & set(held_out)
  assert len(set(seen['train'])) < len(seen['train'])  # train may repeat itself
  for rows in records.values():
    for tokens in rows:
      pairs, query, answer = read(tokens)
      assert pairs == [(query, answer)]


@pytest.mark.parametrize('length', [63, 2, 0, -4, 4100, '64', 64.0, True])
def test_a_length_no_example_can_have_is_refused(length, tmp_path):
  with pytest.raises(ValueError) as error:
    datasets.load('associative_recall', 'train', data_dir=tmp_path, length=length)
  assert_one_sentence(str(error.value), repr(length), 'even integer from 4 to 4098')
  assert not any(tmp_path.iterdir())


def test_an_unknown_option_is_refused(tmp_path):
  with pytest.raises(TypeError) as error:
    datasets.load('associative_recall', 'train', data_dir=tmp_path, pairs=7)
  assert_one_sentence(str(error.value), "'pairs'", 'length')


def _data_config(data_dir, **overrides):
  return ml_collections.ConfigDict({
      'name': 'associative_recall', 'train_split': 'train', 'eval_split': 'validation',
      'data_dir': str(data_dir), 'options': {'length': LENGTH}, 'tokenizer': 'dataset',
      'vocab_size': None, 'window': None, **overrides})


def test_batches_reach_the_language_model_task(data_dir, prepared, tmp_path):
  train, evaluation, meta = inputs.make_sources(_data_config(data_dir), str(tmp_path / 'work'))
  assert (len(train), len(evaluation)) == (SIZES['train'], SIZES['validation'])
  assert meta['model_defaults'] == {'vocab_size': 2113} and meta['window'] == LENGTH
  assert meta['unit'] == 'token' and meta['tokenizer'].vocab == VOCAB
  assert 'workdir_files' not in meta  # the vocabulary is the data set's, nothing to keep
  task = tasks.build('language_model', meta, sample_length=0)
  batch = task.preprocess(pipeline.read_batch(train, np.arange(5)))
  assert batch['tokens'].shape == (5, LENGTH + 1) and batch['tokens'].dtype == np.int32
  assert batch['weights'].shape == (5, LENGTH) and batch['weights'].dtype == np.float32
  inputs_BxT, = task.model_inputs(batch)
  assert inputs_BxT.shape == (5, LENGTH)
  # Logits for the scanned answers at the query key only (a wrong token elsewhere), and
  # for every target but those: accuracy and loss must see the answers alone.
  answers_B = np.array([read(tokens)[2] for tokens in batch['tokens']])
  at_query_T = np.arange(LENGTH) == LENGTH - 1
  only_answers_BxT = np.where(at_query_T, answers_B[:, None], MARKER)
  all_but_answers_BxT = np.where(at_query_T, MARKER, batch['tokens'][:, 1:])

  def report(predicted_BxT):
    model = lambda tokens_BxT: 30.0 * np.eye(2113, dtype=np.float32)[predicted_BxT]
    metrics = task.loss(model, batch)
    return task.finalize({name: (float(np.sum(total)), float(np.sum(weight)))
                          for name, (total, weight) in metrics.items()})
  right, wrong = report(only_answers_BxT), report(all_but_answers_BxT)
  assert right['accuracy'] == 1 and right['loss'] < 1e-6
  assert wrong['accuracy'] == 0 and wrong['loss'] > 25
  assert right['bits_per_token'] == pytest.approx(right['loss'] / np.log(2))


def test_data_config_mistakes_are_refused(data_dir, prepared, tmp_path):
  for overrides, parts in (({'window': 32}, ['16', '32', 'data.window']),
                           ({'vocab_size': 2113}, ['data.vocab_size', '2113']),
                           ({'name': 'digits', 'options': {}}, ["'digits'", 'char']),
                           ({'tokenizer': 'datset'}, ["'datset'", "'dataset'"])):
    with pytest.raises(ValueError) as error:
      inputs.make_sources(_data_config(data_dir, **overrides), str(tmp_path))
    assert_one_sentence(str(error.value), *parts)
