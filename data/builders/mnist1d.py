"""MNIST-1D: 5,000 one-dimensional digit signals made by the published generator.

Greydanus & Steinbach, "Scaling down deep learning with MNIST-1D" (ICML 2024),
package `mnist1d`: `make_dataset(get_dataset_args())`, i.e. 10 templates, 500
signals per class, length 40, seed 42; the first 80% (4,000) are train and the
last 1,000 test. The package's `get_dataset` downloads a pickle by default;
`make_dataset` only computes, so preparing needs no network.
"""

import random

import numpy as np
import tensorflow_datasets as tfds


class Mnist1d(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Record `i` of a split is signal `i` of the generator's output for it."""

  name = 'jaxlab_mnist1d'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = ('train', 'test')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'x': tfds.features.Tensor(shape=(40,), dtype=np.float32),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('x', 'label'),
        homepage='https://github.com/greydanus/mnist1d',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    arrays = generate()
    return {
        'train': self._generate_examples(arrays['x'], arrays['y']),
        'test': self._generate_examples(arrays['x_test'], arrays['y_test']),
    }

  def _generate_examples(self, signals, labels):
    for i, (x, label) in enumerate(zip(signals, labels)):
      yield i, {'x': x.astype(np.float32), 'label': int(label)}


def generate() -> dict:
  """`make_dataset` with the package's default arguments (float64 signals)."""
  # Imported here because the package pulls in matplotlib, which only
  # preparing needs.
  from mnist1d import data  # pylint: disable=g-import-not-at-top
  # The generator reseeds Python's and NumPy's global generators; the caller's
  # streams should not depend on whether a data set was prepared.
  numpy_state, python_state = np.random.get_state(), random.getstate()
  try:
    return data.make_dataset(data.get_dataset_args())
  finally:
    np.random.set_state(numpy_state)
    random.setstate(python_state)
