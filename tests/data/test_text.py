"""Token windows, tokenizer files and text sources against brute-force references.

Windows are checked against slices of a stream whose token at position p is
p itself, so a window's first token names its offset; evaluation coverage is
checked by collecting every scored (position, token) pair over all windows.
"""

import json
import os
import types

import ml_collections
import numpy as np
import pytest

from data import pipeline
from data import text
from data import tokenizers
from tests.messages import assert_one_sentence
from tests.data.test_datasets import shared_folder

NON_ASCII = 'Naïve café — 東京 と 大阪 🙂 crème brûlée; the quick brown fox.\n' * 4


@pytest.fixture(autouse=True)
def no_outside_sources(monkeypatch):
  """Only the folders a test passes are seen, whatever this machine holds."""
  for var in ('JAXLAB_DATA_DIR', 'TINY_SHAKESPEARE_DIR'):
    monkeypatch.delenv(var, raising=False)


# TokenWindows


@pytest.mark.parametrize('n, length', [(20, 5), (7, 6), (12, 1)])
def test_training_windows_are_the_slices_at_every_offset(n, length):
  tokens = np.arange(n) * 3 + 1
  windows = text.TokenWindows(tokens, length, training=True)
  assert len(windows) == n - length
  for offset in range(n - length):
    record = windows[offset]
    np.testing.assert_array_equal(record['tokens'], tokens[offset:offset + length + 1])
    np.testing.assert_array_equal(record['weights'], np.ones(length))
    assert record['tokens'].dtype == np.int32 and record['weights'].dtype == np.float32
  with pytest.raises(IndexError):
    windows[n - length]


