"""The augmentation grid covers every transform and draws the images it reads."""

import gzip
import os
import struct
import subprocess
import sys

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

from data import augment
from experiments import augmentation_grid
from tests.subprocess_util import REPO_ROOT


def _write_idx_gz(path, array_uint8):
  header = bytes([0, 0, 0x08, array_uint8.ndim]) + struct.pack(
      f'>{array_uint8.ndim}I', *array_uint8.shape)
  path.write_bytes(gzip.compress(header + array_uint8.tobytes()))


@pytest.fixture
def fashion_dir(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (5, 12, 12), dtype=np.uint8)
  labels = np.array([3, 0, 9, 3, 7], np.uint8)
  _write_idx_gz(tmp_path / 'train-images-idx3-ubyte.gz', images)
  _write_idx_gz(tmp_path / 'train-labels-idx1-ubyte.gz', labels)
  return tmp_path, images, labels


def test_grid_has_one_valid_row_per_registered_transform():
  names = [name for name, _ in augmentation_grid.GRID]
  assert sorted(names) == sorted(augment.TRANSFORMS)
  augment.build_augmentation(augmentation_grid.GRID)  # Checks every stage's parameters.


def test_load_images_scales_the_first_images(fashion_dir):
  directory, images, labels = fashion_dir
  loaded, classes = augmentation_grid.load_images(str(directory), 3)
  np.testing.assert_allclose(loaded[..., 0], images[:3] / 255, atol=1e-7)
  np.testing.assert_array_equal(classes, labels[:3])
  with pytest.raises(ValueError, match=r'num_images=6 must be in \[1, 5\]'):
    augmentation_grid.load_images(str(directory), 6)
  loaded, classes = augmentation_grid.load_images(str(directory), 5)  # every image of the file
  np.testing.assert_allclose(loaded[..., 0], images / 255, atol=1e-7)
  np.testing.assert_array_equal(classes, labels)


def test_make_grid_draws_the_tinted_inputs_and_their_augmentations(fashion_dir, tmp_path,
                                                                   monkeypatch):
  # Two stages keep this fast; the test above checks that GRID covers every transform.
  monkeypatch.setattr(augmentation_grid, 'GRID',
                      (('horizontal_flip', {'p': 1.0}), ('mixup', {'alpha': 1.0})))
  directory, images, labels = fashion_dir
  output = tmp_path / 'grid.png'
  rows = augmentation_grid.make_grid(str(directory), str(output), num_images=3)
  assert [title for title, _, _ in rows] == ['original', 'horizontal_flip', 'mixup']
  _, originals, original_labels = rows[0]
  np.testing.assert_allclose(originals, augmentation_grid.tint(images[:3, :, :, None] / 255),
                             atol=1e-6)
  np.testing.assert_array_equal(original_labels.argmax(axis=1), labels[:3])
  np.testing.assert_array_equal(rows[1][1], originals[:, :, ::-1])
  _, mixed, mixed_labels = rows[2]
  assert mixed.shape == (3, 12, 12, 3) and 0 <= mixed.min() and mixed.max() <= 1
  np.testing.assert_allclose(mixed_labels.sum(axis=1), 1, atol=1e-6)
  # The three classes differ, so each mixed one-hot label names the example and its partner:
  # λ at the example's class and 1 - λ at the partner's.
  example_of_class = {k: n for n, k in enumerate(labels[:3])}
  mixed_rows = 0
  for i, label in enumerate(mixed_labels):
    weight = label[labels[i]]
    others = [k for k in np.nonzero(label > 1e-6)[0] if k != labels[i]]
    assert len(others) <= 1
    j = example_of_class[others[0]] if others else i
    np.testing.assert_allclose(mixed[i], weight * originals[i] + (1 - weight) * originals[j],
                               atol=1e-5)
    mixed_rows += j != i
  assert mixed_rows > 0
  picture = matplotlib.image.imread(output)
  assert picture.ndim == 3 and min(picture.shape[:2]) > 100 and picture.std() > 0


def test_the_test_split_draws_the_t10k_images(fashion_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(augmentation_grid, 'GRID', ())  # the input row alone
  directory, train_images, _ = fashion_dir
  test_images = 255 - train_images[:4]
  _write_idx_gz(directory / 't10k-images-idx3-ubyte.gz', test_images)
  _write_idx_gz(directory / 't10k-labels-idx1-ubyte.gz', np.array([1, 2, 3, 4], np.uint8))
  [(title, originals, labels)] = augmentation_grid.make_grid(
      str(directory), str(tmp_path / 'grid.png'), num_images=2, split='test')
  assert title == 'original'
  np.testing.assert_allclose(originals, augmentation_grid.tint(test_images[:2, :, :, None] / 255),
                             atol=1e-6)
  np.testing.assert_array_equal(labels.argmax(axis=1), [1, 2])


def test_tint_keeps_black_and_gives_each_image_its_own_hue():
  tinted = augmentation_grid.tint(np.ones((4, 2, 2, 1), np.float32))
  assert np.all(augmentation_grid.tint(np.zeros((4, 2, 2, 1), np.float32)) == 0)
  hues = matplotlib.colors.rgb_to_hsv(tinted[:, 0, 0])[:, 0]
  np.testing.assert_allclose(hues, [0, 0.25, 0.5, 0.75], atol=1e-6)


def _script_error(*flags) -> str:
  result = subprocess.run([sys.executable, 'experiments/augmentation_grid.py', *flags],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 1, result.stderr[-2000:]
  (line,) = result.stderr.strip().splitlines()  # one sentence, no traceback
  return line


def test_the_script_refuses_a_folder_without_the_files_and_an_unwritable_output(fashion_dir,
                                                                               tmp_path):
  directory, _, _ = fashion_dir
  empty = tmp_path / 'empty'
  empty.mkdir()
  assert _script_error(f'--fashion_mnist_dir={empty}', f'--output={tmp_path}/grid.png') == (
      f"error: '{empty}/train-images-idx3-ubyte.gz' does not exist: --fashion_mnist_dir must "
      'hold the Fashion-MNIST IDX .gz files.')
  assert _script_error(f'--fashion_mnist_dir={directory}', f'--output={empty}') == (
      f'error: --output={empty} is a folder; give the file to write in it.')
  assert not os.listdir(empty)


def test_captions_name_the_two_largest_label_weights_above_half_a_percent():
  label = np.zeros(10, np.float32)
  label[[1, 3, 8]] = [0.25, 0.7, 0.05]
  assert augmentation_grid._caption(label) == 'Dress 0.70\nTrouser 0.25'
  # A one-hot label, and a mix whose partner weighs under 0.005, show one line.
  assert augmentation_grid._caption(np.eye(10, dtype=np.float32)[9]) == 'Ankle boot 1.00'
  label = np.zeros(10, np.float32)
  label[[0, 2]] = [0.996, 0.004]
  assert augmentation_grid._caption(label) == 'T-shirt/top 1.00'
