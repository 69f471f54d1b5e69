r"""Trained generative runs measured on one scale: a Fréchet distance in the feature space of
the project's own Fashion-MNIST classifier, bits per dimension and sampling time.

  python -m experiments.generative_metrics --classifier=workdirs/fashion_mnist_resnet20 \
      --workdir=workdirs/fashion_mnist_ddpm --sampler=ancestral --steps=1000 \
      [--num_samples=256 --batch_size=128 --seed=0 --bits_per_dim_examples=0]
  python -m experiments.generative_metrics --classifier=workdirs/fashion_mnist_resnet20 \
      --sampler=data [--num_samples=256]       # the floor: N training images

Samplers, by the run's model and task:
  diffusion, ddpm:       ancestral (Ho et al. 2020, Algorithm 2, respaced to --steps), ddim
                         (σ = 0), pc and ode (the ε-network as the score of its VP SDE, Song et
                         al. 2021b: predictor–corrector with --steps steps, or the
                         probability-flow ODE by RK4 with --steps steps);
  diffusion, score_sde:  pc, ode;
  diffusion, d3pm:       ancestral (all T steps);
  diffusion, cold:       cold (Bansal et al. 2022, Algorithm 2, all T steps, from x_T drawn from
                         a Gaussian fitted to the degraded training images D(x_0, T), or with
                         --cold_start=flat from the paper's flat images, §5: `cold_start`);
  vae:                   vae (decoder means E[x | z], z ~ N(0, I));
  no run:                data (--num_samples training images, the floor).

Features are the input of the classifier's last Dense layer (`--feature_layer`, 'head': the
global average pool of a ResNet), for images prepared as the classifier's task prepares its
inputs, from pixels round(255·x) of samples x in [0, 1]. The reference statistics are those
of the whole test split (binarised at 128 for a D3PM run, which models binary images, and with
--binarize, e.g. for the floor of such runs). The distance is in this feature space only, not
comparable with Inception-based FIDs, and it is biased upwards for small N: compare models at
one N, against the floor at that N.

--bits_per_dim_examples=M (ddpm and score_sde runs) also gives the probability-flow ODE's
bits per dimension on the first M test images, dequantised as the VAE's (y = (pixels + u)/256,
models/generative/likelihood.py) and mapped to the network's [−1, 1] by x = 2y − 1, so
log p(y) = log p(x) + D log 2; Hutchinson's trace estimator with --likelihood_steps RK4 steps
from t = --likelihood_eps to 1 on the --likelihood_grid. The default start, t = 1e-3, is the
first DDPM step's noise level (σ ≈ 0.01, models/generative/sde.py: score_from_eps), below
which the network was never trained; the default grid is equally spaced in log t, dense near
0 where the score grows as 1/σ. Uniform steps from t = 1e-5 are far too coarse there: 20 gave
an impossible −5.3 bits/dim for the Fashion-MNIST DDPM.

A cold run also restores the first --batch_size test images from D(x_0, t) at t = T/2 and T by
the paper's Algorithms 1 and 2 and reports their mean ℓ1 errors (figure
`samples/cold_restore_<t>_<weights>[_n<batch_size>].png`: images, degradations, Algorithm 1,
Algorithm 2; the batch size marked when it is not 128).

--weights=params samples with the run's parameters instead of their moving average (a run
that kept none samples its parameters either way, and its row says 'params').

Prints the row and appends it to `<workdir>/generative_metrics.jsonl` (the classifier's for
the floor); the first 64 samples are drawn to `<that workdir>/samples/<sampler>_<steps>_….png`,
one file per setting that changes them.
"""

import json
import math
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

FLAGS = flags.FLAGS

