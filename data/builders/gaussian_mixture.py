"""2-D Gaussian mixtures with exact densities and scores (data/toy2d.py), as a data set.

Records {'x': float32 (2,)}: 'train' 10,000 and 'test' 2,000 points of the mixture named by
the builder's `mixture` option ('ring': 8 components on a circle of radius 2, std 0.2, the
default; 'grid': 3 × 3), drawn by `toy2d.dataset(mixture)` (JAX's threefry generator, seed
0; each split from its own key). Each mixture is its own configuration, prepared in
`jaxlab_gaussian_mixture/<mixture>/`.
"""

import numpy as np
import tensorflow_datasets as tfds

from data import toy2d


class GaussianMixture(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Points (2,) float32 of a 2-D Gaussian mixture."""

  name = 'jaxlab_gaussian_mixture'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = ('train', 'test')
  # Keyword arguments `data.load` passes on (see data/datasets.py).
  OPTIONS = ('mixture',)
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in toy2d.MIXTURES]

  def __init__(self, *, mixture: str = 'ring', **kwargs):
    if mixture not in toy2d.MIXTURES:
      raise ValueError(f'The gaussian_mixture option mixture={mixture!r}; allowed: '
                       f'{", ".join(toy2d.MIXTURES)}.')
    self.mixture = mixture
    super().__init__(config=mixture, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__,
        features=tfds.features.FeaturesDict({'x': tfds.features.Tensor(shape=(2,),
                                                                       dtype=np.float32)}),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    points = toy2d.dataset(self.mixture)
    return {split: self._generate_examples(points[split]) for split in self.SPLITS}

  def _generate_examples(self, points_Nx2):
    for i, x in enumerate(points_Nx2):
      yield i, {'x': x}
