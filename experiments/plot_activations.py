r"""Plots every activation of `models.activations` and its derivative (by jax.grad), and
a maxout unit of three affine pieces (`models.layers.Maxout`).

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

from experiments import command_line
from models import activations
from models import layers

FLAGS = flags.FLAGS


# The maxout unit of the last panel: the largest of k = 3 affine pieces -x, x/2 and 2x - 3.
MAXOUT_PIECES = {'kernel': [[-1.0, 0.5, 2.0]], 'bias': [0.0, 0.0, -3.0]}


def maxout_unit(x: jnp.ndarray) -> jnp.ndarray:
  """A one-unit `models.layers.Maxout` on scalar inputs, with the pieces `MAXOUT_PIECES`."""
  params = {'params': {'Dense_0': {name: jnp.asarray(v) for name, v in MAXOUT_PIECES.items()}}}
  return layers.Maxout(features=1, pieces=3).apply(params, x[..., None])[..., 0]


def plot(path: str, lo: float = -4.0, hi: float = 4.0, columns: int = 4
         ) -> dict[str, tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]]:
  """Writes one panel per activation, φ and φ' = jax.grad(φ), to the PNG at `path`, and a
  panel of a maxout unit; returns each panel's (x, φ(x), φ'(x)) by title."""
  x = jnp.linspace(lo, hi, 801)
  functions = {name: activations.ACTIVATIONS[name] for name in sorted(activations.ACTIVATIONS)}
  functions['maxout (3 pieces)'] = maxout_unit
  rows = math.ceil(len(functions) / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows), squeeze=False)
  curves = {}
  for ax, (name, phi) in zip(axes.flat, functions.items()):
    curves[name] = x, phi(x), jax.vmap(jax.grad(phi))(x)
    ax.plot(x, curves[name][1], label='φ(x)')
    ax.plot(x, curves[name][2], '--', label="φ'(x)")
    ax.axhline(0, color='grey', linewidth=0.5)
    ax.axvline(0, color='grey', linewidth=0.5)
    ax.set_title(name)
    ax.grid(True, alpha=0.3)
  for ax in axes.flat[len(functions):]:
    ax.axis('off')
  axes.flat[0].legend(loc='upper left')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return curves


def define_flags() -> None:
  # Called only when run as a script, so that importing `plot` defines no flags.
  flags.DEFINE_string('workdir', None, 'Directory for the PNG.', required=True)
  flags.DEFINE_string('filename', 'activations.png', 'Name of the PNG inside the workdir.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  path = command_line.output_file(os.path.join(FLAGS.workdir, FLAGS.filename), 'filename')
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  plot(path)
  print(f'Wrote {path}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
