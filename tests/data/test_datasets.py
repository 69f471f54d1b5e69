"""`data.datasets.load` against independent references.

References: direct calls of the published generators (mnist1d, scikit-learn),
arrays written to temporary IDX/text files, the published sizes of the real
files, and the TFDS catalog's split rule worked out by hand.

Real files are read from $JAXLAB_SHARED_DATA, else `shared/data` beside the
repository; those tests skip when the folder is absent.
"""

import collections
import gzip
import logging
import os
import random
import shutil
import socket
import struct
import time

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from data import datasets
from data import inputs
from data.builders import digits
from data.builders import fashion_mnist
from data.builders import mnist1d
from data.builders import tiny_shakespeare
from tests.messages import assert_one_sentence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFLINE_LIMIT_S = 5.0


@pytest.fixture(autouse=True)
def no_outside_sources(monkeypatch):
  """Only the folders a test passes are seen, whatever this machine holds."""
  for var in (datasets.DATA_DIR_ENV_VAR, 'FASHION_MNIST_DIR', 'TINY_SHAKESPEARE_DIR'):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setattr(fashion_mnist.FashionMnist, 'SOURCE_DEFAULT_DIRS', ())


def shared_folder(name: str) -> str:
  root = os.environ.get('JAXLAB_SHARED_DATA') or os.path.join(REPO_ROOT, '..', 'shared', 'data')
  folder = os.path.join(root, name)
  if not os.path.isdir(folder):
    pytest.skip(f'no local copy of {name} in {root}')
  return folder


def records(source) -> list[dict]:
  return [source[i] for i in range(len(source))]


def write_idx_gz(path, array: np.ndarray) -> None:
  """Writes unsigned bytes in the IDX layout: magic 0x0000 0x08 ndim, big-endian sizes, data."""
  header = struct.pack('>HBB', 0, 0x08, array.ndim) + struct.pack(f'>{array.ndim}I', *array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


# mnist1d


@pytest.fixture(scope='module')
def mnist1d_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('mnist1d'))


def test_mnist1d_equals_a_direct_call_of_the_generator(mnist1d_dir):
  from mnist1d import data as mnist1d_data  # pylint: disable=g-import-not-at-top
  train = datasets.load('mnist1d', 'train', data_dir=mnist1d_dir)
  test = datasets.load('mnist1d', 'test', data_dir=mnist1d_dir)
  reference = mnist1d_data.make_dataset(mnist1d_data.get_dataset_args())
  for source, x, y in ((train, reference['x'], reference['y']),
                       (test, reference['x_test'], reference['y_test'])):
    assert len(source) == len(y)
    got = records(source)
    assert all(r['x'].dtype == np.float32 and r['x'].shape == (40,) for r in got)
    np.testing.assert_array_equal(np.stack([r['x'] for r in got]), x.astype(np.float32))
    np.testing.assert_array_equal([r['label'] for r in got], y)
  assert (len(train), len(test)) == (4000, 1000)
  assert datasets.info('mnist1d', data_dir=mnist1d_dir).features['label'].num_classes == 10


def test_mnist1d_generator_leaves_the_global_generators_alone():
  np.random.seed(123)
  random.seed(123)
  expected_next = (np.random.rand(), random.random())
  np.random.seed(123)
  random.seed(123)
  mnist1d.generate()
  assert (np.random.rand(), random.random()) == expected_next


# digits


