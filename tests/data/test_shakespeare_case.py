"""The `shakespeare_case` data set against pieces cut here from the source text.

The reference pieces of a split's text are the matches of the regular
expression [^\\n]{1,64} (each run of characters between newlines, in chunks
of 64 and a rest), and a split's text is cut at hand-worked or published
character counts, not with the builder's code.
"""

import os
import re
import time

import numpy as np
import pytest

from data import datasets
from data import pipeline
from data.builders import shakespeare_case
from tests.messages import assert_one_sentence
from tests.data.test_datasets import shared_folder

SPLITS = ('train', 'validation', 'test')
OFFLINE_LIMIT_S = 5.0

# 1,001 characters: lines of 141, 64 and 65 characters, runs of empty lines,
# and cuts inside lines. The catalog's rule: train = int(0.9 * 1001) = 900
# characters; of the 101 left, validation = int(0.5 * 101) = 50; test = 51.
_LINES = ('First Citizen:', '', '', 'Before We Proceed ANY further, hear me speak. ' * 3,
          'All:', 'A' * 64, 'b' * 65, "MENENIUS: What work's, my countrymen, in hand?",
          'Zounds, speak.', '')
SYNTHETIC_TEXT = ('\n'.join(_LINES) * 4)[:1001]
SYNTHETIC_BOUNDS = {'train': (0, 900), 'validation': (900, 950), 'test': (950, 1001)}
# The published input.txt: 1,003,854 / 55,770 / 55,770 characters.
PUBLISHED_BOUNDS = {'train': (0, 1_003_854), 'validation': (1_003_854, 1_059_624),
                    'test': (1_059_624, 1_115_394)}
PUBLISHED_COUNTS = {'train': 29_242, 'validation': 1_703, 'test': 1_834}


@pytest.fixture(autouse=True)
def no_outside_sources(monkeypatch):
  """Only the folders a test passes are seen, whatever this machine holds."""
  for var in (datasets.DATA_DIR_ENV_VAR, 'TINY_SHAKESPEARE_DIR'):
    monkeypatch.delenv(var, raising=False)


def reference_pieces(text: str, bounds: dict) -> dict[str, list[str]]:
  return {split: re.findall(r'[^\n]{1,64}', text[start:stop])
          for split, (start, stop) in bounds.items()}


def load_arrays(data_dir, **options) -> dict[str, dict[str, np.ndarray]]:
  return {split: pipeline.InMemorySource(
      datasets.load('shakespeare_case', split, data_dir=data_dir, **options)).arrays
          for split in SPLITS}


def assert_records_are(arrays: dict, pieces: list[str]) -> None:
  """The records are `pieces` lower-cased and tagged, zero past each length."""
  assert len(arrays['length']) == len(pieces)
  assert arrays['input'].dtype == np.uint8 and arrays['input'].shape[1:] == (64,)
  assert arrays['tags'].dtype == np.uint8 and arrays['tags'].shape[1:] == (64,)
  expected_input = np.zeros((len(pieces), 64), np.uint8)
  expected_tags = np.zeros((len(pieces), 64), np.uint8)
  for i, piece in enumerate(pieces):
    assert 1 <= len(piece) <= 64
    expected_input[i, :len(piece)] = list(piece.lower().encode('ascii'))
    expected_tags[i, :len(piece)] = [c.isupper() for c in piece]
  np.testing.assert_array_equal(arrays['length'], [len(p) for p in pieces])
  np.testing.assert_array_equal(arrays['input'], expected_input)
  np.testing.assert_array_equal(arrays['tags'], expected_tags)


@pytest.fixture(scope='module')
def synthetic_source(tmp_path_factory):
  folder = tmp_path_factory.mktemp('src')
  (folder / 'input.txt').write_bytes(SYNTHETIC_TEXT.encode('ascii'))
  return folder


def test_synthetic_file_gives_its_pieces_per_split(synthetic_source, tmp_path):
  assert len(SYNTHETIC_TEXT) == 1001
  # The split cuts fall inside lines, so a line's two parts go to two splits.
  assert '\n' not in SYNTHETIC_TEXT[899:901] + SYNTHETIC_TEXT[949:951]
  expected = reference_pieces(SYNTHETIC_TEXT, SYNTHETIC_BOUNDS)
  assert sum(len(p) == 64 for p in expected['train']) >= 4  # long lines are cut
  arrays = load_arrays(tmp_path, source_dir=synthetic_source)
  for split in SPLITS:
    assert_records_are(arrays[split], expected[split])
    original = ''.join(SYNTHETIC_TEXT[slice(*SYNTHETIC_BOUNDS[split])].split('\n'))
    tags = np.concatenate([t[:n] for t, n in zip(arrays[split]['tags'], arrays[split]['length'])])
    assert tags.sum() == sum(c.isupper() for c in original) > 0


