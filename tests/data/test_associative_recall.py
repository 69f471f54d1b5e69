"""The generated `associative_recall` data set against a reading of its own.

Records are read back token by token with the vocabulary written out here
(pair tokens k0:v0 … k31:v7, query keys, values, fillers, ?), each answer is found by scanning the pairs for the
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
from tests.messages import assert_one_sentence
from train import tasks

SIZES = {'train': 20_000, 'validation': 500, 'test': 1_000}
LENGTH = 64  # T: 32 positions with 16 pairs and 16 fillers, a marker, 16 queries and answers
PAIRS, PREFIX = 16, 32
VOCAB = ([f'k{a}:v{b}' for a in range(32) for b in range(8)] + [f'k{a}' for a in range(32)] +
         [f'v{b}' for b in range(8)] + [f'f{c}' for c in range(16)] + ['?'])
MARKER = VOCAB.index('?')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('recall')


@pytest.fixture(scope='module')
def prepared(data_dir):
  """split -> the arrays of its records at length 64."""
  return {split: pipeline.InMemorySource(datasets.load('associative_recall', split,
                                                       data_dir=data_dir, length=LENGTH)).arrays
          for split in SIZES}


def read(tokens) -> tuple[dict[str, tuple[str, int]], list[tuple[str, str, int]]]:
  """({key: (value, position)} of the pair tokens, [(query key, answer, position)]) of a
  record, read as words, checking its layout."""
  words = [VOCAB[int(t)] for t in tokens]
  prefix, marker, queries = words[:-2 * PAIRS - 1], words[-2 * PAIRS - 1], words[-2 * PAIRS:]
  assert marker == '?' and len(prefix) == len(tokens) - 1 - 2 * PAIRS, words
  pairs = {}
  for position, word in enumerate(prefix):
    if ':' in word:
      key, value = word.split(':')
      assert key not in pairs, f'key {key} paired twice in {words}'
      pairs[key] = (value, position)
    else:
      assert word[0] == 'f', words
  asked = []
  for j in range(PAIRS):
    key, answer = queries[2 * j], queries[2 * j + 1]
    assert key[0] == 'k' and ':' not in key and answer[0] == 'v', words
    asked.append((key, answer, len(prefix) + 1 + 2 * j))
  return pairs, asked


def reference_draw(split: str, index: int, length: int) -> list[int]:
  """Draw `index` of `split` by the module docstring's recipe, in plain Python."""
  n = length - 2 * PAIRS
  stream = hashlib.shake_256(f'0:{split}:{index}'.encode()).digest(
      4 * 32 + PAIRS + 4 * n + n + 4 * PAIRS)
  numbers = lambda start, count: [int.from_bytes(stream[start + 4 * i:start + 4 * i + 4], 'big')
                                  for i in range(count)]
  by_number = lambda values: sorted(range(len(values)), key=lambda i: (values[i], i))
  keys = by_number(numbers(0, 32))[:PAIRS]
  values = [b % 8 for b in stream[128:128 + PAIRS]]
  positions = sorted(by_number(numbers(128 + PAIRS, n))[:PAIRS])
  fillers = stream[128 + PAIRS + 4 * n:128 + PAIRS + 5 * n]
  ranks = by_number(numbers(128 + PAIRS + 5 * n, PAIRS))  # ranks[r] is the pair asked r-th
  words = [f'f{b % 16}' for b in fillers]
  for key, value, position in zip(keys, values, positions):
    words[position] = f'k{key}:v{value}'
  words.append('?')
  for j in ranks:
    words += [f'k{keys[j]}', f'v{values[j]}']
  return [VOCAB.index(word) for word in words]


def test_tokenizer_reads_and_writes_the_readable_form():
  tokenizer = associative_recall.Tokenizer()
  assert tokenizer.vocab == VOCAB and tokenizer.vocab_size == 313
  ids = tokenizer.encode('f3 k12:v7 k31:v0 ? k12 v7')
  assert ids == [299, 103, 248, 312, 268, 295]
  assert tokenizer.decode(ids) == 'f3 k12:v7 k31:v0 ? k12 v7'
  for text, part in (('k12 x3', "'x3'"), ('k32', "'k32'"), ('\n', 'no')):
    with pytest.raises(ValueError) as error:
      tokenizer.encode(text)
    assert_one_sentence(str(error.value), part)


