r"""Plots every activation of `models.activations` and its derivative (by jax.grad).

  python -m experiments.plot_activations --workdir=/tmp/plots
"""

import math
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from models import activations

FLAGS = flags.FLAGS


def plot(path: str, lo: float = -4.0, hi: float = 4.0, columns: int = 4) -> None:
  """Writes one panel per activation, φ and φ' = jax.grad(φ), to the PNG at `path`."""
  x = jnp.linspace(lo, hi, 801)
  names = sorted(activations.ACTIVATIONS)
  rows = math.ceil(len(names) / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows), squeeze=False)
  for ax, name in zip(axes.flat, names):
    phi = activations.ACTIVATIONS[name]
    ax.plot(x, phi(x), label='φ(x)')
    ax.plot(x, jax.vmap(jax.grad(phi))(x), '--', label="φ'(x)")
    ax.axhline(0, color='grey', linewidth=0.5)
    ax.axvline(0, color='grey', linewidth=0.5)
    ax.set_title(name)
    ax.grid(True, alpha=0.3)
  for ax in axes.flat[len(names):]:
    ax.axis('off')
  axes.flat[0].legend(loc='upper left')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def define_flags() -> None:
  # Called only when run as a script, so that importing `plot` defines no flags.
  flags.DEFINE_string('workdir', None, 'Directory for the PNG.', required=True)
  flags.DEFINE_string('filename', 'activations.png', 'Name of the PNG inside the workdir.')


def main(argv):
  del argv
  os.makedirs(FLAGS.workdir, exist_ok=True)
  path = os.path.join(FLAGS.workdir, FLAGS.filename)
  plot(path)
  print(f'Wrote {path}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