def test_digits_split_is_a_stratified_partition_of_the_bundled_images(tmp_path):
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  bunch = sk_datasets.load_digits()
  train = records(datasets.load('digits', 'train', data_dir=tmp_path))
  test = records(datasets.load('digits', 'test', data_dir=tmp_path))

  assert (len(train), len(test)) == (1437, 360)
  for r in train + test:
    assert r['image'].dtype == np.uint8 and r['image'].shape == (8, 8, 1)
    assert 0 <= r['image'].min() and r['image'].max() <= 16
  # Brute-force recount: every bundled (image, label) appears exactly once.
  bundled = collections.Counter((image.astype(np.uint8).tobytes(), int(label))
                                for image, label in zip(bunch.images, bunch.target))
  loaded = collections.Counter((r['image'].tobytes(), r['label']) for r in train + test)
  assert loaded == bundled
  class_sizes = np.bincount(bunch.target, minlength=10)
  test_sizes = np.bincount([r['label'] for r in test], minlength=10)
  assert np.all(np.abs(test_sizes - class_sizes * 360 / 1797) <= 1), test_sizes
  # The documented split: the images train_test_split(random_state=0) picks, in bundled order.
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  _, picked = model_selection.train_test_split(np.arange(1797), test_size=360,
                                               stratify=bunch.target, random_state=0)
  np.testing.assert_array_equal(np.stack([r['image'][..., 0] for r in test]),
                                bunch.images[np.sort(picked)])


def test_digits_split_is_the_same_when_prepared_again(tmp_path):
  first = records(datasets.load('digits', 'test', data_dir=tmp_path / 'a'))
  second = records(datasets.load('digits', 'test', data_dir=tmp_path / 'b'))
  assert [r['label'] for r in first] == [r['label'] for r in second]
  np.testing.assert_array_equal(np.stack([r['image'] for r in first]),
                                np.stack([r['image'] for r in second]))


# tiny_shakespeare

# 1,001 characters, two of them two bytes long in UTF-8, so a cut by bytes
# would land elsewhere. The catalog's rule: train = int(0.9 * 1001) = 900
# characters; of the 101 left, validation = int(0.5 * 101) = 50; test = 51.
SYNTHETIC_TEXT = ('First Citizen:\nBefore we proceed any further.\n' * 30)[:999] + 'éè'
SYNTHETIC_BOUNDS = {'train': (0, 900), 'validation': (900, 950), 'test': (950, 1001)}


def test_split_rule_gives_the_published_sizes():
  pieces = tiny_shakespeare.split_text('x' * 1_115_394)
  assert {k: len(v) for k, v in pieces.items()} == {
      'train': 1_003_854, 'validation': 55_770, 'test': 55_770}


def test_tiny_shakespeare_synthetic_file_is_cut_by_characters(tmp_path):
  assert len(SYNTHETIC_TEXT) == 1001
  source = tmp_path / 'src'
  source.mkdir()
  (source / 'input.txt').write_bytes(SYNTHETIC_TEXT.encode('utf-8'))
  for split, (start, stop) in SYNTHETIC_BOUNDS.items():
    data = datasets.load('tiny_shakespeare', split, data_dir=tmp_path / 'tfds', source_dir=source)
    assert len(data) == 1
    assert data[0]['text'].decode('utf-8') == SYNTHETIC_TEXT[start:stop]


def test_tiny_shakespeare_refuses_a_file_that_is_not_utf8_naming_it(tmp_path):
  source = tmp_path / 'src'
  source.mkdir()
  (source / 'input.txt').write_bytes(b'First Citizen:\nBefore \xff we proceed.\n')
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', 'train', data_dir=tmp_path / 'tfds', source_dir=source)
  assert str(error.value) == (f"Data set 'tiny_shakespeare' reads UTF-8 text, but "
                              f"{source / 'input.txt'} has an invalid byte at offset 22.")


def test_tiny_shakespeare_refuses_an_empty_file_and_prepares_nothing_from_it(tmp_path):
  # An empty input.txt used to be prepared as three empty splits, kept with its SHA-256, so
  # the real file copied over it later was refused as a different source.
  source = tmp_path / 'src'
  source.mkdir()
  (source / 'input.txt').write_bytes(b'')
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', 'train', data_dir=tmp_path / 'tfds', source_dir=source)
  assert str(error.value) == (f"Data set 'tiny_shakespeare' reads UTF-8 text, but "
                              f"{source / 'input.txt'} is empty.")
  (source / 'input.txt').write_bytes(SYNTHETIC_TEXT.encode('utf-8'))
  data = datasets.load('tiny_shakespeare', 'train', data_dir=tmp_path / 'tfds', source_dir=source)
  start, stop = SYNTHETIC_BOUNDS['train']
  assert data[0]['text'].decode('utf-8') == SYNTHETIC_TEXT[start:stop]


