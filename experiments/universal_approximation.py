r"""Approximating sin on [-π, π] with one-hidden-layer ReLU networks of growing width.

For every width the script measures the maximum error of two networks on a
fine grid: the ReLU network that equals the linear interpolant
on a uniform grid (error of order width⁻²), and an MLP of the same width
trained with Adam on samples of sin. It prints a table and writes a log–log
plot of error against width to the workdir.

  python -m experiments.universal_approximation --workdir=/tmp/ua
"""

import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import optax

from experiments import command_line
from models import universal_approximation
from models.mlp import MLP

FLAGS = flags.FLAGS

LO, HI = -np.pi, np.pi
EVAL_POINTS = 20001
TRAIN_POINTS = 512


def max_error(predict, x_N: np.ndarray) -> float:
  """max |sin(x) - predict(x)| over the points x_N."""
  return float(np.max(np.abs(np.asarray(predict(jnp.asarray(x_N, jnp.float32))) - np.sin(x_N))))


def train_network(width: int, steps: int, learning_rate: float, seed: int):
  """Fits MLP((width, 1)) to sin by full-batch Adam on the mean squared error."""
  model = MLP((width, 1), activation='relu')
  x_Nx1 = jnp.linspace(LO, HI, TRAIN_POINTS)[:, None]
  y_Nx1 = jnp.sin(x_Nx1)
  params = model.init(jax.random.key(seed), x_Nx1)
  # Decaying the step lets the fit settle instead of hovering at the noise level of Adam.
  optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

  def step(carry, _):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x_Nx1) - y_Nx1) ** 2))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  (params, _), _ = jax.jit(lambda c: jax.lax.scan(step, c, length=steps))((params, optimizer.init(params)))
  return lambda x_N: model.apply(params, x_N[:, None])[:, 0]


def run(widths: list[int], train_steps: int, learning_rate: float, seed: int) -> list[tuple[int, float, float]]:
  """Returns (width, construction error, trained error or NaN) rows."""
  x_N = np.linspace(LO, HI, EVAL_POINTS)
  rows = []
  for width in widths:
    constructed = universal_approximation.interpolating_network(np.sin, LO, HI, width)
    trained = max_error(train_network(width, train_steps, learning_rate, seed), x_N) if train_steps else np.nan
    rows.append((width, max_error(constructed, x_N), trained))
    print(f'{width:>6d}  {rows[-1][1]:>14.3e}  {rows[-1][2]:>12.3e}', flush=True)
  return rows


def plot(rows: list[tuple[int, float, float]], path: str) -> None:
  widths, constructed, trained = (np.array(column) for column in zip(*rows))
  fig, ax = plt.subplots(figsize=(6, 4.5))
  ax.loglog(widths, constructed, 'o-', label='construction (the linear interpolant)')
  if not np.all(np.isnan(trained)):
    ax.loglog(widths, trained, 's-', label='trained with Adam')
  h = (HI - LO) / (widths - 3)
  ax.loglog(widths, h**2 / 8, 'k--', linewidth=1, label='bound h²/8, h = 2π/(width − 3)')
  ax.set_xlabel('hidden width')
  ax.set_ylabel('max |sin(x) − network(x)| on [−π, π]')
  ax.set_title('One-hidden-layer ReLU networks approximating sin')
  ax.grid(True, which='both', alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Directory for the plot and the table.', required=True)
  flags.DEFINE_list('widths', ['4', '8', '16', '32', '64', '128', '256'], 'Hidden widths.')
  flags.DEFINE_integer('train_steps', 5000, 'Adam steps per trained network; 0 skips training.',
                       lower_bound=0)
  flags.DEFINE_float('learning_rate', 1e-2, 'Initial Adam learning rate, cosine-decayed to 0.')
  flags.register_validator('learning_rate', lambda v: 0 < v < float('inf'),
                           '--learning_rate must be positive and finite.')
  flags.DEFINE_integer('seed', 0, 'Seed of the trained networks.')


def main(argv):
  del argv
  command_line.work_directory(FLAGS.workdir)
  widths = command_line.integers_at_least(
      FLAGS.widths, 'widths', 4, 'the interpolating network uses width - 2 grid points, two or more')
  try:  # both before the work, so that neither earlier file is replaced by a run that fails
    table = command_line.record_file(FLAGS.workdir, 'universal_approximation.tsv',
                                     'the errors are written to')
    path = command_line.record_file(FLAGS.workdir, 'universal_approximation.png',
                                    'the figure is written to')
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  os.makedirs(FLAGS.workdir, exist_ok=True)
  print(f'{"width":>6}  {"construction":>14}  {"trained":>12}')
  rows = run(widths, FLAGS.train_steps, FLAGS.learning_rate, FLAGS.seed)
  with open(table, 'w') as f:
    f.write('width\tconstruction_max_error\ttrained_max_error\n')
    f.writelines(f'{w}\t{c:.6e}\t{t:.6e}\n' for w, c, t in rows)
  plot(rows, path)
  print(f'Wrote {path}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
