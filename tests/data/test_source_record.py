"""A data set prepared from local files is not served for other files named later.

Reference: the files' own bytes (two folders whose `input.txt` differ by one word, and a
byte-for-byte copy in a third folder).
"""

import hashlib
import os
import shutil

import pytest

from data import datasets
from data.builders import sources
from tests.messages import assert_one_sentence

TEXT = 'First Citizen:\nBefore we proceed any further, hear me speak.\n' * 40


@pytest.fixture(autouse=True)
def no_outside_sources(monkeypatch):
  for var in (datasets.DATA_DIR_ENV_VAR, 'TINY_SHAKESPEARE_DIR'):
    monkeypatch.delenv(var, raising=False)


def _folder(path, text):
  path.mkdir()
  (path / 'input.txt').write_text(text, encoding='utf-8')
  return path


def _files(data_dir):
  return {p: p.read_bytes() for p in data_dir.rglob('*') if p.is_file() and '.lock' not in p.name}


def test_other_files_named_later_are_refused_and_the_prepared_copy_is_kept(tmp_path, monkeypatch):
  first = _folder(tmp_path / 'first', TEXT)
  other = _folder(tmp_path / 'other', TEXT.replace('Citizen', 'Senator'))
  data_dir = tmp_path / 'tfds'
  train = datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=first)
  assert train[0]['text'].decode('utf-8') == TEXT[:len(train[0]['text'])]
  prepared = _files(data_dir)

  with pytest.raises(ValueError) as error:  # it used to return the Citizen text
    datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=other)
  assert_one_sentence(str(error.value), "'tiny_shakespeare'", 'input.txt', str(other),
                      'given by source_dir')
  monkeypatch.setenv('TINY_SHAKESPEARE_DIR', str(other))
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', 'validation', data_dir=data_dir)
  assert_one_sentence(str(error.value), str(other), 'given by $TINY_SHAKESPEARE_DIR')
  assert _files(data_dir) == prepared

  # The files' contents decide, not their folder: a copy is the same data set.
  copy = tmp_path / 'copy'
  shutil.copytree(first, copy)
  monkeypatch.setenv('TINY_SHAKESPEARE_DIR', str(copy))
  assert datasets.load('tiny_shakespeare', 'train', data_dir=data_dir)[0] == train[0]


def test_a_data_set_prepared_without_a_record_is_read_as_before(tmp_path):
  first = _folder(tmp_path / 'first', TEXT)
  other = _folder(tmp_path / 'other', TEXT.replace('Citizen', 'Senator'))
  data_dir = tmp_path / 'tfds'
  train = datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=first)
  records = list(data_dir.rglob(sources.SOURCE_RECORD))
  assert len(records) == 1
  os.remove(records[0])
  again = datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=other)
  assert again[0] == train[0]


def test_files_differing_from_those_another_process_prepared_from_meanwhile_are_refused(
    tmp_path, monkeypatch):
  # A process that finds the data set unprepared waits for the preparation lock; another
  # process prepares it from its own files meanwhile (here: before this load).
  first = _folder(tmp_path / 'first', TEXT)
  other = _folder(tmp_path / 'other', TEXT.replace('Citizen', 'Senator'))
  data_dir = tmp_path / 'tfds'
  datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=first)
  prepared = _files(data_dir)
  seen = []
  real_is_prepared = datasets._is_prepared

  def prepared_only_after_the_wait(builder):
    seen.append(builder)
    return len(seen) > 1 and real_is_prepared(builder)

  monkeypatch.setattr(datasets, '_is_prepared', prepared_only_after_the_wait)
  with pytest.raises(ValueError) as error:  # it used to return the Citizen text
    datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=other)
  assert_one_sentence(str(error.value), "'tiny_shakespeare'", str(other), 'given by source_dir')
  assert len(seen) == 2 and _files(data_dir) == prepared