def test_tiny_shakespeare_real_file(tmp_path, monkeypatch):
  folder = shared_folder('tinyshakespeare')
  monkeypatch.setenv('TINY_SHAKESPEARE_DIR', folder)
  texts = {split: datasets.load('tiny_shakespeare', split, data_dir=tmp_path)[0]['text']
           for split in ('train', 'validation', 'test')}
  assert {k: len(v) for k, v in texts.items()} == {
      'train': 1_003_854, 'validation': 55_770, 'test': 55_770}
  with open(os.path.join(folder, 'input.txt'), 'rb') as f:
    assert texts['train'] + texts['validation'] + texts['test'] == f.read()


# fashion_mnist


def test_fashion_mnist_synthetic_files(tmp_path):
  rng = np.random.default_rng(0)
  written = {}
  for split, n in (('train', 7), ('test', 3)):
    images_file, labels_file = fashion_mnist.SPLIT_FILES[split]
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    write_idx_gz(tmp_path / images_file, images)
    write_idx_gz(tmp_path / labels_file, labels)
    written[split] = images, labels

  for split, (images, labels) in written.items():
    got = records(datasets.load('fashion_mnist', split, data_dir=tmp_path / 'tfds',
                                source_dir=tmp_path))
    assert len(got) == len(labels)
    assert all(r['image'].dtype == np.uint8 and r['image'].shape == (28, 28, 1) for r in got)
    np.testing.assert_array_equal(np.stack([r['image'][..., 0] for r in got]), images)
    assert [r['label'] for r in got] == labels.tolist()
  label = datasets.info('fashion_mnist', data_dir=tmp_path / 'tfds').features['label']
  assert label.num_classes == 10 and label.names[9] == 'Ankle boot'


def _write_idx_typed_gz(path, array: np.ndarray, type_code: int) -> None:
  dtype = {0x08: '>u1', 0x0C: '>i4', 0x0D: '>f4'}[type_code]
  header = struct.pack('>HBB', 0, type_code, array.ndim) + struct.pack(
      f'>{array.ndim}I', *array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(dtype).tobytes())


@pytest.mark.parametrize('images_code, images, labels, parts', [
    (0x08, np.zeros((3, 28, 28)), np.array([1, 12, 3]),
     ['train-labels-idx1-ubyte.gz', 'label 12 at position 1', '0 to 9']),
    (0x08, np.zeros((3, 28, 28)), np.array([[1], [2], [3]]),
     ['train-labels-idx1-ubyte.gz', '(3, 1)', 'uint8 (N,)']),
    (0x0C, np.full((3, 28, 28), 300), np.array([1, 2, 3]),
     ['train-images-idx3-ubyte.gz', 'int32', 'uint8 (N, 28, 28)']),
    (0x0D, np.full((3, 28, 28), 0.5), np.array([1, 2, 3]),
     ['train-images-idx3-ubyte.gz', 'float32', 'uint8 (N, 28, 28)']),
])
def test_fashion_mnist_files_with_other_contents_are_refused_in_one_sentence(
    tmp_path, images_code, images, labels, parts):
  # The IDX files of Fashion-MNIST hold unsigned bytes: images (N, 28, 28), labels (N,) in 0..9.
  images_file, labels_file = fashion_mnist.SPLIT_FILES['train']
  _write_idx_typed_gz(tmp_path / images_file, images, images_code)
  _write_idx_typed_gz(tmp_path / labels_file, labels, 0x08)
  test_images, test_labels = fashion_mnist.SPLIT_FILES['test']
  write_idx_gz(tmp_path / test_images, np.zeros((2, 28, 28)))
  write_idx_gz(tmp_path / test_labels, np.array([0, 9]))
  with pytest.raises(ValueError) as error:
    datasets.load('fashion_mnist', 'train', data_dir=tmp_path / 'tfds', source_dir=tmp_path)
  assert_one_sentence(str(error.value), *parts)