def test_split_sizes_and_record_layout(prepared):
  assert {split: len(arrays['tokens']) for split, arrays in prepared.items()} == SIZES
  for arrays in prepared.values():
    assert arrays['tokens'].dtype == np.int16 and arrays['tokens'].shape[1:] == (LENGTH + 1,)
    assert arrays['weights'].dtype == np.uint8 and arrays['weights'].shape[1:] == (LENGTH,)
    # The predictions at the 16 query keys, of their answers, are the only ones scored.
    scored = np.flatnonzero(arrays['weights'][0])
    np.testing.assert_array_equal(scored, PREFIX + 1 + 2 * np.arange(PAIRS))
    assert np.all(arrays['weights'] == arrays['weights'][0])


def test_each_answer_is_the_value_paired_with_its_query_key(prepared):
  for arrays in prepared.values():
    for tokens, distance in zip(arrays['tokens'][:200], arrays['distance'][:200]):
      pairs, asked = read(tokens)
      assert len(pairs) == PAIRS and sorted(key for key, _, _ in asked) == sorted(pairs)
      for (key, answer, position), d in zip(asked, distance):
        value, pair_position = pairs[key]
        assert answer == value and d == position - pair_position, (VOCAB[int(t)] for t in tokens)


def test_positions_keys_and_values_are_uniform(prepared):
  tokens = prepared['train']['tokens'][:, :PREFIX]
  is_pair = tokens < 256
  # Each of the 32 positions holds a pair with probability 1/2: sd = sqrt(n/4) ≈ 71.
  per_position = is_pair.sum(0)
  assert np.all(np.abs(per_position - SIZES['train'] / 2) < 5 * 71), per_position
  pair_tokens = tokens[is_pair]  # k{a}:v{b} is 8a + b
  assert sorted(set(pair_tokens.tolist())) == list(range(256))  # every key with every value
  # A record's 16 keys are 16 of the 32, so each key is in a record with probability 1/2
  # (sd sqrt(n/4) ≈ 71); each of the 320,000 pairs' values is one of 8 (sd ≈ 187).
  key_counts = np.bincount(pair_tokens // 8, minlength=32)
  assert np.all(np.abs(key_counts - SIZES['train'] / 2) < 5 * 71), key_counts
  value_counts = np.bincount(pair_tokens % 8, minlength=8)
  n_pairs = SIZES['train'] * PAIRS
  assert len(pair_tokens) == n_pairs
  assert np.all(np.abs(value_counts - n_pairs / 8) < 5 * np.sqrt(n_pairs * 7 / 64)), value_counts
  fillers = collections.Counter(tokens[~is_pair].tolist())
  assert sorted(fillers) == list(range(296, 312))


def test_records_are_the_documented_draws(prepared):
  for split in SIZES:
    for i in range(3):
      assert prepared[split]['tokens'][i].tolist() == reference_draw(split, i, LENGTH), (split, i)
  # At the experiment's length too.
  assert associative_recall.draw('test', 5, 2048).tolist() == reference_draw('test', 5, 2048)


def test_records_are_their_draws_made_alone(prepared):
  # No held-out record repeats at this length, so record i of a split is draw i of its stream:
  # generating is a function of (split, i) alone, the same on every machine and run.
  rng = np.random.default_rng(0)
  for split in SIZES:
    for i in rng.choice(SIZES[split], 20, replace=False):
      np.testing.assert_array_equal(prepared[split]['tokens'][i],
                                    associative_recall.draw(split, int(i), LENGTH))


def test_held_out_records_are_distinct_and_never_in_train(prepared):
  seen = {split: {row.tobytes() for row in arrays['tokens']} for split, arrays in prepared.items()}
  assert len(seen['validation']) == SIZES['validation'] and len(seen['test']) == SIZES['test']
  assert not seen['train'] & (seen['validation'] | seen['test'])
  assert not seen['validation'] & seen['test']


def test_a_draw_repeating_a_held_out_record_is_skipped(monkeypatch):
  # Draws whose first token is a hand-picked label, so records repeat; worked out by hand:
  # validation keeps 0, 1 (its second 0 skipped); test skips 1 and 0 (held out), keeps 2, 3;
  # train skips 3, 0 and 2, and keeps its own repeat of 4.
  streams = {'validation': [0, 0, 1], 'test': [1, 2, 0, 3], 'train': [3, 4, 4, 0, 5, 2, 6]}
  monkeypatch.setattr(associative_recall, 'SPLIT_SIZES', {'train': 4, 'validation': 2, 'test': 2})
  monkeypatch.setattr(associative_recall, 'draw', lambda split, index, length: np.full(
      length + 1, streams[split][index], np.int16))
  records = associative_recall.generate(LENGTH)
  assert {split: rows[:, 0].tolist() for split, rows in records.items()} == {
      'validation': [0, 1], 'test': [2, 3], 'train': [4, 4, 5, 6]}


def test_ties_between_sort_numbers_go_to_the_lower_index():
  numbers = np.frombuffer(np.random.default_rng(0).integers(0, 4, 200).astype('>u4').tobytes(),
                          '>u4')  # many ties
  expected = sorted(range(200), key=lambda i: (numbers[i], i))[:100]
  assert associative_recall._smallest(numbers, 100).tolist() == expected


@pytest.mark.parametrize('length', [63, 96, 32, 0, 32768, '64', 64.0, True])
def test_a_length_no_example_can_have_is_refused(length, tmp_path):
  with pytest.raises(ValueError) as error:
    datasets.load('associative_recall', 'train', data_dir=tmp_path, length=length)
  assert_one_sentence(str(error.value), repr(length), 'power of two from 64 to 16384')
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
  assert meta['model_defaults'] == {'vocab_size': 313} and meta['window'] == LENGTH
  assert meta['unit'] == 'token' and meta['tokenizer'].vocab == VOCAB
  assert 'workdir_files' not in meta  # the vocabulary is the data set's, nothing to keep
  # How often each id occurs in the train split's records (not validation's), counted by hand.
  counted = collections.Counter(prepared['train']['tokens'].ravel().tolist())
  assert meta['token_counts'].tolist() == [counted[i] for i in range(313)]
  task = tasks.build('language_model', meta, sample_length=0)
  batch = task.preprocess(pipeline.read_batch(train, np.arange(5)))
  assert batch['tokens'].shape == (5, LENGTH + 1) and batch['tokens'].dtype == np.int32
  assert batch['weights'].shape == (5, LENGTH) and batch['weights'].dtype == np.float32
  inputs_BxT, = task.model_inputs(batch)
  assert inputs_BxT.shape == (5, LENGTH)
  # Logits for the scanned answers at the query keys only (a wrong token elsewhere), and
  # for every target but those: accuracy and loss must see the answers alone.
  at_query_BxT = np.zeros((5, LENGTH), bool)
  answers_BxT = np.full((5, LENGTH), MARKER)
  for b, tokens in enumerate(batch['tokens']):
    for _, answer, position in read(tokens)[1]:
      at_query_BxT[b, position] = True
      answers_BxT[b, position] = VOCAB.index(answer)
  only_answers_BxT = answers_BxT
  all_but_answers_BxT = np.where(at_query_BxT, MARKER, batch['tokens'][:, 1:])

  def report(predicted_BxT):
    model = lambda tokens_BxT: 30.0 * np.eye(313, dtype=np.float32)[predicted_BxT]
    metrics = task.loss(model, batch)
    return task.finalize({name: (float(np.sum(total)), float(np.sum(weight)))
                          for name, (total, weight) in metrics.items()})
  right, wrong = report(only_answers_BxT), report(all_but_answers_BxT)
  assert right['accuracy'] == 1 and right['loss'] < 1e-6
  assert wrong['accuracy'] == 0 and wrong['loss'] > 25
  assert right['bits_per_token'] == pytest.approx(right['loss'] / np.log(2))


def test_data_config_mistakes_are_refused(data_dir, prepared, tmp_path):
  for overrides, parts in (({'window': 32}, ['64', '32', 'data.window']),
                           ({'window': 64.0}, ['64.0', 'data.window']),
                           ({'vocab_size': 313}, ['data.vocab_size', '313']),
                           ({'name': 'digits', 'options': {}}, ["'digits'", 'char']),
                           ({'tokenizer': 'datset'}, ["'datset'", "'dataset'"])):
    with pytest.raises(ValueError) as error:
      inputs.make_sources(_data_config(data_dir, **overrides), str(tmp_path))
    assert_one_sentence(str(error.value), *parts)
