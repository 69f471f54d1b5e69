"""Draws every augmentation of data/augment.py on real Fashion-MNIST images.

Usage:
  python -m experiments.augmentation_grid --fashion_mnist_dir=DIR --output=grid.png

DIR holds the IDX files train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz
(or the t10k-* pair with --split=test). Fashion-MNIST is grayscale, so each
image is tinted with its own hue: the colour transforms (saturation, hue,
jitter, grayscale) then visibly act on it. One row per transform, one column
per image; the first row holds the inputs. Mixup and cutmix tiles are captioned
with their two largest label weights.
"""

import os
import sys

from absl import app
from absl import flags
import jax
from matplotlib import colors
from matplotlib import figure as mpl_figure
import numpy as np

from data import augment
from data import idx
from data.builders import fashion_mnist
from experiments import command_line

FLAGS = flags.FLAGS

CLASS_NAMES = fashion_mnist.LABEL_NAMES

# Magnitudes are larger than a training default so that each effect is plain to see.
GRID = (
    ('horizontal_flip', {'p': 1.0}),
    ('vertical_flip', {'p': 1.0}),
    ('rotation', {'max_degrees': 40.0}),
    ('translation', {'max_fraction': 0.2}),
    ('zoom', {'scale': (0.6, 1.4)}),
    ('random_crop', {'padding': 6}),
    ('affine', {'max_degrees': 25.0, 'max_fraction': 0.15, 'scale': (0.8, 1.2),
                'max_shear_degrees': 25.0}),
    ('brightness', {'max_delta': 0.7}),
    ('contrast', {'max_delta': 0.8}),
    ('saturation', {'max_delta': 1.0}),
    ('hue', {'max_delta': 0.5}),
    ('color_jitter', {'brightness': 0.5, 'contrast': 0.5, 'saturation': 0.8, 'hue': 0.3}),
    ('grayscale', {'p': 1.0}),
    ('gaussian_noise', {'std': 0.1}),
    ('salt_and_pepper', {'amount': 0.08}),
    ('elastic', {'alpha': 34.0, 'sigma': 4.0}),
    ('cutout', {'size': 12}),
    ('random_erasing', {'area': (0.1, 0.3)}),
    ('mixup', {'alpha': 1.0}),
    ('cutmix', {'alpha': 1.0}),
)


def load_images(directory: str, count: int, split: str = 'train') -> tuple[np.ndarray, np.ndarray]:
  """First `count` images as float (N, 28, 28, 1) in [0, 1], and their class indices."""
  images_file, labels_file = fashion_mnist.SPLIT_FILES[split]
  for name in (images_file, labels_file):
    if not os.path.isfile(os.path.join(directory, name)):
      raise FileNotFoundError(f'{os.path.join(directory, name)!r} does not exist: '
                              '--fashion_mnist_dir must hold the Fashion-MNIST IDX .gz files.')
  images = idx.read_idx(os.path.join(directory, images_file))
  labels = idx.read_idx(os.path.join(directory, labels_file))
  if not 1 <= count <= len(images):
    raise ValueError(f'num_images={count} must be in [1, {len(images)}].')
  return (images[:count, :, :, None] / 255.0).astype(np.float32), labels[:count].astype(np.int64)


def tint(images_Nx28x28x1: np.ndarray) -> np.ndarray:
  """Colours image n with a saturated hue n/N, so black stays black."""
  count = images_Nx28x28x1.shape[0]
  hues = np.stack([np.arange(count) / count, np.full(count, 0.8), np.ones(count)], axis=-1)
  colours_Nx3 = colors.hsv_to_rgb(hues)
  return (images_Nx28x28x1 * colours_Nx3[:, None, None, :]).astype(np.float32)


def augmentation_rows(key: jax.Array, images_NxHxWxC: np.ndarray,
                      labels_NxK: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
  """(title, images, labels) for the inputs and then each GRID stage applied to them alone."""
  batch = {'image': images_NxHxWxC, 'label': labels_NxK}
  rows = [('original', images_NxHxWxC, labels_NxK)]
  for stage, stage_key in zip(GRID, jax.random.split(key, len(GRID))):
    out = augment.build_augmentation([stage])(stage_key, batch)
    rows.append((stage[0], np.asarray(out['image']), np.asarray(out['label'])))
  return rows


def _caption(label_K: np.ndarray) -> str:
  top = np.argsort(label_K)[::-1][:2]
  return '\n'.join(f'{CLASS_NAMES[k]} {label_K[k]:.2f}' for k in top if label_K[k] > 0.005)


def render(rows, path: str) -> None:
  """Writes the rows as one PNG grid with the transform names on the left."""
  count = rows[0][1].shape[0]
  # A bare Figure renders with Agg whatever backend pyplot would pick.
  figure = mpl_figure.Figure(figsize=(1.3 * count + 1.4, 1.45 * len(rows)))
  axes = figure.subplots(len(rows), count, squeeze=False)
  for (title, images, labels), row_axes in zip(rows, axes):
    for n, axis in enumerate(row_axes):
      axis.imshow(np.clip(images[n], 0, 1), interpolation='nearest')
      axis.set_xticks([])
      axis.set_yticks([])
      if title in ('original', 'mixup', 'cutmix'):
        axis.set_xlabel(_caption(labels[n]), fontsize=6, labelpad=1)
    row_axes[0].set_ylabel(title, rotation=0, ha='right', va='center', fontsize=9)
  figure.tight_layout(pad=0.3, h_pad=0.2, w_pad=0.2)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path, dpi=110)


def make_grid(fashion_mnist_dir: str, output: str, num_images: int = 6, split: str = 'train',
              seed: int = 0):
  """Reads the images, augments them and writes the grid; returns the rows drawn."""
  gray, classes = load_images(fashion_mnist_dir, num_images, split)
  labels = np.eye(len(CLASS_NAMES), dtype=np.float32)[classes]
  rows = augmentation_rows(jax.random.key(seed), tint(gray), labels)
  render(rows, output)
  return rows


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('fashion_mnist_dir', None, 'Folder with the Fashion-MNIST IDX .gz files.',
                      required=True)
  flags.DEFINE_string('output', None, 'Path of the PNG to write.', required=True)
  flags.DEFINE_enum('split', 'train', list(fashion_mnist.SPLIT_FILES),
                    'Which Fashion-MNIST split to read.')
  flags.DEFINE_integer('num_images', 6, 'Images (columns) in the grid.', lower_bound=1)
  flags.DEFINE_integer('seed', 0, 'PRNG seed of the augmentations.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  command_line.output_file(FLAGS.output, 'output')
  try:
    make_grid(FLAGS.fashion_mnist_dir, FLAGS.output, FLAGS.num_images, FLAGS.split, FLAGS.seed)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  print(f'wrote {FLAGS.output}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