def test_fashion_mnist_real_files(tmp_path, monkeypatch):
  monkeypatch.setenv('FASHION_MNIST_DIR', shared_folder('fashion-mnist'))
  train = datasets.load('fashion_mnist', 'train', data_dir=tmp_path)
  test = datasets.load('fashion_mnist', 'test', data_dir=tmp_path)
  assert (len(train), len(test)) == (60_000, 10_000)
  example = train[0]
  assert example['image'].dtype == np.uint8 and example['image'].shape == (28, 28, 1)
  # Fashion-MNIST is balanced: 6,000 train and 1,000 test images per class.
  for source, per_class in ((train, 6000), (test, 1000)):
    labels = [r['label'] for r in source.__getitems__(range(len(source)))]
    assert np.bincount(labels).tolist() == [per_class] * 10


# cache, errors


def test_second_load_reads_the_cache(tmp_path):
  source = tmp_path / 'src'
  source.mkdir()
  (source / 'input.txt').write_text(SYNTHETIC_TEXT, encoding='utf-8')
  data_dir = tmp_path / 'tfds'
  datasets.load('tiny_shakespeare', 'train', data_dir=data_dir, source_dir=source)
  written = {p: p.stat().st_mtime_ns for p in data_dir.rglob('*') if p.is_file()}
  assert any('array_record' in p.name for p in written)

  (source / 'input.txt').unlink()  # a rebuild would now fail
  again = datasets.load('tiny_shakespeare', 'validation', data_dir=data_dir)

  assert again[0]['text'].decode('utf-8') == SYNTHETIC_TEXT[900:950]
  assert {p: p.stat().st_mtime_ns for p in data_dir.rglob('*') if p.is_file()} == written


def test_data_dir_comes_from_the_environment(tmp_path, monkeypatch):
  monkeypatch.setenv(datasets.DATA_DIR_ENV_VAR, str(tmp_path))
  assert len(datasets.load('digits', 'test')) == 360
  assert (tmp_path / 'jaxlab_digits').is_dir()


def test_data_dir_argument_is_preferred_to_the_environment(tmp_path, monkeypatch):
  monkeypatch.setenv(datasets.DATA_DIR_ENV_VAR, str(tmp_path / 'from_env'))
  builder = datasets.make_builder('digits', data_dir=tmp_path / 'given')
  assert builder.data_dir.startswith(str(tmp_path / 'given'))


def test_only_incomplete_folders_of_the_version_being_prepared_are_removed(tmp_path):
  names = ('1.0.0', 'incomplete.abc_1.0.0', 'incomplete.xyz_2.0.0', 'other_1.0.0')
  for name in names:
    (tmp_path / name).mkdir()
  datasets._remove_incomplete(str(tmp_path / '1.0.0'))
  assert sorted(os.listdir(tmp_path)) == ['1.0.0', 'incomplete.xyz_2.0.0', 'other_1.0.0']


def test_tfds_records_below_error_are_dropped_and_errors_kept():
  def record(pathname, level):
    return logging.LogRecord('absl', level, pathname, 1, 'message', None, None)
  tfds_file = os.path.join(os.sep, 'site-packages', 'tensorflow_datasets', 'core', 'x.py')
  keep = datasets._DropTfdsRecords().filter
  assert not keep(record(tfds_file, logging.WARNING)) and not keep(record(tfds_file, logging.INFO))
  assert keep(record(tfds_file, logging.ERROR)) and keep(record(tfds_file, logging.CRITICAL))
  assert keep(record(os.path.join(os.sep, 'work', 'train.py'), logging.INFO))


def test_info_takes_the_source_dir_load_takes(tmp_path):
  info = datasets.info('tiny_shakespeare', data_dir=tmp_path, source_dir=tmp_path)
  assert 'text' in info.features


