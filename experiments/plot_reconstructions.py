r"""Test images and their reconstructions by several trained autoencoder runs, in one figure.

  python -m experiments.plot_reconstructions \
      --workdirs=workdirs/fashion_mnist_denoising_autoencoder,workdirs/fashion_mnist_sparse_autoencoder,workdirs/fashion_mnist_contractive_autoencoder \
      --num=10 --output=docs/figures/autoencoders_fashion_mnist.png [--seed=0]

Reads each run's `config.json` and latest checkpoint (the parameter EMA when the
run kept one). `--num` test images, drawn from the eval split with `--seed`, are
the same for every run and are prepared as each run's task prepares evaluation
inputs: x = pixels · input_scale (pixels/255) for the 'autoencoder' task. Every run
reconstructs from these clean x, also a denoising autoencoder (Vincent et al. 2008):
its task corrupts training batches only and scores it on clean inputs. The
reconstruction is the mean of the Bernoulli decoder,

  x̂ = σ(g(f(x)))                        (Autoencoder, Denoising-, Sparse-, Contractive-)
  x̂ = E[x | z = μ(x)] = σ(g(μ(x)))      (VAE with a Bernoulli decoder, Kingma & Welling 2014)

and each row is labelled with its run's model name and the mean over the images of
the reconstruction cross-entropy in nats, summed over the D pixels of one image:

  CE(x) = −Σ_i [x_i log x̂_i + (1 − x_i) log(1 − x̂_i)] = Σ_i [log(1 + e^{l_i}) − x_i l_i],

l the decoder's logits (the 'autoencoder' task's Bernoulli reconstruction loss).

The first row shows the images as the first run sees them, then one row per run.
`figure_data` returns the numbers, `plot` draws them; `compute` holds the arithmetic
on a module and its variables.
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

from experiments import command_line
from experiments import plot_vae
from models.generative import autoencoders

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

MAX_NUM = 32  # images in one row of the figure
AUTOENCODERS = ('autoencoder', 'denoising_autoencoder', 'sparse_autoencoder',
                'contractive_autoencoder')
MODELS = AUTOENCODERS + ('vae',)


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_list('workdirs', None, 'Comma-separated work directories of trained autoencoder '
                    'runs, one row of the figure each.', required=True)
  flags.DEFINE_integer('num', 10, f'Test images reconstructed (1 … {MAX_NUM}).')
  flags.DEFINE_integer('seed', 0, 'Seed of the choice of test images (and of a VAE task\'s '
                       'dequantisation noise).')
  flags.DEFINE_string('output', None, 'PNG to write.', required=True)


def _check_module(module, name: str = 'The model') -> None:
  if not isinstance(module, (autoencoders.Autoencoder, autoencoders.VAE)):
    raise ValueError(f'{name} is a {type(module).__name__}, not an autoencoder or a VAE.')
  if isinstance(module, autoencoders.VAE) and module.decoder != 'bernoulli':
    raise ValueError(f"{name} is a VAE with decoder={module.decoder!r}, which has no Bernoulli "
                     "cross-entropy; only decoder='bernoulli' VAEs are allowed.")


def compute(module, variables, images_NxHxWxC) -> dict:
  """'reconstructions' x̂ = σ(logits) [N, H, W, C] float32 and 'cross_entropy' [N] float64.

  `module` is an `Autoencoder` (or a subclass) or a Bernoulli-decoder `VAE`, whose
  reconstruction is decoded from z = μ(x); `images` are prepared inputs x in [0, 1].
  The cross-entropy Σ_i [log(1 + e^{l_i}) − x_i l_i] is taken in float64 on the host
  from the float32 logits, as logaddexp(0, l) so that no exp overflows.
  """
  _check_module(module)

  @jax.jit
  def logits_and_reconstructions(variables, x_NxHxWxC):
    def forward(module):
      if isinstance(module, autoencoders.VAE):
        mean_NxK, _ = module.encode(x_NxHxWxC)
        logits, _ = module.decode(mean_NxK)
      else:
        logits, _ = module(x_NxHxWxC)
      return logits.astype(jnp.float32)
    logits = module.apply(variables, method=forward)
    return logits, jax.nn.sigmoid(logits)

  images_NxHxWxC = np.asarray(images_NxHxWxC, np.float32)
  logits, reconstructions = logits_and_reconstructions(variables, jnp.asarray(images_NxHxWxC))
  logits_NxD = np.asarray(logits, np.float64).reshape(len(images_NxHxWxC), -1)
  x_NxD = images_NxHxWxC.astype(np.float64).reshape(len(images_NxHxWxC), -1)
  cross_entropy_N = np.sum(np.logaddexp(0.0, logits_NxD) - x_NxD * logits_NxD, axis=-1)
  return {'reconstructions': np.asarray(reconstructions), 'cross_entropy': cross_entropy_N}


def _check_workdirs(workdirs, num) -> list[str]:
  if not isinstance(num, int) or not 1 <= num <= MAX_NUM:
    raise ValueError(f'--num={num!r} is not allowed; reconstruct from 1 to {MAX_NUM} images.')
  if not workdirs or not all(workdirs):
    raise ValueError(f'--workdirs={",".join(workdirs or [])!r} must name one or more work '
                     'directories of trained autoencoder runs, separated by commas.')
  workdirs = [os.path.abspath(w) for w in workdirs]
  for workdir in workdirs:
    if not os.path.isdir(workdir):
      raise FileNotFoundError(f'The work directory {workdir!r} does not exist.')
  return workdirs


def figure_data(workdirs, num: int, seed: int) -> dict:
  """`compute` for each run on the same test images: 'inputs' [num, H, W, C], and per run
  'labels', 'steps', 'reconstructions' [R, num, H, W, C], 'cross_entropy' [R, num]; plus
  'title'. A bad input raises ValueError or FileNotFoundError in one sentence before anything
  compiles."""
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop

  workdirs = _check_workdirs(workdirs, num)
  if not isinstance(seed, int) or seed < 0:
    raise ValueError(f'--seed={seed!r} must be an integer of at least 0 (it seeds NumPy\'s '
                     'choice of the test images).')
  configs = [loop.read_config(w) for w in workdirs]
  for workdir, config in zip(workdirs, configs):
    if config.model.name not in MODELS:
      raise ValueError(f'The run in {workdir!r} trained model {config.model.name!r}, not an '
                       f'autoencoder; allowed: {", ".join(MODELS)}.')
  first_data = (configs[0].data.name, configs[0].data.eval_split)
  for workdir, config in zip(workdirs[1:], configs[1:]):
    if (config.data.name, config.data.eval_split) != first_data:
      raise ValueError(f'All runs must reconstruct the same test images, but {workdirs[0]!r} '
                       f'evaluates on {first_data[0]}/{first_data[1]} and {workdir!r} on '
                       f'{config.data.name}/{config.data.eval_split}.')

  parts = [loop.build_parts(config, workdir) for config, workdir in zip(configs, workdirs)]
  eval_source = parts[0][1]
  modules = [part[4] for part in parts]
  for workdir, module in zip(workdirs[1:], modules[1:]):
    if tuple(module.image_shape) != tuple(modules[0].image_shape):
      raise ValueError(f'All runs must have the same image shape, but {workdirs[0]!r} has '
                       f'{tuple(modules[0].image_shape)} and {workdir!r} has '
                       f'{tuple(module.image_shape)}.')
  for workdir, module in zip(workdirs, modules):
    _check_module(module, f'The model of the run in {workdir!r}')
  if num > len(eval_source):
    raise ValueError(f'--num={num} is more than the {len(eval_source)} images of the eval split.')
  states = [checkpoint.restore_arrays(workdir) for workdir in workdirs]  # each run has one

  indices = np.random.default_rng(seed).choice(len(eval_source), num, replace=False)
  records = pipeline.read_batch(eval_source, indices)
  key = jax.random.PRNGKey(seed)
  inputs, labels, steps, reconstructions, cross_entropies = None, [], [], [], []
  for (_, _, _, task, module), config, state in zip(parts, configs, states):
    batch = {k: jnp.asarray(v) for k, v in task.preprocess(records).items()}
    rngs = {name: jax.random.fold_in(key, i) for i, name in enumerate(task.rng_streams)}
    # Evaluation inputs: no corruption; pixels/255 (or a VAE task's dequantisation).
    images = np.asarray(jax.jit(lambda rngs, batch, task=task: task.transform(
        rngs, batch, False)['input'])(rngs, batch))
    variables = checkpoint.eval_variables(state)
    out = compute(module, variables, images)
    inputs = images if inputs is None else inputs
    labels.append(config.model.name)
    steps.append(int(state['step']))
    reconstructions.append(out['reconstructions'])
    cross_entropies.append(out['cross_entropy'])
  return {'inputs': inputs, 'labels': labels, 'steps': steps,
          'reconstructions': np.stack(reconstructions),
          'cross_entropy': np.stack(cross_entropies),
          'title': (f'{num} {configs[0].data.name} {configs[0].data.eval_split} images (top) and '
                    'their reconstructions x̂ = σ(logits) from the clean images')}


def plot(data: dict, path: str) -> None:
  """Draws `figure_data`'s arrays into the PNG `path`: the images, then one row per run
  labelled with its model name, step and mean cross-entropy."""
  num, height = data['inputs'].shape[:2]
  rows = np.concatenate([data['inputs'][None], data['reconstructions']])
  fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * num + 3.0), 0.75 * len(rows) + 0.8))
  ax.imshow(plot_vae.mosaic(rows), cmap='gray', vmin=0.0, vmax=1.0)
  names = ['test images x'] + [
      f'{label} (step {step})\nCE {np.mean(ce):.2f} nats'
      for label, step, ce in zip(data['labels'], data['steps'], data['cross_entropy'])]
  ax.set_yticks([r * (height + 1) + (height - 1) / 2 for r in range(len(rows))], names,
                fontsize=9)
  ax.set_xticks([])
  ax.tick_params(length=0)
  for side in ax.spines.values():
    side.set_visible(False)
  ax.set_title(str(data.get('title', 'reconstructions')), fontsize=10)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=150, bbox_inches='tight')  # 'tight' keeps the long row labels
  plt.close(fig)


def run(workdirs, num: int = 10, seed: int = 0, output: str | None = None) -> dict:
  """The command: writes the figure to `output` and returns `figure_data`'s numbers; a bad
  input exits with status 1 and one sentence."""
  try:
    if not output:
      raise ValueError('--output must name the PNG file to write.')
    command_line.output_file(output, 'output')
    data = figure_data(workdirs, num, seed)
  except (ValueError, FileNotFoundError, app.UsageError) as e:
    sys.exit(f'error: {e}')
  plot(data, output)
  return data


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  data = run(FLAGS.workdirs, FLAGS.num, FLAGS.seed, FLAGS.output)
  for label, step, ce in zip(data['labels'], data['steps'], data['cross_entropy']):
    print(f'{label} (step {step}): mean reconstruction cross-entropy {np.mean(ce):.3f} nats '
          f'over {len(ce)} test images')
  print(f'written to {FLAGS.output}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
