r"""First-layer filters of a trained image classifier and the feature maps of one image.

  python -m experiments.plot_filters --workdir=workdirs/fashion_mnist_resnet20 [--index=0]

Reads the run's `config.json` and latest checkpoint (the parameter EMA when the
run kept one), takes test image `--index` of the run's eval split, prepared as
the run's task prepares it (scale, per-channel normalisation), and draws three
panels: the image, every kernel of the model's first convolution (the first
`nn.Conv` the forward pass calls, channel 0 of each kernel, each scaled to its
own range), and that convolution's output for the image, one map per kernel.
Writes `<workdir>/filters_and_feature_maps.png` (or --output).
"""

import math
import os
import sys

from absl import app
from absl import flags
from absl import logging
import flax.linen as nn
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from experiments import command_line  # pylint: disable=g-import-not-at-top

_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory of a trained image classifier run.')
_INDEX = flags.DEFINE_integer('index', 0, 'Index of the image in the eval split.')
_OUTPUT = flags.DEFINE_string('output', None, 'PNG to write (default: in the work directory).')
flags.mark_flags_as_required(['workdir'])


def first_conv(module, variables, inputs) -> tuple[np.ndarray, np.ndarray]:
  """(kernel_KhxKwxCinxCout, output_HxWxCout) of the first `nn.Conv` called on `inputs[:1]`."""
  found = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Conv) and context.method_name == '__call__' and not found:
      found['kernel'] = context.module.variables['params']['kernel']
      found['output'] = out
    return out

  with nn.intercept_methods(record):
    module.apply(variables, *inputs, train=False)
  if not found:
    raise ValueError(f'The model {type(module).__name__} has no convolution to plot.')
  return np.asarray(found['kernel']), np.asarray(found['output'][0], np.float32)


def _grid(fig, spec, maps, title):
  columns = min(8, len(maps))
  rows = math.ceil(len(maps) / columns)
  sub = spec.subgridspec(rows + 1, columns, height_ratios=[0.25] + [1] * rows)
  ax = fig.add_subplot(sub[0, :])
  ax.set_title(title)
  ax.axis('off')
  for i, m in enumerate(maps):
    ax = fig.add_subplot(sub[1 + i // columns, i % columns])
    ax.imshow(m, cmap='gray')
    ax.set_xticks([])
    ax.set_yticks([])


def plot(workdir: str, index: int, output: str) -> str:
  """Writes the figure of the run in `workdir`; returns a one-line description."""
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop

  config = loop.read_config(workdir)
  _, eval_source, meta, task, module = loop.build_parts(config, workdir)
  input_shape = tuple(meta['shapes'].get(getattr(task, 'input_key', None), ()))
  if config.task.name != 'classification' or len(input_shape) != 3:
    raise ValueError(f'The run in {workdir!r} (model {config.model.name!r}, task '
                     f'{config.task.name!r}, inputs {input_shape}) is not a classifier of '
                     'images [H, W, C], whose first 2-D convolution this script draws.')
  if not 0 <= index < len(eval_source):
    raise ValueError(f'--index={index} is outside the eval split, which has {len(eval_source)} '
                     'examples.')
  state = checkpoint.restore_arrays(workdir)
  variables = checkpoint.eval_variables(state)
  batch = task.preprocess(pipeline.read_batch(eval_source, np.array([index])))
  batch = task.transform({}, {k: jnp.asarray(v) for k, v in batch.items()}, False)
  kernel, maps = first_conv(module, variables, task.model_inputs(batch))

  image = np.asarray(batch['input'][0], np.float32)
  filters = [kernel[:, :, 0, k] for k in range(kernel.shape[-1])]
  feature_maps = [maps[:, :, k] for k in range(maps.shape[-1])]
  fig = plt.figure(figsize=(12, 2 + 1.6 * math.ceil(len(filters) / 8)))
  spec = fig.add_gridspec(1, 3, width_ratios=[1, 2, 2])
  ax = fig.add_subplot(spec[0])
  ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap='gray')
  ax.set_title(f'input (test image {index}, label {int(np.asarray(batch["label"]).reshape(-1)[0])})')
  ax.axis('off')
  _grid(fig, spec[1], filters, f'first-layer kernels {kernel.shape[0]}×{kernel.shape[1]} '
        f'(input channel 0 of {kernel.shape[2]})')
  _grid(fig, spec[2], feature_maps, f'their feature maps {maps.shape[0]}×{maps.shape[1]}')
  fig.suptitle(f'{config.model.name} on {config.data.name}, step {int(state["step"])}')
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=100)
  plt.close(fig)
  return f'{len(filters)} kernels of {kernel.shape[0]}×{kernel.shape[1]}, step {int(state["step"])}'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  output = _OUTPUT.value or os.path.join(_WORKDIR.value, 'filters_and_feature_maps.png')
  command_line.output_file(output, 'output')
  try:
    what = plot(_WORKDIR.value, _INDEX.value, output)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  print(f'{what}; written to {output}')


if __name__ == '__main__':
  command_line.run(main)