OUTPUT_FILE = 'generative_metrics.jsonl'
GRID_SAMPLES = 64
SAMPLERS = ('ancestral', 'ddim', 'pc', 'ode', 'cold', 'vae', 'data')
# models.generative.sde.TIME_GRIDS, written out so that flags parse without importing JAX
# (tests/experiments/test_generative_metrics.py checks that the two agree).
TIME_GRIDS = ('uniform', 'log')


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('classifier', None, 'Work directory of a trained classifier of the data.',
                      required=True)
  flags.DEFINE_string('workdir', None, 'Work directory of a trained generative run (none for '
                      '--sampler=data).')
  flags.DEFINE_enum('sampler', None, SAMPLERS, 'How the samples are drawn (module doc).',
                    required=True)
  flags.DEFINE_integer('steps', 0, 'Sampler steps (0: the process\'s own number).')
  flags.DEFINE_integer('num_samples', 256, 'Samples whose features are compared.')
  flags.DEFINE_integer('batch_size', 128, 'Samples drawn at once.')
  flags.DEFINE_integer('seed', 0, 'Seed of the samples.')
  flags.DEFINE_enum('cold_start', 'gaussian', ('gaussian', 'flat'), 'Where cold generation '
                    'starts (`cold_start`).')
  flags.DEFINE_float('cold_noise', 0.002, 'Per-pixel noise of the cold sampler\'s start, in '
                     'the network\'s [−1, 1] scale.')
  flags.DEFINE_integer('bits_per_dim_examples', 0, 'Test images whose ODE likelihood is '
                       'computed (ddpm and score_sde runs; 0: none).')
  flags.DEFINE_enum('ode_grid', 'uniform', TIME_GRIDS, 'Time grid of --sampler=ode '
                    '(models/generative/sde.py: time_grid).')
  flags.DEFINE_integer('likelihood_steps', 20, 'RK4 steps of the likelihood ODE.')
  flags.DEFINE_float('likelihood_eps', 1e-3, 'Time t at which the likelihood ODE starts, in '
                     '(0, 1).')
  flags.DEFINE_enum('likelihood_grid', 'log', TIME_GRIDS, 'Time grid of the likelihood '
                    'ODE (models/generative/sde.py: time_grid).')
  flags.DEFINE_bool('binarize', False, 'Compare binarised images (pixels ≥ 128 → 255, else 0): '
                    'the reference and, with --sampler=data, the samples; always for a d3pm run.')
  flags.DEFINE_enum('weights', 'ema', ('ema', 'params'), 'The run\'s parameter average (when '
                    'it kept one) or its parameters.')
  flags.DEFINE_string('feature_layer', 'head', 'Name of the classifier\'s layer whose input is '
                      'the feature vector.')


def _load(workdir: str, what: str, weights: str = 'ema', task_name: str | None = None):
  """(config, train source, eval source, task, module, variables, step, weights) of a trained
  run, with its parameter average ('ema', when the run kept one) or its parameters ('params'),
  and which of the two it took; ValueError in one sentence when `task_name` is given and the
  run has another task."""
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top

  if not workdir:
    raise ValueError(f'--{what} must name the work directory of a trained run.')
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'--{what}={workdir!r} does not exist.')
  config = loop.read_config(workdir)
  if task_name and config.task.name != task_name:
    raise ValueError(f'--{what}={workdir!r} is a run of task {config.task.name!r} (model '
                     f'{config.model.name!r}); give a run of task {task_name!r}.')
  train_source, eval_source, _, task, module = loop.build_parts(config, workdir)
  state = checkpoint.restore_arrays(workdir)
  use_ema = weights == 'ema' and state.get('ema_params') is not None
  params = state['ema_params'] if use_ema else state['params']
  return (config, train_source, eval_source, task, module,
          {'params': params, **(state.get('model_state') or {})}, int(state['step']),
          'ema' if use_ema else 'params')


