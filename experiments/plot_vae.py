r"""Reconstructions, prior samples and the 2-D latent map of a trained VAE.

  python -m experiments.plot_vae --workdir=workdirs/fashion_mnist_vae_2d [--num=8 --seed=0] \
      [--output=PNG]

Reads the run's `config.json` and latest checkpoint (the parameter EMA when the
run kept one) and prepares test images as the run's 'vae' task does (pixels/255,
or dequantised (pixels + u)/256 with u from `--seed`). For the VAE of Kingma &
Welling (2014), q(z|x) = N(μ(x), diag σ²(x)), p(z) = N(0, I), it draws

  1. `--num` test images x and their reconstructions E[x | z = μ(x)], the decoder mean
     (σ(logits) of a Bernoulli decoder, the mean of a Gaussian one);
  2. 16 samples E[x | z], z ~ p(z), from the prior (decoder means, not draws of p(x|z));
  3. when K = latent_dim = 2: μ(x) of up to 5,000 test images coloured by class, and the
     decoder means on a 15×15 grid of z over [−3, 3]² (the prior's ±3σ square, as in the
     paper's Fig. 4 manifold, which spaces z through the Gaussian's inverse CDF instead);
     otherwise a note that there is no 2-D map.

Writes `<workdir>/vae.png` (or --output). `figure_data` returns the numbers, `plot`
draws them; `compute` holds the arithmetic on a module and its variables.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

OUTPUT_FILE = 'vae.png'
MAX_NUM = 32  # reconstructions in one row of the figure
NUM_PRIOR_SAMPLES = 16  # a 4×4 mosaic
MAP_EXAMPLES = 5000
GRID_SIZE = 15
GRID_LIMIT = 3.0


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Work directory of a trained VAE run.', required=True)
  flags.DEFINE_integer('num', 8, f'Test images reconstructed (1 … {MAX_NUM}).')
  flags.DEFINE_integer('seed', 0, 'Seed of the prior samples and of the dequantisation noise.')
  flags.DEFINE_string('output', None, 'PNG to write (default: in the work directory).')


def _decoder_mean(module, z_NxK):
  """E[x|z]: σ(logits) of a Bernoulli decoder, the mean of a Gaussian one, in [0, 1]."""
  out, log_var = module.decode(z_NxK)
  return jax.nn.sigmoid(out) if log_var is None else out


def latent_grid(size: int = GRID_SIZE, limit: float = GRID_LIMIT) -> np.ndarray:
  """z [size, size, 2] on [−limit, limit]², z[i, j] = (z₁ of column j, z₂ of row i), z₂
  decreasing down the rows so that the mosaic of row i, column j has the axes of a plot."""
  ticks = np.linspace(-limit, limit, size, dtype=np.float32)
  z1_SxS, z2_SxS = np.meshgrid(ticks, ticks[::-1])
  return np.stack([z1_SxS, z2_SxS], axis=-1)


def compute(module, variables, images_NxHxWxC, labels_N, rng: jax.Array, *, num: int) -> dict:
  """The figure's arrays for prepared images (as the model sees them) and their labels.

  'inputs', 'reconstructions' [num, H, W, C]: images[:num] and E[x | z = μ(x)];
  'prior_samples' [16, H, W, C]: E[x | z], z ~ N(0, I) from `rng`; 'latent_dim' K;
  when K = 2 also 'map_means' [M, 2] = μ(x) of images[:5000] and their 'map_labels' [M],
  'grid_z' [15, 15, 2] (`latent_grid`) and 'grid_images' [15, 15, H, W, C] = E[x | grid_z].
  """
  two_d = module.latent_dim == 2
  grid_z_SxSx2 = latent_grid()

  @jax.jit
  def arrays(variables, images_NxHxWxC, rng):
    def forward(module):
      mean_NxK, _ = module.encode(images_NxHxWxC)
      out = {'reconstructions': _decoder_mean(module, mean_NxK[:num]),
             'prior_samples': module.sample(NUM_PRIOR_SAMPLES, rng, mean=True)}
      if two_d:
        grid_images = _decoder_mean(module, jnp.asarray(grid_z_SxSx2.reshape(-1, 2)))
        out['map_means'] = mean_NxK
        out['grid_images'] = grid_images.reshape(grid_z_SxSx2.shape[:2] + grid_images.shape[1:])
      return out
    return module.apply(variables, method=forward)

  # One forward pass for both: the reconstructed images are the first of the map's.
  count = max(num, MAP_EXAMPLES) if two_d else num
  out = arrays(variables, jnp.asarray(images_NxHxWxC[:count], jnp.float32), rng)
  data = {'inputs': np.asarray(images_NxHxWxC[:num], np.float32), 'latent_dim': module.latent_dim,
          **{name: np.asarray(value) for name, value in out.items()}}
  if two_d:
    data.update(map_labels=np.asarray(labels_N[:count]), grid_z=grid_z_SxSx2)
  return data


def figure_data(workdir: str, num: int, seed: int) -> dict:
  """`compute` on the test images of the run in `workdir`, plus 'title' and 'class_names'; a
  bad input raises ValueError or FileNotFoundError in one sentence before anything compiles."""
  from data import datasets, pipeline  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop

  if not isinstance(num, int) or not 1 <= num <= MAX_NUM:
    raise ValueError(f'--num={num!r} is not allowed; reconstruct from 1 to {MAX_NUM} images.')
  if not workdir:
    raise ValueError('--workdir must name the work directory of a trained VAE run.')
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'The work directory {workdir!r} does not exist.')
  config = loop.read_config(workdir)
  if config.model.name != 'vae':
    raise ValueError(f"The run in {workdir!r} trained model {config.model.name!r}, not 'vae'.")
  _, eval_source, _, task, module = loop.build_parts(config, workdir)
  if num > len(eval_source):
    raise ValueError(f'--num={num} is more than the {len(eval_source)} images of the eval split.')
  state = checkpoint.restore_arrays(workdir)
  variables = checkpoint.eval_variables(state)

  count = min(len(eval_source), MAP_EXAMPLES) if module.latent_dim == 2 else num
  records = pipeline.read_batch(eval_source, np.arange(count))
  batch = {k: jnp.asarray(v) for k, v in task.preprocess(records).items()}

  @jax.jit  # one program, rather than one per eager operation
  def prepare(key, batch):
    transform_key, sample_key = jax.random.split(key)
    rngs = {name: jax.random.fold_in(transform_key, i) for i, name in enumerate(task.rng_streams)}
    return task.transform(rngs, batch, False)['input'], sample_key

  images, sample_key = prepare(jax.random.PRNGKey(seed), batch)
  labels = np.asarray(records['label']).reshape(-1) if 'label' in records else np.zeros(count, int)
  data = compute(module, variables, images, labels, sample_key, num=num)

  features = datasets.info(config.data.name, data_dir=config.data.get('data_dir'),
                           **dict(config.data.get('options', {}))).features
  label = features['label'] if 'label' in features else None
  names = getattr(label, 'names', None) or [str(c) for c in range(int(labels.max()) + 1)]
  data['class_names'] = np.array(names)
  data['title'] = (f'{config.model.name} ({module.decoder} decoder, K = {module.latent_dim}) on '
                   f'{config.data.name}, step {int(state["step"])}')
  return data


def mosaic(images_RxCxHxWxC, pad: int = 1) -> np.ndarray:
  """One [R(H + pad) − pad, C(W + pad) − pad(, 3)] image of a grid of images, white between."""
  rows, columns, height, width, channels = images_RxCxHxWxC.shape
  canvas = np.ones((rows * (height + pad) - pad, columns * (width + pad) - pad, channels),
                   np.float32)
  for r in range(rows):
    for c in range(columns):
      canvas[r * (height + pad):r * (height + pad) + height,
             c * (width + pad):c * (width + pad) + width] = images_RxCxHxWxC[r, c]
  canvas = np.clip(canvas, 0.0, 1.0)
  return canvas[..., 0] if channels == 1 else canvas


def _show(ax, image, title, **kwargs):
  ax.imshow(image, cmap='gray', vmin=0.0, vmax=1.0, **kwargs)
  ax.set_title(title, fontsize=10)


def plot(data: dict, path: str) -> None:
  """Draws `figure_data`'s arrays into the PNG `path`."""
  num = len(data['inputs'])
  height, width = data['inputs'].shape[1:3]
  fig = plt.figure(figsize=(max(12.0, 0.9 * num), 8.5))
  spec = fig.add_gridspec(2, 3, height_ratios=[1, 2.6], width_ratios=[1, 1.25, 1])

  ax = fig.add_subplot(spec[0, :])
  pairs = np.stack([data['inputs'], data['reconstructions']])
  _show(ax, mosaic(pairs), f'{num} test images x (top) and their reconstructions '
        'E[x | z = μ(x)] (bottom)')
  ax.set_xticks([])
  ax.set_yticks([(height - 1) / 2, height + 1 + (height - 1) / 2], ['x', 'E[x|μ(x)]'])

  ax = fig.add_subplot(spec[1, 0])
  side = int(np.sqrt(NUM_PRIOR_SAMPLES))
  samples = data['prior_samples'].reshape((side, side) + data['prior_samples'].shape[1:])
  _show(ax, mosaic(samples), f'{NUM_PRIOR_SAMPLES} prior samples: decoder mean\n'
        'E[x | z], z ~ N(0, I)')
  ax.axis('off')

  if 'map_means' not in data:
    ax = fig.add_subplot(spec[1, 1:])
    ax.text(0.5, 0.5, f'latent_dim = {data["latent_dim"]}: no 2-D map', ha='center',
            va='center', fontsize=14)
    ax.axis('off')
  else:
    ax = fig.add_subplot(spec[1, 1])
    means_Mx2, labels_M = data['map_means'], data['map_labels']
    colours = plt.get_cmap('tab10')
    for c, name in enumerate(data['class_names']):
      chosen = labels_M == c
      ax.scatter(means_Mx2[chosen, 0], means_Mx2[chosen, 1], s=2, alpha=0.5,
                 color=colours(c % 10), label=str(name), rasterized=True)
    ax.add_patch(plt.Rectangle((-GRID_LIMIT, -GRID_LIMIT), 2 * GRID_LIMIT, 2 * GRID_LIMIT,
                               fill=False, linestyle='--', color='k', linewidth=0.8))
    ax.set_xlabel('μ₁(x)')
    ax.set_ylabel('μ₂(x)')
    ax.set_aspect('equal', adjustable='datalim')
    ax.set_title(f'posterior means μ(x) of {len(labels_M)} test images\n'
                 f'(dashed: the square of the grid)', fontsize=10)
    ax.legend(fontsize=7, markerscale=4, loc='best', framealpha=0.8)

    ax = fig.add_subplot(spec[1, 2])
    step = 2 * GRID_LIMIT / (GRID_SIZE - 1)
    half = GRID_LIMIT + step / 2
    _show(ax, mosaic(data['grid_images']), f'decoder means E[x | z] on a {GRID_SIZE}×'
          f'{GRID_SIZE} grid\nof z over [−{GRID_LIMIT:g}, {GRID_LIMIT:g}]²',
          extent=(-half, half, -half, half))
    ax.set_xlabel('z₁')
    ax.set_ylabel('z₂')

  fig.suptitle(str(data.get('title', 'VAE')))
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=150)  # the 15×15 grid of 28×28 images needs ~450 pixels
  plt.close(fig)


def run(workdir: str | None, num: int = 8, seed: int = 0, output: str | None = None) -> str:
  """The command: writes the figure and returns its path; a bad input exits with status 1 and
  one sentence."""
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  try:
    # The default file is checked as a given one is, before the run is read.
    output = output or (os.path.join(os.path.abspath(workdir), OUTPUT_FILE) if workdir else None)
    if output:
      command_line.output_file(output, 'output')
    data = figure_data(workdir, num, seed)
  except (ValueError, FileNotFoundError, app.UsageError) as e:
    sys.exit(f'error: {e}')
  plot(data, output)
  return output


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  print(f'written to {run(FLAGS.workdir, FLAGS.num, FLAGS.seed, FLAGS.output)}')


if __name__ == '__main__':
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  define_flags()
  command_line.run(main)