def test_a_preparation_stopped_once_its_folder_is_in_place_still_keeps_its_record(
    tmp_path, monkeypatch):
  # A kill right after TFDS renamed the prepared folder into place used to leave it without
  # its record, so files named later were no longer compared and other text was served.
  from data.builders import tiny_shakespeare  # pylint: disable=g-import-not-at-top
  first = _folder(tmp_path / 'first', TEXT)
  other = _folder(tmp_path / 'other', TEXT.replace('Citizen', 'Senator'))
  data_dir = tmp_path / 'tfds'
  prepare = tiny_shakespeare.TinyShakespeare.download_and_prepare

  def prepare_then_stop(self, *args, **kwargs):
    prepare(self, *args, **kwargs)
    raise KeyboardInterrupt  # as a kill would, before anything after it runs

  monkeypatch.setattr(tiny_shakespeare.TinyShakespeare, 'download_and_prepare',
                      prepare_then_stop)
  with pytest.raises(KeyboardInterrupt):
    datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=first)
  monkeypatch.setattr(tiny_shakespeare.TinyShakespeare, 'download_and_prepare', prepare)
  assert len(list(data_dir.rglob(sources.SOURCE_RECORD))) == 1
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=other)
  assert_one_sentence(str(error.value), "'tiny_shakespeare'", str(other), 'given by source_dir')
  train = datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=first)
  assert train[0]['text'].decode('utf-8') == TEXT[:len(train[0]['text'])]


def test_source_dir_is_preferred_to_the_environment_variable(tmp_path, monkeypatch):
  # Prepared from, and checked against, the folder passed, not the one in the environment.
  first = _folder(tmp_path / 'first', TEXT)
  other = _folder(tmp_path / 'other', TEXT.replace('Citizen', 'Senator'))
  monkeypatch.setenv('TINY_SHAKESPEARE_DIR', str(other))
  train = datasets.load('tiny_shakespeare', 'train', data_dir=tmp_path / 'tfds', source_dir=first)
  assert train[0]['text'].decode('utf-8') == TEXT[:len(train[0]['text'])]


class _TwoFiles:
  """A builder reading two files, with no default folder unless a test gives some."""
  SOURCE_FILES = ('a.txt', 'b.txt')
  SOURCE_ENV_VAR = 'JAXLAB_TEST_SOURCE_DIR'
  SOURCE_DEFAULT_DIRS = ()


def _files_folder(path, contents):
  path.mkdir()
  for name, text in contents.items():
    (path / name).write_text(text, encoding='utf-8')
  return path


def test_a_default_folder_is_taken_only_if_it_holds_every_file(tmp_path, monkeypatch):
  partial = _files_folder(tmp_path / 'partial', {'a.txt': 'a'})
  full = _files_folder(tmp_path / 'full', {'a.txt': 'a', 'b.txt': 'b'})
  monkeypatch.delenv(_TwoFiles.SOURCE_ENV_VAR, raising=False)
  monkeypatch.setattr(_TwoFiles, 'SOURCE_DEFAULT_DIRS', (str(partial), str(full)))
  assert sources.find_dir('test', _TwoFiles, None, str(tmp_path)) == str(full)
  monkeypatch.setattr(_TwoFiles, 'SOURCE_DEFAULT_DIRS', (str(partial),))
  with pytest.raises(FileNotFoundError):
    sources.find_dir('test', _TwoFiles, None, str(tmp_path))


def test_a_named_folder_lacking_a_file_is_not_compared(tmp_path, monkeypatch):
  monkeypatch.delenv(_TwoFiles.SOURCE_ENV_VAR, raising=False)
  prepared = tmp_path / 'prepared'
  prepared.mkdir()
  first = _files_folder(tmp_path / 'first', {'a.txt': 'a', 'b.txt': 'b'})
  sources.write_record(str(prepared), _TwoFiles, str(first))
  # Only b.txt differs from the files prepared from; a folder without it is not compared.
  sources.check_record('test', str(prepared), _TwoFiles, first)
  sources.check_record('test', str(prepared), _TwoFiles,
                       _files_folder(tmp_path / 'partial', {'a.txt': 'a'}))
  with pytest.raises(ValueError, match='prepared from another b.txt'):
    sources.check_record('test', str(prepared), _TwoFiles,
                         _files_folder(tmp_path / 'other', {'a.txt': 'a', 'b.txt': 'B'}))


def test_digests_are_the_sha256_of_the_whole_files(tmp_path):
  # Files longer than the 1 MiB blocks they are read in (input.txt is 1.1 MB).
  contents = {'a.txt': 'x' * (5 << 19) + 'end', 'b.txt': ''}
  folder = _files_folder(tmp_path / 'files', contents)
  assert sources.digests(_TwoFiles, str(folder)) == {
      name: hashlib.sha256(text.encode('utf-8')).hexdigest() for name, text in contents.items()}