def check_run(workdir: str, config, task, eval_source, *, sampler: str, steps: int,
              bits_per_dim_examples: int) -> None:
  """ValueError in one sentence when the run in `workdir` cannot be measured so: a sampler
  of another kind of run, more steps than its process has (or steps a sampler does not
  take: the cold sampler takes all T; fewer than the PC sampler needs), or likelihoods of more
  test images than it has."""
  from models.generative import sde as sde_lib  # pylint: disable=g-import-not-at-top
  from train.tasks import diffusion  # pylint: disable=g-import-not-at-top
  is_diffusion = config.task.name == 'diffusion'
  objective = task.objective if is_diffusion else None
  if is_diffusion and sampler not in ('cold',) + diffusion.SAMPLERS.get(objective, ()):
    raise ValueError(f'--sampler={sampler} does not sample a {objective} run; allowed: '
                     f'{", ".join(diffusion.SAMPLERS[objective]) or "cold"}.')
  if is_diffusion == (sampler == 'vae'):
    raise ValueError(f'--sampler={sampler} does not sample the run in {workdir!r} (model '
                     f'{config.model.name!r}, task {config.task.name!r}); vae samples VAE '
                     'runs, the others diffusion runs.')
  if steps and (sampler == 'vae' or objective == 'd3pm'):
    raise ValueError(f'--steps={steps} does not apply to --sampler={sampler} of a '
                     f'{objective or config.model.name} run, which '
                     f'{"decodes prior draws" if sampler == "vae" else "takes every step"}; '
                     'leave it at 0.')
  if sampler == 'cold' and steps not in (0, task.process_steps):
    raise ValueError(f'--steps={steps} does not apply to --sampler=cold, which starts from '
                     f'D(x_0, T) and takes all T = {task.process_steps} steps of the run\'s cold '
                     f'process; give 0 or {task.process_steps}.')
  if sampler in ('ancestral', 'ddim') and steps > task.process_steps:
    raise ValueError(f'--steps={steps} exceeds the {task.process_steps} steps of the run\'s '
                     f'{objective} process; give 0 (all of them) to {task.process_steps}.')
  if sampler == 'pc':
    # The fewest steps that pc_sample takes with the run's SDE and the task's 'pc' parts.
    fewest = sde_lib.min_pc_steps(task.score_model(lambda x, t_B: x)[0])
    if (steps or diffusion.PC_STEPS) < fewest:
      given = '' if steps else f' ({diffusion.PC_STEPS:,} steps)'
      raise ValueError(f'--steps={steps}{given} is too few for '
                       f'--sampler=pc of the run\'s {objective} process, whose discrete β(t)·h '
                       f'must stay below 1; give at least {fewest}.')
  if bits_per_dim_examples and objective not in ('ddpm', 'score_sde'):
    raise ValueError('--bits_per_dim_examples needs a ddpm or score_sde run.')
  if bits_per_dim_examples > len(eval_source):
    raise ValueError(f'--bits_per_dim_examples={bits_per_dim_examples} exceeds the '
                     f'{len(eval_source)} test images of the run.')


