"""IDX reader against hand-built files and, when present, the real Fashion-MNIST."""

import gzip
import os
import struct

import numpy as np
import pytest

from data import idx
from data.builders import fashion_mnist

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION_MNIST_DIR = os.environ.get(
    'FASHION_MNIST_DIR', os.path.join(_REPO, '..', 'shared', 'data', 'fashion-mnist'))


def _idx_bytes(type_code, shape, big_endian_data):
  """Builds an IDX file by hand from the documented layout."""
  return (bytes([0, 0, type_code, len(shape)]) + struct.pack(f'>{len(shape)}I', *shape)
          + big_endian_data)


@pytest.mark.parametrize('type_code, dtype', [
    (0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32),
    (0x0D, np.float32), (0x0E, np.float64)])
@pytest.mark.parametrize('compress', [False, True])
def test_reads_every_element_type(tmp_path, type_code, dtype, compress):
  offset = 0 if dtype == np.uint8 else 50
  expected = (np.arange(24) * 5 - offset).reshape(2, 3, 4).astype(dtype)
  raw = _idx_bytes(type_code, expected.shape, expected.astype(expected.dtype.newbyteorder('>'))
                   .tobytes())
  path = tmp_path / ('x.idx.gz' if compress else 'x.idx')
  path.write_bytes(gzip.compress(raw) if compress else raw)
  array = idx.read_idx(path)
  assert array.dtype == dtype and array.dtype.isnative
  np.testing.assert_array_equal(array, expected)


def test_reads_big_endian_sizes_and_values(tmp_path):
  path = tmp_path / 'labels.idx'
  path.write_bytes(bytes([0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 0, 0xFF, 0xFF, 0xFF, 0xFE]))
  np.testing.assert_array_equal(idx.read_idx(path), [256, -2])


@pytest.mark.parametrize('content, message', [
    (b'\x00\x01\x08\x01\x00\x00\x00\x01\x05', "magic number '00010801' is not 0000TTNN"),
    (b'\x00\x00\x07\x01\x00\x00\x00\x01\x05', "magic number '00000701'"),
    (b'\x00\x00', "magic number '0000'"),
    (b'\x00\x00\x08\x03\x00\x00\x00\x02', 'truncated: its header needs 16 bytes'),
    (b'\x00\x00\x08\x02\x00\x00\x00\x02\x00\x00\x00\x02\x01\x02\x03',
     r'has 15 bytes but its header declares a \(2, 2\) array of uint8, which needs 16'),
])
def test_bad_files_raise_value_errors_naming_the_file(tmp_path, content, message):
  path = tmp_path / 'bad.idx'
  path.write_bytes(content)
  with pytest.raises(ValueError, match=message) as error:
    idx.read_idx(path)
  assert str(path) in str(error.value)


def test_truncated_gzip_names_the_file(tmp_path):
  path = tmp_path / 'bad.idx.gz'
  path.write_bytes(gzip.compress(_idx_bytes(0x08, (100,), bytes(100)))[:-10])
  with pytest.raises(ValueError, match=f'{path} is a truncated or corrupt gzip file'):
    idx.read_idx(path)


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR), reason='Fashion-MNIST not available')
def test_real_fashion_mnist_train_split():
  images = idx.read_idx(os.path.join(FASHION_MNIST_DIR, 'train-images-idx3-ubyte.gz'))
  labels = idx.read_idx(os.path.join(FASHION_MNIST_DIR, 'train-labels-idx1-ubyte.gz'))
  assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
  assert labels.shape == (60000,) and set(np.unique(labels)) == set(range(10))
  assert images.max() == 255 and images.min() == 0


@pytest.mark.parametrize('content, message', [
    # Trailing bytes after the declared elements: the sizes do not describe the file.
    (_idx_bytes(0x08, (2, 2), bytes(5)), r'has 17 bytes .* which needs 16'),
    # A header one byte short of its two sizes.
    (b'\x00\x00\x08\x02\x00\x00\x00\x02\x00\x00\x00', 'truncated: its header needs 12 bytes, the file has 11'),
])
def test_files_whose_length_disagrees_with_the_header_are_refused(tmp_path, content, message):
  path = tmp_path / 'bad.idx'
  path.write_bytes(content)
  with pytest.raises(ValueError, match=message):
    idx.read_idx(path)


def test_a_file_shorter_than_the_magic_number_is_a_value_error(tmp_path):
  # Three bytes: the dimension count, the fourth, is missing (an IndexError would escape).
  path = tmp_path / 'short.idx'
  path.write_bytes(b'\x00\x00\x08')
  with pytest.raises(ValueError, match="magic number '000008'"):
    idx.read_idx(path)


@pytest.mark.parametrize('shape', [(0,), (0, 28, 28), (3, 0)])
def test_arrays_without_elements_are_read_from_their_header_alone(tmp_path, shape):
  # The file is exactly 4 + 4 * ndim bytes: a header and no data.
  path = tmp_path / 'empty.idx'
  path.write_bytes(_idx_bytes(0x0D, shape, b''))
  array = idx.read_idx(path)
  assert array.shape == shape and array.dtype == np.float32


def test_corrupt_gzip_data_names_the_file(tmp_path):
  # Intact gzip header, then a deflate block of the reserved type 0b11: zlib's error, not a
  # truncation.
  compressed = bytearray(gzip.compress(_idx_bytes(0x08, (100,), bytes(100))))
  compressed[10] = 0xFF
  path = tmp_path / 'bad.idx.gz'
  path.write_bytes(bytes(compressed))
  with pytest.raises(ValueError, match=f'{path} is a truncated or corrupt gzip file'):
    idx.read_idx(path)


_IMAGES = np.zeros((3, 28, 28), np.uint8)


def test_fashion_mnist_labels_0_to_9_one_per_image_pass():
  fashion_mnist.check_arrays(_IMAGES, np.array([0, 9, 5], np.uint8), 'images', 'labels')


@pytest.mark.parametrize('labels, message', [
    (np.array([0, 10, 9], np.uint8), 'label 10 at position 1'),  # just past the 10 names
    (np.array([0, 10, 12], np.uint8), 'label 10 at position 1'),  # the first, not the largest
    (np.array([0, 1], np.uint8), r'labels uint8 \(2,\)'),  # fewer labels than images
    (np.array([0, 1, 2, 3], np.uint8), r'labels uint8 \(4,\)'),
    (np.array([0, 1, 2], np.int32), r'labels int32 \(3,\)'),  # IDX type 0x0C, not 0x08
])
def test_fashion_mnist_labels_outside_the_idx_contents_are_refused(labels, message):
  with pytest.raises(ValueError, match=message):
    fashion_mnist.check_arrays(_IMAGES, labels, 'images', 'labels')


def test_fashion_mnist_label_names_are_the_published_table():
  # zalandoresearch/fashion-mnist README, "Labels": label 0 … 9.
  assert fashion_mnist.LABEL_NAMES == ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
                                       'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot')


@pytest.mark.parametrize('shape', [(3, 28, 27), (3, 28, 28, 1), (3, 784)])
def test_fashion_mnist_images_other_than_28_by_28_are_refused(shape):
  with pytest.raises(ValueError, match=r'images uint8 \(3, '):
    fashion_mnist.check_arrays(np.zeros(shape, np.uint8), np.zeros(3, np.uint8), 'images',
                               'labels')
