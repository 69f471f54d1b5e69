"""Fashion-MNIST from its four IDX files, with the TFDS catalog's features and splits.

Xiao, Rasul & Vollgraf (2017), zalandoresearch/fashion-mnist: 28×28 grayscale
article images in 10 classes, train 60,000 and test 10,000. As in the catalog
builder `fashion_mnist` (3.0.1): 'image' uint8 (28, 28, 1) and 'label' a
ClassLabel with the names below. The catalog stores images PNG-encoded, which
needs TensorFlow to write; here they are stored raw, and decode to the same
arrays. Records keep the order of the IDX files.

The files are read from a folder: `source_dir`, else $FASHION_MNIST_DIR, else
where Debian's package `dataset-fashion-mnist` installs them.
"""

import os

import numpy as np
import tensorflow_datasets as tfds

from data import idx
from data.builders import sources

LABEL_NAMES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal',
               'Shirt', 'Sneaker', 'Bag', 'Ankle boot')
SPLIT_FILES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}


class FashionMnist(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Reads the IDX files from the folder given as the download config's manual_dir."""

  name = 'jaxlab_fashion_mnist'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = tuple(SPLIT_FILES)
  SOURCE_FILES = tuple(f for pair in SPLIT_FILES.values() for f in pair)
  SOURCE_ENV_VAR = 'FASHION_MNIST_DIR'
  # Listed in the file list of Debian's dataset-fashion-mnist
  # (0.0~git20200523.55506a9-1).
  SOURCE_DEFAULT_DIRS = ('/usr/share/datasets/fashion-mnist',)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Put the four .gz IDX files of https://github.com/zalandoresearch/fashion-mnist'
      ' in a folder and pass it as source_dir or in $FASHION_MNIST_DIR.')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
            'label': tfds.features.ClassLabel(names=LABEL_NAMES),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://github.com/zalandoresearch/fashion-mnist',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    folder = os.fspath(dl_manager.manual_dir)
    sources.write_record(self.data_dir, type(self), folder)  # renamed into place with the data
    return {split: self._generate_examples(*(os.path.join(folder, f) for f in files))
            for split, files in SPLIT_FILES.items()}

  def _generate_examples(self, images_path, labels_path):
    images, labels = idx.read_idx(images_path), idx.read_idx(labels_path)
    check_arrays(images, labels, images_path, labels_path)
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': image[..., None], 'label': int(label)}


def check_arrays(images, labels, images_path, labels_path) -> None:
  """ValueError in one sentence unless the files hold what Fashion-MNIST's do: images
  uint8 (N, 28, 28) and labels uint8 (N,) in 0..9 (IDX element type 0x08 for both)."""
  if (images.dtype != np.uint8 or labels.dtype != np.uint8 or images.shape[1:] != (28, 28)
      or labels.shape != images.shape[:1]):
    raise ValueError(f'{images_path} holds images {images.dtype.name} {images.shape} and '
                     f'{labels_path} labels {labels.dtype.name} {labels.shape}; expected uint8 '
                     f'(N, 28, 28) and uint8 (N,).')
  if labels.size and labels.max() >= len(LABEL_NAMES):
    position = int(np.argmax(labels >= len(LABEL_NAMES)))
    raise ValueError(f'{labels_path} holds label {labels[position]} at position {position}; '
                     f'the labels are 0 to {len(LABEL_NAMES) - 1}.')