def layer_input(module, variables, inputs: tuple, layer: str):
  """The first positional input of the submodule named `layer` when `module` is applied."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  captured = []

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name == layer and context.method_name == '__call__' and not captured:
      captured.append(args[0])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    module.apply(variables, *inputs)
  if not captured:
    raise ValueError(f'--feature_layer={layer!r} is not a layer the classifier calls.')
  return captured[0]


def feature_fn(task, module, variables, layer: str):
  """pixels uint8 [N, H, W, C] → features float64 [N, F], in batches of 500."""
  import jax  # pylint: disable=g-import-not-at-top

  @jax.jit
  def features(variables, inputs):
    batch = task.transform({}, {'input': inputs}, False)
    flat = layer_input(module, variables, task.model_inputs(batch), layer)
    return flat.reshape(flat.shape[0], -1).astype(jax.numpy.float32)

  def run(pixels_NxHxWxC):
    out = []
    for start in range(0, len(pixels_NxHxWxC), 500):
      chunk = pixels_NxHxWxC[start:start + 500]
      inputs = task.preprocess({task.input_key: chunk,
                                'label': np.zeros(len(chunk), np.int32)})['input']
      out.append(np.asarray(features(variables, inputs), np.float64))
    return np.concatenate(out)
  return run


def binary(pixels) -> np.ndarray:
  """Pixels binarised as the d3pm objective does (≥ 128), as uint8 0 or 255."""
  return np.where(np.asarray(pixels) >= 128, 255, 0).astype(np.uint8)


def to_pixels(images_NxHxWxC) -> np.ndarray:
  """Samples in [0, 1] as uint8 pixels round(255·x)."""
  return np.round(np.clip(np.asarray(images_NxHxWxC, np.float64), 0, 1) * 255).astype(np.uint8)


def cold_start(key, degraded_NxHxWxC, num: int, kind: str = 'gaussian', noise: float = 0.002):
  """Starts x_T [num, H, W, C] of cold generation, from degraded training images D(x_0, T):
    'flat' (Bansal et al. 2022, §5): flat images at channel values drawn from a Gaussian fitted
      to the images' channel means, plus N(0, noise²) per pixel: the fully degraded image
      when the blur reaches a constant;
    'gaussian': a Gaussian fitted to the degraded images themselves (mean and full covariance
      over the pixels), for a blur that stops short of a constant."""
  import jax  # pylint: disable=g-import-not-at-top

  degraded = np.asarray(degraded_NxHxWxC, np.float64)
  shape = (num,) + degraded.shape[1:]
  first_key, second_key = jax.random.split(key)
  if kind == 'flat':
    means_NxC = degraded.mean(axis=(1, 2))
    mean_C, cov_CxC = means_NxC.mean(axis=0), np.atleast_2d(np.cov(means_NxC, rowvar=False))
    levels_NxC = jax.random.multivariate_normal(first_key, mean_C, cov_CxC, (num,))
    return (levels_NxC[:, None, None, :].astype(np.float32)
            + noise * jax.random.normal(second_key, shape, np.float32))
  if kind != 'gaussian':
    raise ValueError(f'--cold_start={kind!r}; allowed: gaussian, flat.')
  flat_NxD = degraded.reshape(len(degraded), -1)
  eigenvalues_D, vectors_DxD = np.linalg.eigh(np.cov(flat_NxD, rowvar=False))
  root_DxD = vectors_DxD * np.sqrt(np.clip(eigenvalues_D, 0, None))
  z_NxD = jax.random.normal(first_key, (num, flat_NxD.shape[1]), np.float32)
  return (flat_NxD.mean(axis=0).astype(np.float32) + z_NxD @ root_DxD.T.astype(np.float32)
          ).reshape(shape)


def draw_samples(config, task, module, variables, train_source, *, sampler: str, steps: int,
                 num: int, batch_size: int, seed: int, cold_start_kind: str = 'gaussian',
                 cold_noise: float = 0.002, ode_grid: str = 'uniform'):
  """(samples [num, H, W, C] in [0, 1], seconds per sample after compilation)."""
  import jax  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from models.generative import cold as cold_lib  # pylint: disable=g-import-not-at-top

  task_name = config.task.name
  if sampler == 'vae':
    if config.model.name != 'vae':
      raise ValueError(f'--sampler=vae needs a VAE run; this one trained {config.model.name!r}.')

    def draw(variables, key, count):
      def decode(m):
        out, log_var = m.decode(jax.random.normal(key, (count, m.latent_dim)))
        return jax.nn.sigmoid(out) if log_var is None else out
      return jax.numpy.clip(module.apply(variables, method=decode), 0, 1)
  elif task_name != 'diffusion':
    raise ValueError(f'--sampler={sampler} needs a diffusion or VAE run; this one has task '
                     f'{task_name!r}.')
  elif sampler == 'cold':
    if task.objective != 'cold':
      raise ValueError(f'--sampler=cold needs a cold run; this one has objective '
                       f'{task.objective!r}.')
    records = pipeline.read_batch(train_source, np.arange(min(len(train_source), 10_000)))
    train_x0 = jax.numpy.asarray(task.preprocess(records)['x0'])
    num_steps = steps or task.process_steps
    degraded = jax.jit(lambda x: task.degrade_fn(x)(x, num_steps))(train_x0)

    def draw(variables, key, count):
      x_T = cold_start(key, degraded, count, cold_start_kind, cold_noise)
      restore = task.model_fn(lambda x, t: module.apply(variables, x, t))
      x0 = cold_lib.improved_sample(restore, task.degrade_fn(x_T), x_T, num_steps)
      return jax.numpy.clip((x0 + 1) / 2, 0, 1)
  else:
    def draw(variables, key, count):
      return task.sample(module, variables, key, count, steps, sampler=sampler,
                         **({'ode_grid': ode_grid} if sampler == 'ode' else {}))

  sizes = [min(batch_size, num - start) for start in range(0, num, batch_size)]
  compiled = {size: jax.jit(lambda v, k, size=size: draw(v, k, size)).lower(
      variables, jax.random.PRNGKey(0)).compile() for size in sorted(set(sizes))}
  start_time, out = time.perf_counter(), []
  for index, size in enumerate(sizes):
    out.append(np.asarray(compiled[size](variables, jax.random.fold_in(
        jax.random.PRNGKey(seed), index))))
  return np.concatenate(out), (time.perf_counter() - start_time) / num


def cold_restorations(task, module, variables, eval_source, *, num: int, out_dir: str,
                      weights: str = 'ema') -> dict:
  """Cold diffusion restoring the first `num` test images from D(x_0, t) at t = T/2 and T by
  Algorithm 1 (naive) and Algorithm 2 (improved): the mean ℓ1 error per pixel in [0, 1] of
  each, and a figure `<out_dir>/samples/cold_restore_<t>_<weights>[_n<num>].png` (`weights`
  names the parameters in `variables`; `num` is marked when it is not 128) with rows of the
  images, their degradations and the two restorations."""
  import jax  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from models.generative import cold as cold_lib  # pylint: disable=g-import-not-at-top

  x0 = jax.numpy.asarray(task.preprocess(pipeline.read_batch(eval_source, np.arange(num)))['x0'])
  restore = task.model_fn(lambda x, t: module.apply(variables, x, t))
  degrade = task.degrade_fn(x0)
  total = task.process_steps
  to_unit = lambda x: np.clip((np.asarray(x, np.float64) + 1) / 2, 0, 1)
  errors = {}
  for t in sorted({max(total // 2, 1), total}):
    x_t = degrade(x0, t)
    naive = jax.jit(lambda x: cold_lib.naive_sample(restore, degrade, x, t))(x_t)
    improved = jax.jit(lambda x: cold_lib.improved_sample(restore, degrade, x, t))(x_t)
    rows = [to_unit(v)[:16] for v in (x0, x_t, naive, improved)]
    for name, value in (('naive', naive), ('improved', improved)):
      errors[f'restore_l1_{name}_t{t}'] = float(np.mean(np.abs(to_unit(value) - to_unit(x0))))
    name = '_'.join([f'cold_restore_{t}', weights] + ([f'n{num}'] if num != 128 else []))
    _save_grid(np.concatenate(rows), os.path.join(out_dir, 'samples', f'{name}.png'))
  return errors


def ode_bits_per_dim(task, module, variables, eval_source, *, num: int, steps: int, seed: int,
                     batch_size: int, eps: float = 1e-3,
                     spacing: str = 'log') -> tuple[float, float]:
  """Mean bits per dimension of the first `num` test images by the probability-flow ODE, and
  its standard error over the images (each with its own dequantisation and probe)."""
  import jax  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from models.generative import likelihood, sde as sde_lib  # pylint: disable=g-import-not-at-top

  sde, score_fn = task.score_model(lambda x, t: module.apply(variables, x, t))
  pixels = pipeline.read_batch(eval_source, np.arange(num))[task.input_key]
  dims = math.prod(pixels.shape[1:])

  @jax.jit
  def nll_bits(pixels, key):
    dequantize_key, probe_key = jax.random.split(key)
    y = likelihood.dequantize(dequantize_key, pixels)
    log_p_x = sde_lib.ode_log_likelihood(sde, score_fn, 2 * y - 1, probe_key, num_steps=steps,
                                         eps=eps, spacing=spacing)
    return likelihood.bits_per_dim(-(log_p_x + dims * math.log(2)), dims)

  bits = [np.asarray(nll_bits(pixels[start:start + batch_size],
                              jax.random.fold_in(jax.random.PRNGKey(seed), start)))
          for start in range(0, num, batch_size)]
  bits = np.concatenate(bits).astype(np.float64)
  se = bits.std(ddof=1) / np.sqrt(bits.size) if bits.size > 1 else math.nan
  return float(bits.mean()), float(se)


def grid_name(sampler: str, steps: int, weights: str, cold_start_kind: str, ode_grid: str,
              seed: int, *, num_samples: int = 256, batch_size: int = 128,
              binarize: bool = False, cold_noise: float = 0.002) -> str:
  """The file name (without .png) of a row's sample grid: one per setting that changes the
  images drawn, so that no row's grid replaces another's (the defaults, uniform grid, seed 0,
  256 samples in batches of 128, the cold noise 0.002 and grey data images, leave no mark)."""
  return '_'.join([sampler, str(steps)] + ([weights] if sampler != 'data' else [])
                  + ([cold_start_kind] if sampler == 'cold' else [])
                  + ([f'noise{cold_noise:g}'] if sampler == 'cold' and cold_noise != 0.002
                     else [])
                  + ([ode_grid] if sampler == 'ode' and ode_grid != 'uniform' else [])
                  + ([f'seed{seed}'] if seed else [])
                  + ([f'n{num_samples}'] if num_samples != 256 else [])
                  + ([f'batch{batch_size}'] if sampler != 'data' and batch_size != 128 else [])
                  + (['binary'] if sampler == 'data' and binarize else []))


def measure(*, classifier: str, workdir: str | None, sampler: str, steps: int, num_samples: int,
            batch_size: int, seed: int, cold_start_kind: str = 'gaussian',
            cold_noise: float = 0.002,
            bits_per_dim_examples: int = 0, likelihood_steps: int = 20,
            likelihood_eps: float = 1e-3, likelihood_grid: str = 'log', ode_grid: str = 'uniform',
            feature_layer: str = 'head', binarize: bool = False, weights: str = 'ema') -> dict:
  """The row of one model and sampler (module doc); bad inputs raise ValueError or
  FileNotFoundError in one sentence before anything is compiled."""
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from models.generative import frechet  # pylint: disable=g-import-not-at-top

  if cold_start_kind not in ('gaussian', 'flat'):
    raise ValueError(f'--cold_start={cold_start_kind!r}; allowed: gaussian, flat.')
  if not cold_noise >= 0:
    raise ValueError(f'--cold_noise={cold_noise} must be at least 0.')
  if weights not in ('ema', 'params'):
    raise ValueError(f'--weights={weights!r}; allowed: ema, params.')
  for name, value, least in (('num_samples', num_samples, 2), ('batch_size', batch_size, 1),
                             ('seed', seed, 0)):
    if value < least:
      raise ValueError(f'--{name}={value} is too small; give at least {least}.')
  if ode_grid not in TIME_GRIDS:
    raise ValueError(f'--ode_grid={ode_grid!r}; allowed: {", ".join(TIME_GRIDS)}.')
  if ode_grid != 'uniform' and sampler != 'ode':
    raise ValueError(f'--ode_grid={ode_grid} is the time grid of --sampler=ode, not of '
                     f'--sampler={sampler}.')
  if likelihood_grid not in TIME_GRIDS:
    raise ValueError(f'--likelihood_grid={likelihood_grid!r}; allowed: {", ".join(TIME_GRIDS)}.')
  if not 0 < likelihood_eps < 1:
    raise ValueError(f'--likelihood_eps={likelihood_eps} must lie in (0, 1).')
  if steps < 0 or bits_per_dim_examples < 0 or likelihood_steps < 1:
    raise ValueError(f'--steps={steps} and --bits_per_dim_examples={bits_per_dim_examples} must '
                     f'be ≥ 0 and --likelihood_steps={likelihood_steps} ≥ 1.')
  if (sampler == 'data') != (not workdir):
    raise ValueError('--sampler=data takes no --workdir; every other sampler needs one.')
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  command_line.record_file(workdir or classifier or '.', OUTPUT_FILE, 'the row is appended to')
  (_, c_train, c_eval, c_task, c_module, c_variables, _, _) = _load(
      classifier, 'classifier', task_name='classification')
  if num_samples > len(c_eval):
    raise ValueError(f'--num_samples={num_samples} exceeds the {len(c_eval)} reference images.')
  test_pixels = pipeline.read_batch(c_eval, np.arange(len(c_eval)))[c_task.input_key]
  if sampler != 'data':
    config, train_source, eval_source, task, module, variables, step, weights = _load(
        workdir, 'workdir', weights)
    shapes = task.meta.get('shapes', {})
    if shapes and tuple(shapes.get('image', ())) != tuple(test_pixels.shape[1:]):
      raise ValueError(f'The run in {workdir!r} models data of another shape than the '
                       f'classifier\'s {tuple(test_pixels.shape[1:])} images.')
    check_run(workdir, config, task, eval_source, sampler=sampler, steps=steps,
              bits_per_dim_examples=bits_per_dim_examples)
    # D3PM models binarised images (train/tasks/diffusion.py): compare them with binarised ones.
    binarize = binarize or getattr(task, 'objective', None) == 'd3pm'
  features = feature_fn(c_task, c_module, c_variables, feature_layer)
  reference = frechet.feature_statistics(features(binary(test_pixels) if binarize
                                                  else test_pixels))

  row = {'sampler': sampler, 'num_samples': num_samples, 'seed': seed, 'binarize': binarize,
         'classifier': os.path.abspath(classifier), 'feature_layer': feature_layer}
  if sampler == 'data':
    order = np.random.default_rng(seed).permutation(len(c_train))[:num_samples]
    pixels = pipeline.read_batch(c_train, np.sort(order))[c_task.input_key]
    images = (binary(pixels) if binarize else pixels) / 255.0
    out_dir = os.path.abspath(classifier)
  else:
    images, seconds = draw_samples(config, task, module, variables, train_source,
                                   sampler=sampler, steps=steps, num=num_samples,
                                   batch_size=batch_size, seed=seed,
                                   cold_start_kind=cold_start_kind, cold_noise=cold_noise,
                                   ode_grid=ode_grid)
    if sampler == 'ode':
      row['ode_grid'] = ode_grid
    row.update(workdir=os.path.abspath(workdir), step=step, steps=steps, weights=weights,
               seconds_per_sample=seconds)
    if bits_per_dim_examples:
      row['ode_bits_per_dim'], row['ode_bits_per_dim_se'] = ode_bits_per_dim(
          task, module, variables, eval_source, num=bits_per_dim_examples,
          steps=likelihood_steps, seed=seed, batch_size=batch_size, eps=likelihood_eps,
          spacing=likelihood_grid)
      row.update(bits_per_dim_examples=bits_per_dim_examples, likelihood_steps=likelihood_steps,
                 likelihood_eps=likelihood_eps, likelihood_grid=likelihood_grid)
    out_dir = os.path.abspath(workdir)
    if sampler == 'cold':
      row['cold_start'] = cold_start_kind
      row.update(cold_restorations(task, module, variables, eval_source, num=batch_size,
                                   out_dir=out_dir, weights=weights))
  row['frechet_distance'] = frechet.frechet_distance(
      *frechet.feature_statistics(features(to_pixels(images))), *reference)
  name = grid_name(sampler, steps, weights, cold_start_kind, ode_grid, seed,
                   num_samples=num_samples, batch_size=batch_size, binarize=binarize,
                   cold_noise=cold_noise)
  _save_grid(images[:GRID_SAMPLES], os.path.join(out_dir, 'samples', f'{name}.png'))
  command_line.append_record(os.path.join(out_dir, OUTPUT_FILE), row)
  return row


def _save_grid(images_NxHxWxC, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from train.tasks import diffusion  # pylint: disable=g-import-not-at-top

  grid = diffusion.image_grid(np.asarray(images_NxHxWxC, np.float32), columns=16)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  plt.imsave(path, grid[..., 0] if grid.shape[-1] == 1 else grid, cmap='gray', vmin=0, vmax=1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  try:
    row = measure(classifier=FLAGS.classifier, workdir=FLAGS.workdir, sampler=FLAGS.sampler,
                  steps=FLAGS.steps, num_samples=FLAGS.num_samples, batch_size=FLAGS.batch_size,
                  seed=FLAGS.seed, cold_start_kind=FLAGS.cold_start, cold_noise=FLAGS.cold_noise,
                  bits_per_dim_examples=FLAGS.bits_per_dim_examples,
                  likelihood_steps=FLAGS.likelihood_steps,
                  likelihood_eps=FLAGS.likelihood_eps, likelihood_grid=FLAGS.likelihood_grid,
                  ode_grid=FLAGS.ode_grid,
                  feature_layer=FLAGS.feature_layer,
                  binarize=FLAGS.binarize, weights=FLAGS.weights)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  print(json.dumps(row, sort_keys=True))


if __name__ == '__main__':
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  define_flags()
  command_line.run(main)