def test_quiet_preparation_restores_the_progress_bar_setting():
  from tensorflow_datasets.core.utils import tqdm_utils  # pylint: disable=g-import-not-at-top
  before = getattr(tqdm_utils, '_active', True)
  try:
    for setting in (False, True):
      tfds.display_progress_bar(setting)
      with datasets._tfds_quiet():
        assert not tqdm_utils._active
      assert tqdm_utils._active == setting
  finally:
    tfds.display_progress_bar(before)


def test_a_source_whose_last_record_cannot_be_read_is_damaged(tmp_path, monkeypatch):
  # A shard cut short may give its first records and fail on its last.
  class CutShort:
    def __len__(self):
      return 5

    def __getitem__(self, index):
      if index == 4:
        raise RuntimeError('record 4 lies past the end of its shard')
      return {'label': 0}

  datasets.load('digits', 'test', data_dir=tmp_path)
  monkeypatch.setattr(digits.Digits, 'as_data_source', lambda self, split: CutShort())
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'test', data_dir=tmp_path)
  assert_one_sentence(str(error.value), "is damaged (split 'test': record 4 lies past the end")


def test_missing_local_files_fail_fast_naming_what_to_set(tmp_path):
  start = time.monotonic()
  with pytest.raises(FileNotFoundError) as error:
    datasets.load('fashion_mnist', 'train', data_dir=tmp_path)
  assert time.monotonic() - start < OFFLINE_LIMIT_S
  assert_one_sentence(str(error.value), "'fashion_mnist'", 'FASHION_MNIST_DIR', 'source_dir')

  with pytest.raises(FileNotFoundError) as error:
    datasets.load('tiny_shakespeare', 'test', data_dir=tmp_path, source_dir=tmp_path)
  assert_one_sentence(str(error.value), "'tiny_shakespeare'", 'input.txt', 'TINY_SHAKESPEARE_DIR')


def test_unreachable_catalog_data_set_fails_fast(tmp_path, monkeypatch):
  monkeypatch.setattr(datasets, '_reachable', lambda hosts, timeout: False)
  start = time.monotonic()
  with pytest.raises(FileNotFoundError) as error:
    datasets.load('mnist', 'train', data_dir=tmp_path)
  assert time.monotonic() - start < OFFLINE_LIMIT_S
  assert_one_sentence(str(error.value), "'mnist'", datasets.DATA_DIR_ENV_VAR, 'data_dir=')


def test_catalog_data_set_on_this_machine_if_offline(tmp_path):
  builder = datasets.make_builder('mnist', data_dir=tmp_path)
  if datasets._reachable(datasets._download_hosts(builder), datasets.PROBE_TIMEOUT_S):
    pytest.skip('the network is reachable: TFDS would download mnist')
  start = time.monotonic()
  with pytest.raises(FileNotFoundError, match="'mnist'"):
    datasets.load('mnist', 'train', data_dir=tmp_path)
  assert time.monotonic() - start < OFFLINE_LIMIT_S


def test_probe_sees_a_listening_loopback_port_and_not_a_closed_one():
  with socket.create_server(('127.0.0.1', 0)) as server:
    port = server.getsockname()[1]
    assert datasets._reachable([('127.0.0.1', port)], timeout=1.0)
  start = time.monotonic()
  assert not datasets._reachable([('127.0.0.1', port), ('localhost', port)], timeout=1.0)
  assert time.monotonic() - start < 1.5


def test_unknown_split_lists_the_splits_before_preparing(tmp_path):
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', 'valid', data_dir=tmp_path)
  assert_one_sentence(str(error.value), "'valid'", 'train, validation, test')
  assert not (tmp_path / 'jaxlab_tiny_shakespeare').exists()


@pytest.mark.parametrize('split', [None, 0, ['train']])
def test_a_split_that_is_not_a_string_is_refused_before_preparing(tmp_path, split):
  with pytest.raises(ValueError) as error:
    datasets.load('tiny_shakespeare', split, data_dir=tmp_path)
  assert_one_sentence(str(error.value), repr(split), "'tiny_shakespeare'")
  assert not (tmp_path / 'jaxlab_tiny_shakespeare').exists()