@pytest.mark.parametrize('n, length', [(21, 5), (20, 5), (16, 5), (2, 5), (9, 1), (30, 29)])
def test_eval_windows_score_every_target_exactly_once(n, length):
  tokens = np.arange(n) + 100  # no pad id among real tokens
  windows = text.TokenWindows(tokens, length, training=False)
  scored = []
  for i in range(len(windows)):
    record = windows[i]
    assert record['tokens'].shape == (length + 1,) and record['weights'].shape == (length,)
    offset = i * length
    for j in range(length):
      if record['weights'][j] == 1:
        scored.append((offset + 1 + j, int(record['tokens'][j + 1])))
        # The inputs up to the target are the text's own tokens.
        np.testing.assert_array_equal(record['tokens'][:j + 2], tokens[offset:offset + j + 2])
      else:
        assert record['weights'][j] == 0 and record['tokens'][j + 1] == text.PAD_ID
  assert sorted(scored) == [(p, int(tokens[p])) for p in range(1, n)]
  # Each token is among the first `length` of one window: offsets 0, length, ... below n.
  assert len(windows) == -(-n // length)


@pytest.mark.parametrize('training', [True, False])
def test_a_batch_is_the_windows_slices_of_the_text(training):
  tokens, length = np.random.default_rng(0).integers(0, 50, 36), 6
  windows = text.TokenWindows(tokens, length, training=training)
  # Repeats among them, and the last window (padded at evaluation: 35 targets, 6 windows of 6).
  indices = np.append(np.random.default_rng(1).integers(0, len(windows), 11), len(windows) - 1)
  batch = pipeline.read_batch(windows, indices)
  for row, i in enumerate(indices):
    start = i if training else i * length  # eval windows do not overlap
    piece = tokens[start:start + length + 1]
    np.testing.assert_array_equal(batch['tokens'][row, :len(piece)], piece)
    np.testing.assert_array_equal(batch['tokens'][row, len(piece):], text.PAD_ID)
    np.testing.assert_array_equal(batch['weights'][row], np.arange(length) < len(piece) - 1)


@pytest.mark.parametrize('training', [True, False])
def test_window_indices_outside_the_source_are_refused(training):
  windows = text.TokenWindows(np.arange(20), 5, training=training)  # 15 windows, or 4
  n = len(windows)
  assert n == (15 if training else 4)
  for indices in ([0, n], [-1]):
    with pytest.raises(IndexError):
      windows.gather(np.array(indices))
  with pytest.raises(IndexError):
    windows[-n - 1]
  # Negative indices count from the end, as for a list, down to -n, the first window.
  np.testing.assert_array_equal(windows[-1]['tokens'], windows[n - 1]['tokens'])
  np.testing.assert_array_equal(windows[-n]['tokens'], windows[0]['tokens'])


def test_windows_keep_token_ids_beyond_16_bits():
  # A GPT-2-sized vocabulary has ids up to 50,256.
  tokens = np.array([40_000, 70_000, 5, 50_256])
  for training in (True, False):
    np.testing.assert_array_equal(text.TokenWindows(tokens, 3, training=training)[0]['tokens'],
                                  tokens)


def test_text_shorter_than_a_window_is_refused():
  with pytest.raises(ValueError) as error:
    text.TokenWindows(np.arange(8), 8, training=True)
  assert_one_sentence(str(error.value), '8 tokens', 'length 8')
  with pytest.raises(ValueError) as error:
    text.TokenWindows(np.arange(1), 8, training=False)
  assert_one_sentence(str(error.value), '1 tokens', 'length 8')


def _offsets(iterator, count):
  return [next(iterator)['tokens'][:, 0].tolist() for _ in range(count)]


def test_train_iterator_visits_every_offset_per_epoch_and_resumes_exactly():
  windows = text.TokenWindows(np.arange(40), 5, training=True)  # 35 windows, 5 batches of 7
  make = lambda: pipeline.train_iterator(windows, global_batch_size=7, seed=4,
                                         preprocess=lambda batch: batch, num_threads=0)
  batches = _offsets(make(), 15)
  for epoch in range(3):
    assert sorted(sum(batches[5 * epoch:5 * epoch + 5], [])) == list(range(35))
  assert batches[:5] != batches[5:10]
  iterator = make()
  _offsets(iterator, 3)
  state = iterator.get_state()
  expected = _offsets(iterator, 6)  # crosses into the second epoch
  resumed = make()
  resumed.set_state(state)
  assert _offsets(resumed, 6) == expected == batches[3:9]


# Tokenizers


@pytest.mark.parametrize('kind, vocab_size', [('char', None), ('byte_bpe', 280)])
def test_saved_tokenizer_reloads_with_identical_encodings(tmp_path, monkeypatch, kind,
                                                          vocab_size):
  path = str(tmp_path / 'tokenizer.json')
  trained = text.load_or_train_tokenizer(path, kind, NON_ASCII, vocab_size=vocab_size)
  assert os.listdir(tmp_path) == ['tokenizer.json']
  with open(path, 'rb') as f:
    before = f.read()

  def no_training(*args, **kwargs):
    raise AssertionError('the saved tokenizer was retrained')

  monkeypatch.setattr(text, 'make_tokenizer', no_training)
  reloaded = text.load_or_train_tokenizer(path, kind, NON_ASCII, vocab_size=vocab_size)
  assert reloaded.vocab == trained.vocab
  assert reloaded.encode(NON_ASCII) == trained.encode(NON_ASCII)
  with open(path, 'rb') as f:
    assert f.read() == before


@pytest.mark.parametrize('kind, vocab_size', [('char', None), ('byte_bpe', 280)])
def test_tokenizer_trained_on_other_text_is_refused_and_kept(tmp_path, kind, vocab_size):
  path = str(tmp_path / 'tokenizer.json')
  text.load_or_train_tokenizer(path, kind, NON_ASCII, vocab_size=vocab_size)
  with open(path, 'rb') as f:
    before = f.read()
  with pytest.raises(ValueError) as error:
    text.load_or_train_tokenizer(path, kind, NON_ASCII + 'x', vocab_size=vocab_size)
  assert_one_sentence(str(error.value), path, 'trained on other text', 'delete the file')
  with open(path, 'rb') as f:
    assert f.read() == before


def test_tokenizer_file_without_train_text_record_loads_for_any_text(tmp_path):
  path = str(tmp_path / 'tokenizer.json')
  tokenizers.CharTokenizer(sorted(set(NON_ASCII))).save(path)  # as older versions wrote it
  loaded = text.load_or_train_tokenizer(path, 'char', 'abc')
  assert loaded.vocab == sorted(set(NON_ASCII)) and loaded.train_sha256 is None


@pytest.mark.parametrize('saved, asked, parts', [
    (('char', None), ('byte_bpe', 280), ['char tokenizer', 'byte_bpe']),
    (('byte_bpe', 270), ('byte_bpe', 280), ['270 tokens', 'vocab_size=280']),
    (('byte_bpe', 270), ('char', None), ['byte_bpe tokenizer', 'asks for char']),
])
def test_mismatched_tokenizer_file_is_refused_and_kept(tmp_path, saved, asked, parts):
  path = str(tmp_path / 'tokenizer.json')
  text.load_or_train_tokenizer(path, saved[0], NON_ASCII, vocab_size=saved[1])
  with open(path, 'rb') as f:
    before = f.read()
  with pytest.raises(ValueError) as error:
    text.load_or_train_tokenizer(path, asked[0], NON_ASCII, vocab_size=asked[1])
  assert_one_sentence(str(error.value), path, *parts)
  with open(path, 'rb') as f:
    assert f.read() == before


@pytest.mark.parametrize('kind, vocab_size', [('char', None), ('byte_bpe', 280)])
@pytest.mark.parametrize('damage, parts', [
    (lambda saved: saved[:len(saved) // 2], ['not UTF-8 JSON']),  # a write cut short
    (lambda saved: b'', ['not UTF-8 JSON']),
    (lambda saved: saved.replace(b'"vocab"', b'"vocab\xff"'), ['not UTF-8 JSON']),
    # Another library's tokenizer.json, copied into the workdir.
    (lambda saved: b'{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}',
     ["format is None, not 'jaxlab-tokenizer'"]),
])
def test_a_damaged_or_foreign_tokenizer_file_is_refused_and_kept(tmp_path, kind, vocab_size,
                                                                 damage, parts):
  path = tmp_path / 'tokenizer.json'
  text.load_or_train_tokenizer(str(path), kind, NON_ASCII, vocab_size=vocab_size)
  path.write_bytes(damage(path.read_bytes()))
  before = path.read_bytes()
  with pytest.raises(ValueError) as error:
    text.load_or_train_tokenizer(str(path), kind, NON_ASCII, vocab_size=vocab_size)
  assert_one_sentence(str(error.value), repr(str(path)), 'is invalid', *parts)
  assert path.read_bytes() == before and os.listdir(tmp_path) == ['tokenizer.json']


def test_a_folder_at_the_tokenizer_file_is_refused_in_one_sentence_and_kept(tmp_path):
  # It used to be an IsADirectoryError traceback.
  path = tmp_path / 'tokenizer.json'
  (path / 'inside').mkdir(parents=True)
  with pytest.raises(ValueError) as error:
    text.load_or_train_tokenizer(str(path), 'char', NON_ASCII)
  assert_one_sentence(str(error.value), str(path), 'is a folder')
  assert [p.name for p in path.iterdir()] == ['inside']


def test_a_tokenizer_is_saved_in_folders_made_for_it(tmp_path):
  path = tmp_path / 'runs' / 'first' / 'tokenizer.json'
  trained = text.load_or_train_tokenizer(str(path), 'char', NON_ASCII)
  assert os.listdir(path.parent) == ['tokenizer.json']
  # A file of the user's beside it, named like a temporary file, is left as it was.
  (path.parent / 'tokenizer.json.tmp').write_text('mine')
  path.unlink()
  text.load_or_train_tokenizer(str(path), 'char', NON_ASCII)
  assert (path.parent / 'tokenizer.json.tmp').read_text() == 'mine'
  assert tokenizers.load(str(path)).vocab == trained.vocab == sorted(set(NON_ASCII))


def test_a_file_where_the_tokenizer_folder_goes_is_refused_before_training_and_kept(
    tmp_path, monkeypatch):
  # It used to train and then end in a FileExistsError traceback.
  (tmp_path / 'runs').write_text('mine')
  path = tmp_path / 'runs' / 'first' / 'tokenizer.json'
  monkeypatch.setattr(text, 'make_tokenizer', lambda *args, **kwargs: pytest.fail('trained'))
  with pytest.raises(ValueError) as error:
    text.load_or_train_tokenizer(str(path), 'char', NON_ASCII)
  assert_one_sentence(str(error.value), repr(str(path)), repr(str(tmp_path / 'runs')), 'is a file')
  assert os.listdir(tmp_path) == ['runs'] and (tmp_path / 'runs').read_text() == 'mine'


def test_crash_while_saving_leaves_no_tokenizer_file(tmp_path, monkeypatch):
  def crash(obj, f, **kwargs):
    f.write(json.dumps(obj, **kwargs)[:20])
    raise KeyboardInterrupt

  monkeypatch.setattr(tokenizers.json, 'dump', crash)
  path = str(tmp_path / 'tokenizer.json')
  with pytest.raises(KeyboardInterrupt):
    text.load_or_train_tokenizer(path, 'char', NON_ASCII)
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('kind, vocab_size, parts', [
    ('word', None, ["'word'", 'char', 'byte_bpe']),
    ('char', 100, ['char', '100']),
    ('char', 0, ['vocab_size must be None', 'not 0']),
    ('byte_bpe', None, ['256', 'None']),
    ('byte_bpe', 200, ['256', '200']),
])
def test_bad_tokenizer_options_are_refused(kind, vocab_size, parts):
  with pytest.raises(ValueError) as error:
    text.make_tokenizer(kind, NON_ASCII, vocab_size=vocab_size)
  assert_one_sentence(str(error.value), *parts)


def test_byte_bpe_text_with_too_few_pairs_for_the_vocabulary_is_refused():
  # 'abab' merges (a, b) and then (ab, ab), after which no pair is left: 258 tokens.
  with pytest.raises(ValueError) as error:
    text.make_tokenizer('byte_bpe', 'abab', vocab_size=259)
  assert_one_sentence(str(error.value), '258 tokens', 'vocab_size=259')
  assert text.make_tokenizer('byte_bpe', 'abab', vocab_size=258).merges == [('a', 'b'),
                                                                          ('ab', 'ab')]


def test_byte_bpe_of_exactly_the_byte_alphabet_is_accepted():
  tokenizer = text.make_tokenizer('byte_bpe', NON_ASCII, vocab_size=256)
  assert tokenizer.vocab_size == 256 and tokenizer.merges == []
  assert tokenizer.encode('ab') == [ord('a'), ord('b')]


def test_token_units_sum_to_characters_or_utf8_bytes():
  held_out = 'Crème brûlée at 東京 — the fox 🙂 runs.'
  char = text.make_tokenizer('char', NON_ASCII + held_out)
  units, unit = text.token_units(char)
  assert unit == 'char' and units.dtype == np.float32 and units.shape == (char.vocab_size,)
  assert units[char.encode(held_out)].sum() == len(held_out)
  bpe = text.make_tokenizer('byte_bpe', NON_ASCII, vocab_size=300)
  units, unit = text.token_units(bpe)
  assert unit == 'byte' and units.shape == (300,)
  ids = bpe.encode(held_out)
  assert len(ids) < len(held_out.encode('utf-8'))  # merged tokens spell several bytes
  assert units[ids].sum() == len(held_out.encode('utf-8'))


# make_sources over the tiny_shakespeare builder

# 1,000 characters: train is the first 900, validation the next 50 (see
# data/builders/tiny_shakespeare.py).
SYNTHETIC = ('First Citizen:\nBefore we proceed any further, hear me speak.\n' * 20)[:1000]


def _config(tmp_path, source_dir, **overrides):
  # Overrides go in before the ConfigDict fixes each field's type, so any value can be tried.
  return ml_collections.ConfigDict({
      'name': 'tiny_shakespeare', 'train_split': 'train', 'eval_split': 'validation',
      'data_dir': str(tmp_path / 'tfds'), 'options': {'source_dir': str(source_dir)},
      'text_key': 'text', 'tokenizer': 'char', 'vocab_size': None, 'window': 8, **overrides})


def _write_source(tmp_path, content):
  folder = tmp_path / 'src'
  folder.mkdir()
  (folder / 'input.txt').write_bytes(content.encode('utf-8'))
  return folder


def test_make_sources_char_end_to_end(tmp_path):
  config = _config(tmp_path, _write_source(tmp_path, SYNTHETIC))
  train, evaluation, meta = text.make_sources(config, str(tmp_path / 'work'))
  train_text, eval_text = SYNTHETIC[:900], SYNTHETIC[900:950]
  tokenizer = meta['tokenizer']
  assert tokenizer.vocab == sorted(set(train_text)) and meta['vocab_size'] == len(tokenizer.vocab)
  assert meta['unit'] == 'char' and meta['window'] == 8
  np.testing.assert_array_equal(meta['token_units'], np.ones(meta['vocab_size']))
  assert len(train) == 900 - 8 and len(evaluation) == -(-49 // 8)
  # How often each character occurs in the train split (not validation), counted by hand.
  assert meta['token_counts'].tolist() == [train_text.count(c) for c in tokenizer.vocab]
  assert tokenizer.decode(train[123]['tokens'].tolist()) == train_text[123:132]
  assert tokenizer.decode(evaluation[2]['tokens'].tolist()) == eval_text[16:25]
  # Nothing is written yet: the run saves the tokenizer once its whole config passed.
  assert not (tmp_path / 'work').exists()
  meta['workdir_files']['tokenizer.json'](str(tmp_path / 'tokenizer.json'))
  assert tokenizers.load(str(tmp_path / 'tokenizer.json')).vocab == tokenizer.vocab


def test_make_sources_byte_bpe_end_to_end(tmp_path):
  config = _config(tmp_path, _write_source(tmp_path, SYNTHETIC), tokenizer='byte_bpe',
                   vocab_size=270)
  train, evaluation, meta = text.make_sources(config, str(tmp_path / 'work'))
  tokenizer = meta['tokenizer']
  assert meta['vocab_size'] == 270 and meta['unit'] == 'byte'
  assert tokenizer.decode(train.tokens.tolist()) == SYNTHETIC[:900]
  assert tokenizer.decode(evaluation.tokens.tolist()) == SYNTHETIC[900:950]
  assert len(train) == len(train.tokens) - 8
  scored = sum(evaluation[i]['weights'].sum() for i in range(len(evaluation)))
  assert scored == len(evaluation.tokens) - 1


def test_workdir_tokenizer_of_another_source_is_refused_and_the_same_source_reloads_it(
    tmp_path, monkeypatch):
  workdir = tmp_path / 'work'
  workdir.mkdir()
  config = _config(tmp_path, _write_source(tmp_path, SYNTHETIC))
  _, _, meta = text.make_sources(config, str(workdir))
  path = str(workdir / 'tokenizer.json')
  meta['workdir_files']['tokenizer.json'](path)  # the run stopped before its first checkpoint
  other = tmp_path / 'other'
  other.mkdir()
  (other / 'input.txt').write_bytes(SYNTHETIC.upper().encode('utf-8'))
  other_config = _config(tmp_path, other, data_dir=str(tmp_path / 'tfds_other'))
  with pytest.raises(ValueError) as error:
    text.make_sources(other_config, str(workdir))
  assert_one_sentence(str(error.value), path, 'trained on other text')
  monkeypatch.setattr(text, 'make_tokenizer', lambda *args, **kwargs: pytest.fail('retrained'))
  _, _, again = text.make_sources(config, str(workdir))
  assert again['tokenizer'].vocab == meta['tokenizer'].vocab


def test_token_counts_cover_a_saved_vocabulary_beyond_the_train_text(tmp_path):
  # A file that records no train text may hold characters the train split lacks: '~' sorts last,
  # so its id is the largest and its count 0; the counts still run over the whole vocabulary.
  workdir = tmp_path / 'work'
  workdir.mkdir()
  vocab = sorted(set(SYNTHETIC) | {'~'})
  tokenizers.CharTokenizer(vocab).save(workdir / 'tokenizer.json')
  _, _, meta = text.make_sources(_config(tmp_path, _write_source(tmp_path, SYNTHETIC)),
                                 str(workdir))
  assert meta['vocab_size'] == len(vocab) and vocab[-1] == '~'
  assert meta['token_counts'].tolist() == [SYNTHETIC[:900].count(c) for c in vocab]


def test_a_tokenizer_file_without_a_train_character_is_named_and_kept(tmp_path):
  # A file that records no train text loads for any text; its vocabulary, not one learnt
  # from the train split, lacks the character, so the message names the file.
  workdir = tmp_path / 'work'
  workdir.mkdir()
  path = workdir / 'tokenizer.json'
  tokenizers.CharTokenizer(sorted(set(SYNTHETIC) - {'F'})).save(path)
  before = path.read_bytes()
  with pytest.raises(ValueError) as error:
    text.make_sources(_config(tmp_path, _write_source(tmp_path, SYNTHETIC)), str(workdir))
  assert_one_sentence(str(error.value), "'F'", 'position 0', "'train'", 'tokenizer file',
                      str(path))
  assert path.read_bytes() == before and os.listdir(workdir) == ['tokenizer.json']


def test_unknown_eval_character_is_refused(tmp_path):
  # 'Z' and then 'Q' only in validation: the first unknown character is named.
  content = SYNTHETIC[:920] + 'Z' + SYNTHETIC[921:930] + 'Q' + SYNTHETIC[931:]
  config = _config(tmp_path, _write_source(tmp_path, content))
  with pytest.raises(ValueError) as error:
    text.make_sources(config, str(tmp_path / 'work'))
  assert_one_sentence(str(error.value), "'Z'", "'validation'", 'position 20')


def test_a_split_too_short_for_a_window_is_refused_naming_split_and_window(tmp_path):
  # 900 train characters: data.window=899 leaves one training window, 900 none.
  source = _write_source(tmp_path, SYNTHETIC)
  train, _, _ = text.make_sources(_config(tmp_path, source, window=899), str(tmp_path / 'work'))
  assert len(train) == 1
  with pytest.raises(ValueError) as error:
    text.make_sources(_config(tmp_path, source, window=900), str(tmp_path / 'work'))
  assert_one_sentence(str(error.value), "Split 'train' of 'tiny_shakespeare'", '900 tokens',
                      'data.window=900', 'at most 899')
  # 30 characters: train 27, validation 1 and test 2; an evaluation window needs 2 tokens.
  short = tmp_path / 'short'
  short.mkdir()
  (short / 'input.txt').write_text('abcdefghij' * 3)
  config = _config(tmp_path, short, data_dir=str(tmp_path / 'tfds_short'))
  with pytest.raises(ValueError) as error:
    text.make_sources(config, str(tmp_path / 'work'))
  assert_one_sentence(str(error.value), "Split 'validation' of 'tiny_shakespeare'", '1 token,',
                      'fewer than the 2', 'evaluation window needs')
  config = _config(tmp_path, short, data_dir=str(tmp_path / 'tfds_short'), eval_split='test')
  _, evaluation, _ = text.make_sources(config, str(tmp_path / 'work'))
  assert len(evaluation) == 1 and evaluation[0]['weights'].tolist() == [1] + [0] * 7
  assert not (tmp_path / 'work').exists()


def test_read_text_joins_records_and_names_a_missing_feature(tmp_path):
  source = _write_source(tmp_path, SYNTHETIC)
  data_dir = str(tmp_path / 'tfds')
  both = text.read_text('tiny_shakespeare', 'validation+test', data_dir=data_dir,
                        source_dir=str(source))
  assert both == SYNTHETIC[900:950] + '\n' + SYNTHETIC[950:]
  with pytest.raises(ValueError) as error:
    text.read_text('tiny_shakespeare', 'test', data_dir=data_dir, text_key='content')
  assert_one_sentence(str(error.value), "'content'", 'text')


def test_a_feature_that_is_not_text_is_refused_naming_the_text_features(tmp_path):
  # shakespeare_case's 'input' is a uint8 array per record: its printed form ('[102 105 ...]')
  # used to be read as the text, and a model trained on it.
  source = _write_source(tmp_path, SYNTHETIC)
  with pytest.raises(ValueError) as error:
    text.read_text('shakespeare_case', 'validation', data_dir=str(tmp_path / 'tfds'),
                   text_key='input', source_dir=str(source))
  assert_one_sentence(str(error.value), "'input'", "'shakespeare_case'", 'not text',
                      'has no text feature')


def test_text_bytes_that_are_not_utf8_are_refused_naming_the_record(monkeypatch):
  records = [{'text': 'Naïve'.encode('utf-8'), 'title': 'a'}, {'text': 'café', 'title': 'b'}]
  monkeypatch.setattr(text.datasets, 'load', lambda name, split, **kwargs: records)
  assert text.read_text('corpus', 'train') == 'Naïve\ncafé'
  records[1]['text'] = 'café'.encode('latin-1')  # b'caf\xe9'
  with pytest.raises(ValueError) as error:
    text.read_text('corpus', 'train')
  assert_one_sentence(str(error.value), 'Record 1', "'train'", "'corpus'", "'text'", 'not UTF-8',
                      'offset 3')
  records[1]['text'] = 7
  with pytest.raises(ValueError) as error:
    text.read_text('corpus', 'train')
  assert_one_sentence(str(error.value), "'text'", 'int values', 'its text features are: title')


def test_read_text_decodes_utf8_and_cuts_by_characters(tmp_path):
  # Multi-byte characters throughout: a decoding other than UTF-8, or cuts counted in
  # bytes, gives other text.
  content = NON_ASCII * 3
  source = _write_source(tmp_path, content)
  n = len(content)
  i = int(0.9 * n)
  j = i + int(0.5 * (n - i))
  read = text.read_text('tiny_shakespeare', 'train+validation+test',
                        data_dir=str(tmp_path / 'tfds'), source_dir=str(source))
  assert read == content[:i] + '\n' + content[i:j] + '\n' + content[j:]


@pytest.mark.parametrize('overrides, parts', [
    ({'window': 0}, ['data.window', 'positive integer', 'not 0']),
    ({'window': -3}, ['data.window', 'not -3']),
    ({'window': True}, ['data.window', 'not True']),
    ({'window': 8.0}, ['data.window', 'not 8.0']),
    ({'window': None}, ['data.window', 'not None']),
    ({'tokenizer': 'byte_bpe', 'vocab_size': 100}, ['at least 256', 'not 100']),
    ({'tokenizer': 'char', 'vocab_size': 70}, ['vocab_size must be None', 'not 70']),
    ({'tokenizer': 'word'}, ["data.tokenizer 'word'", 'char, byte_bpe']),
])
def test_bad_window_and_tokenizer_options_are_refused_before_the_text_is_read(tmp_path, overrides,
                                                                              parts):
  config = _config(tmp_path, _write_source(tmp_path, SYNTHETIC), **overrides)
  with pytest.raises(ValueError) as error:
    text.make_sources(config, str(tmp_path / 'work'))
  assert_one_sentence(str(error.value), *parts)
  # Refused before the data set is prepared or anything is written.
  assert sorted(p.name for p in tmp_path.iterdir()) == ['src']


# make_sources over records that are windows already (tokenizer='dataset')


def _token_records(monkeypatch, splits, vocab='abcd'):
  """A data set named 'windows' whose builder's tokenizer is a char tokenizer of `vocab` and
  whose split `name` holds the rows of `splits[name]` as windows."""
  def load(name, split, **kwargs):
    rows = np.asarray(splits[split], np.int32)
    return [{'tokens': row, 'weights': np.ones(len(row) - 1, np.float32)} for row in rows]
  monkeypatch.setattr(text.datasets, 'load', load)
  monkeypatch.setattr(text.datasets, 'make_builder', lambda name, **kwargs: types.SimpleNamespace(
      tokenizer=tokenizers.CharTokenizer(list(vocab))))
  return ml_collections.ConfigDict({'name': 'windows', 'train_split': 'train',
                                    'eval_split': 'validation', 'tokenizer': 'dataset',
                                    'vocab_size': None, 'window': None})


def test_token_records_are_the_windows_and_their_counts_are_the_train_splits(monkeypatch):
  config = _token_records(monkeypatch, {'train': [[0, 1, 2], [3, 3, 1]], 'validation': [[2, 2, 2]]})
  train, evaluation, meta = text.make_sources(config, '')
  assert meta['window'] == 2 and meta['vocab_size'] == 4 and meta['unit'] == 'token'
  assert meta['token_counts'].tolist() == [1, 2, 1, 2]  # 0 once, 1 twice, 2 once, 3 twice
  assert evaluation[0]['tokens'].tolist() == [2, 2, 2] and len(train) == 2


def test_token_record_counts_cover_ids_the_train_split_lacks(monkeypatch):
  # Vocabulary 'abcde': id 4 never occurs, and still has its count.
  config = _token_records(monkeypatch, {'train': [[0, 1, 2]], 'validation': [[3, 3, 3]]},
                          vocab='abcde')
  _, _, meta = text.make_sources(config, '')
  assert meta['token_counts'].tolist() == [1, 1, 1, 0, 0]


@pytest.mark.parametrize('window', [1, 3, 2.0])
def test_a_window_other_than_the_records_is_refused(monkeypatch, window):
  splits = {'train': [[0, 1, 2]], 'validation': [[3, 3, 3]]}
  config = _token_records(monkeypatch, splits)
  config.window = 2
  assert text.make_sources(config, '')[2]['window'] == 2
  config = _token_records(monkeypatch, splits)
  config.window = window
  with pytest.raises(ValueError) as error:
    text.make_sources(config, '')
  assert_one_sentence(str(error.value), 'windows of 2 tokens', 'must be None or 2',
                      f'not {window!r}')


@pytest.mark.parametrize('splits, parts', [
    ({'train': [[0, 1, 2], [3, 4, 1]], 'validation': [[0, 1, 2]]},
     ["Split 'train' of 'windows'", 'token id 4', 'vocabulary of 4']),
    ({'train': [[0, 1, 2]], 'validation': [[0, -1, 2]]},
     ["Split 'validation' of 'windows'", 'token id -1', 'vocabulary of 4']),
    ({'train': [[0, 1, 2]], 'validation': [[0, 1, 2, 3]]},
     ["Split 'validation' of 'windows'", 'windows of 3 tokens', "train split's 2"]),
])
def test_token_records_that_do_not_fit_the_vocabulary_or_window_are_refused(monkeypatch, splits,
                                                                            parts):
  # An id outside the vocabulary used to reach the model (an embedding lookup out of range)
  # and make token_counts longer than the vocabulary; eval windows of another length, a
  # model shaped for the train split's.
  with pytest.raises(ValueError) as error:
    text.make_sources(_token_records(monkeypatch, splits), '')
  assert_one_sentence(str(error.value), *parts)


def test_make_sources_on_the_real_file(tmp_path):
  folder = shared_folder('tinyshakespeare')
  config = _config(tmp_path, folder, window=256)
  train, evaluation, meta = text.make_sources(config, str(tmp_path / 'work'))
  assert meta['vocab_size'] == 65
  assert len(train) == 1_003_854 - 256
  assert len(evaluation) == -(-(55_770 - 1) // 256)
  assert meta['tokenizer'].decode(train[0]['tokens'].tolist()).startswith('First Citizen:\n')
