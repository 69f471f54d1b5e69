"""scikit-learn's bundled handwritten digits, with a fixed stratified split.

`sklearn.datasets.load_digits`: the 1,797 test images of the UCI "Optical
Recognition of Handwritten Digits" set, 8×8, each pixel the count of set pixels
in a 4×4 block of a 32×32 bitmap, so an integer 0..16; stored as uint8 without
rescaling. The set has no official split: 'test' is the 360 images picked by
`train_test_split(test_size=360, stratify=labels, random_state=0)` (scikit-learn
1.9.1) and 'train' the other 1,437, each in bundled order.
"""

import numpy as np
import tensorflow_datasets as tfds

TEST_SIZE = 360
SEED = 0


class Digits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Images (8, 8, 1) uint8 in 0..16 and their digit."""

  name = 'jaxlab_digits'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = ('train', 'test')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://archive.ics.uci.edu/dataset/80',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    images, labels = load_arrays()
    indices = split_indices(labels)
    return {name: self._generate_examples(images, labels, index)
            for name, index in indices.items()}

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {'image': images[i], 'label': int(labels[i])}


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 images as (N, 8, 8, 1) uint8 and their labels as int64."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  bunch = datasets.load_digits()
  images = bunch.images.astype(np.uint8)[..., None]
  return images, bunch.target.astype(np.int64)


def split_indices(labels: np.ndarray) -> dict[str, np.ndarray]:
  """Sorted indices of 'train' and 'test' (see the module docstring)."""
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  train, test = model_selection.train_test_split(
      np.arange(len(labels)), test_size=TEST_SIZE, stratify=labels,
      random_state=SEED)
  return {'train': np.sort(train), 'test': np.sort(test)}