def test_a_data_directory_inside_a_file_is_refused_naming_it(tmp_path, monkeypatch):
  file = tmp_path / 'not_a_folder'
  file.write_text('')
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'train', data_dir=file)
  assert_one_sentence(str(error.value), str(file), 'data_dir=', 'is a file')
  monkeypatch.setenv(datasets.DATA_DIR_ENV_VAR, str(file / 'sub'))
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'train')
  assert_one_sentence(str(error.value), str(file / 'sub'), '$JAXLAB_DATA_DIR', f'{file} is a file')
  assert file.read_text() == ''


@pytest.mark.parametrize('file_at', ['jaxlab_digits', 'jaxlab_digits/1.0.0'])
def test_a_file_where_the_data_set_s_folder_goes_is_refused_and_kept(tmp_path, file_at):
  # It used to be a FileExistsError traceback (jaxlab_digits), or a preparation of 0
  # examples followed by a KeyError on the split (1.0.0).
  file = tmp_path / file_at
  file.parent.mkdir(parents=True, exist_ok=True)
  file.write_text('mine')
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'train', data_dir=tmp_path)
  assert_one_sentence(str(error.value), "'digits'", f'{file} is a file', 'data_dir=')
  assert file.read_text() == 'mine'


@pytest.mark.parametrize('name, options, parts', [
    ('digits', {'source_dir': '/tmp'}, ["'digits'", 'no source_dir']),
    ('gaussian_mixture', {'mixture': 'ring', 'size': 3}, ["'size'", 'mixture']),
    ('mnist1d', {'length': 40}, ["'mnist1d'", "['length']"]),
    ('tiny_shakespeare', {'length': 40}, ["'tiny_shakespeare'", "['length']"]),
])
def test_an_option_a_data_set_does_not_take_is_a_value_error_of_a_config(
    tmp_path, name, options, parts):
  # A run reports a config's ValueErrors in one sentence; these were TypeErrors only, so
  # `--config.data.options=...` with a wrong key ended in a traceback.
  config = ml_collections.ConfigDict({
      'name': name, 'train_split': 'train', 'eval_split': 'test', 'data_dir': str(tmp_path),
      'options': options, 'tokenizer': 'char' if name == 'tiny_shakespeare' else None,
      'window': 8})
  with pytest.raises(ValueError) as error:
    inputs.make_sources(config, str(tmp_path / 'workdir'))
  assert_one_sentence(str(error.value), *parts)
  assert isinstance(error.value, TypeError)  # as it was for callers of data.load
  assert not (tmp_path / 'workdir').exists()


def test_unknown_name(tmp_path):
  with pytest.raises(ValueError) as error:
    datasets.load('no_such_data_set', 'train', data_dir=tmp_path)
  assert_one_sentence(str(error.value), "'no_such_data_set'", 'mnist1d')


@pytest.mark.parametrize('name', [None, '', '  '])
def test_a_missing_name_is_one_sentence(tmp_path, name):
  # None was a TypeError traceback from TFDS's name parser, '' its 19-line format help.
  with pytest.raises(ValueError) as error:
    datasets.load(name, 'train', data_dir=tmp_path)
  assert_one_sentence(str(error.value), f'got {name!r}', 'mnist1d')


@pytest.mark.parametrize('name, options, error_type, parts', [
    # Each was TFDS's exception with a traceback (an AssertionError for a version).
    ('mnist:1.0.0', {}, ValueError, ["'mnist:1.0.0'", 'version 1.0.0', 'only: 3.0.1']),
    ('mnist/no_such_config', {}, ValueError, ['BuilderConfig no_such_config not found']),
    ('mnist', {'foo': 1}, datasets.OptionError, ["{'foo': 1}", "argument 'foo'"]),
])
def test_a_tfds_name_or_option_tfds_cannot_build_is_one_sentence(tmp_path, name, options,
                                                                  error_type, parts):
  with pytest.raises(error_type) as error:
    datasets.load(name, 'train', data_dir=tmp_path, **options)
  assert_one_sentence(str(error.value), *parts)
  assert not os.listdir(tmp_path)