def test_preparing_again_gives_the_same_records(synthetic_source, tmp_path):
  first = load_arrays(tmp_path / 'a', source_dir=synthetic_source)
  second = load_arrays(tmp_path / 'b', source_dir=synthetic_source)
  for split in SPLITS:
    assert first[split].keys() == second[split].keys() == {'input', 'tags', 'length'}
    for name, values in first[split].items():
      np.testing.assert_array_equal(second[split][name], values, err_msg=f'{split} {name}')


def test_real_file(tmp_path, monkeypatch):
  folder = shared_folder('tinyshakespeare')
  monkeypatch.setenv('TINY_SHAKESPEARE_DIR', folder)  # found as tiny_shakespeare finds it
  with open(os.path.join(folder, 'input.txt'), 'rb') as f:
    text = f.read().decode('ascii')
  assert len(text) == 1_115_394
  expected = reference_pieces(text, PUBLISHED_BOUNDS)
  assert {split: len(p) for split, p in expected.items()} == PUBLISHED_COUNTS
  arrays = load_arrays(tmp_path)
  for split in SPLITS:
    assert_records_are(arrays[split], expected[split])


def test_non_ascii_text_is_refused(tmp_path):
  (tmp_path / 'input.txt').write_text('First Citizen:\nCafé.\n' * 10, encoding='utf-8')
  with pytest.raises(ValueError, match='ASCII'):
    datasets.load('shakespeare_case', 'train', data_dir=tmp_path / 'tfds', source_dir=tmp_path)


def test_text_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
  (tmp_path / 'input.txt').write_bytes(b'First Citizen:\nBefore \xff we proceed.\n')
  with pytest.raises(ValueError) as error:
    datasets.load('shakespeare_case', 'train', data_dir=tmp_path / 'tfds', source_dir=tmp_path)
  assert str(error.value) == (f"Data set 'shakespeare_case' reads UTF-8 text, but "
                              f"{tmp_path / 'input.txt'} has an invalid byte at offset 22.")


def test_missing_tiny_shakespeare_folder_fails_fast_naming_what_to_set(tmp_path):
  start = time.monotonic()
  with pytest.raises(FileNotFoundError) as error:
    datasets.load('shakespeare_case', 'train', data_dir=tmp_path)
  assert time.monotonic() - start < OFFLINE_LIMIT_S
  assert_one_sentence(str(error.value), "'shakespeare_case'", 'input.txt',
                      'TINY_SHAKESPEARE_DIR', 'source_dir')

  with pytest.raises(FileNotFoundError) as error:
    datasets.load('shakespeare_case', 'test', data_dir=tmp_path, source_dir=tmp_path)
  assert_one_sentence(str(error.value), "'shakespeare_case'", 'input.txt',
                      'TINY_SHAKESPEARE_DIR', str(tmp_path))


def test_lines_are_cut_at_newlines_only_and_keep_their_other_characters():
  # '\r', form feeds and the other characters str.splitlines cuts at stay inside a piece, and
  # so do leading and trailing spaces; the reference is the regular expression of the module.
  text = '  Lead\r\nA\x0bB\x0cC\x1cD\x85E\u2028F\n\n' + 'x' * 130 + ' \n end  '
  expected = re.findall(r'[^\n]{1,64}', text)
  assert shakespeare_case.pieces(text) == expected
  assert expected[:2] == ['  Lead\r', 'A\x0bB\x0cC\x1cD\x85E\u2028F'] and expected[-1] == ' end  '


def test_a_piece_of_every_length_from_1_to_64_is_encoded_and_others_are_refused():
  record = shakespeare_case.encode('A' * 64)
  assert record['length'] == 64 and record['tags'].tolist() == [1] * 64
  assert record['input'].tolist() == [ord('a')] * 64
  record = shakespeare_case.encode('Z')
  assert record['length'] == 1 and record['tags'].tolist() == [1] + [0] * 63
  for piece in ('', 'a' * 65, 'Café'):
    with pytest.raises(ValueError, match='A piece must be 1 to 64 ASCII characters'):
      shakespeare_case.encode(piece)