def test_split_expressions_over_known_splits_and_all_are_read(tmp_path):
  assert len(datasets.load('digits', 'all', data_dir=tmp_path)) == 1797
  assert len(datasets.load('digits', 'train[:10]+test', data_dir=tmp_path)) == 10 + 360
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'train+tset[:5]', data_dir=tmp_path)
  assert_one_sentence(str(error.value), "'tset'", 'train, test')


def test_slices_that_select_no_examples_are_refused_in_one_sentence(tmp_path):
  # TFDS counts a slice ending before its start as negative: 'train[5:2]' used to fail
  # with "__len__() should return >= 0" from the first len() of the source.
  for split in ('train[:0]', 'train[5:2]', 'test[-1:-3]', 'train[10%:5%]'):
    with pytest.raises(ValueError) as error:
      datasets.load('digits', split, data_dir=tmp_path)
    assert_one_sentence(str(error.value), repr(split), "'digits'", 'holds no examples')
  assert len(datasets.load('digits', 'train[2:5]', data_dir=tmp_path)) == 3


def test_download_hosts_are_the_recorded_urls_hosts_with_their_scheme_ports():
  class Builder:
    url_infos = {'http://example.org/a.tgz': None, 'ftp://ftp.example.net/b': None,
                 'https://data.example.com:8443/c': None, 'https://example.org/d': None,
                 'https://e.example/e': None, 'https://f.example/f': None}
  # One port per host (its first URL's), at most four hosts, in the order recorded.
  assert datasets._download_hosts(Builder()) == (
      ('example.org', 80), ('ftp.example.net', 21), ('data.example.com', 8443),
      ('e.example', 443))
  Builder.url_infos = {}
  assert datasets._download_hosts(Builder()) == (('storage.googleapis.com', 443),)


def test_a_data_directory_that_cannot_be_written_is_one_sentence_before_preparing(tmp_path,
                                                                                 monkeypatch):
  # It was a PermissionError traceback from the preparation lock (a shared read-only folder).
  shared = tmp_path / 'shared'
  shared.mkdir()
  access = os.access  # as root os.access allows everything: the refusal is simulated
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) != str(shared) and access(p, mode))
  with pytest.raises(ValueError) as error:
    datasets.load('digits', 'train', data_dir=shared)
  assert_one_sentence(str(error.value), "'digits' is not prepared in", 'jaxlab_digits',
                      f'permission denied on the folder {shared}', 'data_dir=')
  assert not os.listdir(shared)


def _truncate(path, size):
  with open(path, 'r+b') as f:
    f.truncate(size)


@pytest.mark.parametrize('damage, split, why', [
    (lambda v: _truncate(v / 'jaxlab_digits-train.array_record-00000-of-00001', 1000), 'train',
     "split 'train': ArrayRecord file should be at least 64KB big"),
    (lambda v: os.remove(v / 'jaxlab_digits-test.array_record-00000-of-00001'), 'test',
     "split 'test': open() failed: No such file or directory"),
    (lambda v: _truncate(v / 'dataset_info.json', 200), 'train',
     'its dataset_info.json: Failed to load JSON'),
])
def test_a_damaged_prepared_data_set_is_one_sentence_and_removing_it_prepares_it_again(
    tmp_path, damage, split, why):
  # Each was a traceback (RuntimeError, protobuf's ParseError), the first only on reading.
  datasets.load('digits', 'train', data_dir=tmp_path)
  version_dir = tmp_path / 'jaxlab_digits' / '1.0.0'
  damage(version_dir)
  with pytest.raises(ValueError) as error:
    datasets.load('digits', split, data_dir=tmp_path)
  assert_one_sentence(str(error.value), f"'digits' in {version_dir} is damaged ({why}",
                      'remove that folder to prepare it again')
  shutil.rmtree(version_dir)
  sizes = {'train': 1437, 'test': 360}
  assert len(datasets.load('digits', split, data_dir=tmp_path)) == sizes[split]
