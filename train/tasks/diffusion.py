"""Diffusion: one task for the denoising objectives of models/generative/.

`model(x_t, t) → output` of the shape the objective needs (a U-Net for images, a
time-conditioned MLP for points); the objective decides what x_t, t and the target are:

  objective   x_t                                   model predicts       loss per example
  ddpm        √ᾱ_t x_0 + √(1 − ᾱ_t) ε, t ~ U{1…T}    ε                    ‖ε − ε̂‖² / D (Ho et al. 2020, eq. 14)
  score_sde   x_0 m(t) + s(t) z, t ~ U[ε, 1]         z (score = −out/s)    ‖s·score + z‖² / D (Song et al. 2021, eq. 7, λ = s²)
  cold        D(x_0, t), t ~ U{1…T}                  x_0                  ‖R − x_0‖₁ / D (Bansal et al. 2022)
  d3pm        x_t ~ q(x_t | x_0), t ~ U{1…T}         logits of x_0        L_vb(t) + λ CE (Austin et al. 2021, eq. 5), per position

with D the number of dimensions of an example. Images (uint8 records) are scaled to [−1, 1]
(ddpm, score_sde, cold) or binarised at 128 (d3pm, one-channel images only: two categories,
plus the mask of the absorbing process); real-valued records (the 2-D mixtures) are used as
they are. Draws come from the task's 'diffusion' stream, in training and evaluation alike.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from models.generative import cold as cold_lib
from models.generative import d3pm as d3pm_lib
from models.generative import ddpm as ddpm_lib
from models.generative import sde as sde_lib
from train.tasks import base

OBJECTIVES = ('ddpm', 'score_sde', 'cold', 'd3pm')
SDES = {'vp': sde_lib.VPSDE, 'subvp': sde_lib.SubVPSDE, 've': sde_lib.VESDE}
DEGRADATIONS = ('blur', 'mask')
TRANSITIONS = ('uniform', 'absorbing')
DEFAULT_STEPS = {'ddpm': 1000, 'cold': 50, 'd3pm': 1000}
# The predictor–corrector sampler's steps when none are given (Song et al. 2021's N = 1000).
PC_STEPS = 1000
# Samplers of each objective, the default first.
SAMPLERS = {'ddpm': ('ancestral', 'ddim', 'pc', 'ode'), 'score_sde': ('pc', 'ode'),
            'd3pm': ('ancestral',), 'cold': ()}


@dataclasses.dataclass(frozen=True)
class Diffusion(base.Task):
  """Options:
    objective: one of OBJECTIVES (table above).
    input_key: the record feature that is x_0.
    num_steps: T of ddpm, cold and d3pm (0: 1,000, 50 and 1,000).
    beta_start, beta_end: ddpm's linear β schedule (Ho et al.: 1e-4 to 0.02).
    sde: 'vp', 'subvp' or 've' (score_sde, with the SDE's default constants).
    degradation, blur_sigma: cold's degradation ('blur': a Gaussian of this σ per step, or
      'mask': pixels hidden in a fixed random order).
    transition, hybrid_weight: d3pm's transition matrices and the λ of its hybrid loss.
    num_samples, sample_steps: after each evaluation, a grid of `num_samples` images, for
      ddpm, score_sde and d3pm on images (0 samples: none); ddpm samples with `sample_steps`
      steps of its respaced schedule (0: all T), score_sde by the PC sampler with
      `sample_steps` steps of a predictor and a corrector call each (0: 1,000), d3pm always
      with all T steps.
  """
  rng_streams = ('dropout', 'diffusion')

  objective: str = 'ddpm'
  input_key: str = 'image'
  num_steps: int = 0
  beta_start: float = 1e-4
  beta_end: float = 0.02
  sde: str = 'vp'
  degradation: str = 'blur'
  blur_sigma: float = 1.0
  transition: str = 'absorbing'
  hybrid_weight: float = d3pm_lib.DEFAULT_HYBRID_WEIGHT
  num_samples: int = 0
  sample_steps: int = 0

  def validate(self):
    for name, value, allowed in (('objective', self.objective, OBJECTIVES),
                                 ('sde', self.sde, tuple(SDES)),
                                 ('degradation', self.degradation, DEGRADATIONS),
                                 ('transition', self.transition, TRANSITIONS)):
      if value not in allowed:
        raise ValueError(f'task.{name}={value!r}; allowed: {", ".join(allowed)}.')
    for name in ('num_steps', 'num_samples', 'sample_steps'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'task.{name} must be a non-negative integer, got {value!r}.')
    number = lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if self.objective == 'cold' and self.degradation == 'blur' and not (
        number(self.blur_sigma) and self.blur_sigma > 0):
      raise ValueError(f'task.blur_sigma={self.blur_sigma!r} must be a positive number (the '
                       'standard deviation in pixels of each step\'s Gaussian blur).')
    if self.objective == 'd3pm' and not (number(self.hybrid_weight) and self.hybrid_weight >= 0):
      raise ValueError(f'task.hybrid_weight={self.hybrid_weight!r} must be a non-negative number '
                       '(the λ of the cross-entropy term in d3pm\'s hybrid loss).')
    features = self.meta.get('features')
    if features is not None and self.input_key not in features:
      raise ValueError(f'task.input_key={self.input_key!r} is not a feature of the data set; '
                       f'its features are: {", ".join(sorted(features))}.')
    steps = self.num_steps or DEFAULT_STEPS.get(self.objective, 0)
    if self.sample_steps > max(steps, 1) and self.objective != 'score_sde':
      raise ValueError(f'task.sample_steps={self.sample_steps} exceeds the {steps} steps of '
                       f'the {self.objective} process.')
    if self.objective == 'score_sde' and 0 < self.sample_steps:
      fewest = sde_lib.min_pc_steps(SDES[self.sde]())  # the sampler of `sample`'s 'pc'
      if self.sample_steps < fewest:
        raise ValueError(f'task.sample_steps={self.sample_steps} is too few for the {self.sde} '
                         'SDE\'s predictor–corrector sampler, whose discrete β(t)·dt must stay '
                         f'below 1; give at least {fewest}.')
    parts = {'steps': steps}
    if self.objective == 'ddpm':
      parts['schedule'] = ddpm_lib.linear_schedule(steps, self.beta_start, self.beta_end)
    elif self.objective == 'score_sde':
      parts['sde'] = SDES[self.sde]()
    elif self.objective == 'd3pm':
      parts['schedule'] = d3pm_lib.make_schedule(
          self.transition, 3 if self.transition == 'absorbing' else 2, steps)
    object.__setattr__(self, '_parts', parts)

  # Host side ------------------------------------------------------------------

  def preprocess(self, records):
    x = np.asarray(records[self.input_key])
    if self.objective == 'd3pm' and (x.ndim != 4 or x.shape[-1] != 1):
      # One category per pixel: the loss and the samples read channel 0 only.
      raise ValueError(f'task.objective=\'d3pm\' needs one-channel images [H, W, 1]; '
                       f'{self.input_key!r} holds examples of shape {x.shape[1:]}.')
    if x.dtype == np.uint8:
      x = ((x >= 128).astype(np.int32) if self.objective == 'd3pm'
           else x.astype(np.float32) / 127.5 - 1)
    elif self.objective == 'd3pm':
      raise ValueError(f'task.objective=\'d3pm\' needs uint8 images; {self.input_key!r} holds '
                       f'{x.dtype}.')
    else:
      x = x.astype(np.float32)
    return {'x0': x}

  # Device side ----------------------------------------------------------------

  def model_inputs(self, batch):
    x0 = batch['x0']
    t_B = jnp.ones(x0.shape[:1], jnp.float32 if self.objective == 'score_sde' else jnp.int32)
    return (self._network_input(x0), t_B)

  def _network_input(self, x):
    """d3pm's categories as one-hot channels (the mask is the last); others as they are."""
    if self.objective != 'd3pm':
      return x
    return jax.nn.one_hot(x[..., 0], self._parts['schedule'].num_classes)

  def model_fn(self, model):
    """The model (a callable of (x, t)) as the objective's function of (x_t, t): the score
    −out/σ_t for score_sde, logits of x_0 from categories for d3pm, else the output itself."""
    if self.objective == 'score_sde':
      sde = self._parts['sde']

      def score_fn(x, t_B):
        _, std = sde.marginal(jnp.zeros_like(x), t_B)
        return -self._output(model, x, t_B, x.shape) / std
      return score_fn
    if self.objective == 'd3pm':
      # x_t [B, H, W] categories → logits [B, H, W, K].
      num_classes = self._parts['schedule'].num_classes
      return lambda x_t, t_B: self._output(model, self._network_input(x_t[..., None]), t_B,
                                           x_t.shape + (num_classes,))
    return lambda x, t_B: self._output(model, x, t_B, x.shape)

  def _output(self, model, x, t_B, expected_shape):
    """model(x, t) in float32, refused (at trace time) unless its shape is `expected_shape`:
    a network whose output does not match the data would broadcast into a wrong loss."""
    out = model(x, t_B)
    if out.shape != tuple(expected_shape):
      width = 'as many as the data\'s (None)' if self.objective != 'd3pm' else (
          f'{expected_shape[-1]}, the {self.transition} transition\'s categories')
      raise ValueError(f'The model\'s output has shape {tuple(out.shape)} where '
                       f'task.objective={self.objective!r} needs {tuple(expected_shape)}: set its '
                       f'output channels (model.out_channels of a U-Net, model.out_features of '
                       f'a TimeMLP) to {width}.')
    return out.astype(jnp.float32)

  def _degrade_fn(self, x0):
    if self.degradation == 'blur':
      return lambda x, t_B: cold_lib.blur(x, t_B, sigma=self.blur_sigma)
    rank_HxW = cold_lib.pixel_order(jax.random.PRNGKey(0), x0.shape[1], x0.shape[2])
    return lambda x, t_B: cold_lib.mask(x, t_B, rank_HxW=rank_HxW,
                                        num_steps=self._parts['steps'])

  def loss(self, model, batch):
    x0, key = batch['x0'], model.rngs['diffusion']
    fn = self.model_fn(model)
    per_dim = 1.0 / np.prod(x0.shape[1:])
    if self.objective == 'ddpm':
      loss_B = ddpm_lib.loss_terms(self._parts['schedule'], fn, x0, key) * per_dim
    elif self.objective == 'score_sde':
      loss_B = sde_lib.dsm_loss(self._parts['sde'], fn, x0, key) * per_dim
    elif self.objective == 'cold':
      t_B = jax.random.randint(key, x0.shape[:1], 1, self._parts['steps'] + 1)
      loss_B = cold_lib.restoration_loss(fn, self._degrade_fn(x0), x0, t_B)
    else:
      loss_B = d3pm_lib.hybrid_loss(key, self._parts['schedule'], fn, x0[..., 0],
                                    self.hybrid_weight)
    return {'loss': base.mean_over(loss_B)}

  # Sampling ---------------------------------------------------------------------

  def score_model(self, model):
    """(sde, score_fn) of a score_sde run, or of a ddpm run as its VP SDE
    (`sde.vp_sde_from_ddpm`, the ε-network as score by `sde.score_from_eps`); `model` is a
    callable of (x, t)."""
    if self.objective == 'score_sde':
      return self._parts['sde'], self.model_fn(model)
    if self.objective != 'ddpm':
      raise ValueError(f'task.objective={self.objective!r} has no score model; ddpm and '
                       'score_sde have.')
    sde = sde_lib.vp_sde_from_ddpm(self._parts['schedule'])
    return sde, sde_lib.score_from_eps(sde, self.model_fn(model), self._parts['schedule'])

  @property
  def process_steps(self) -> int:
    """T of ddpm, cold and d3pm (num_steps, or the objective's default)."""
    return self._parts['steps']

  def degrade_fn(self, x0):
    """cold's D(x, t) for images like x0 [B, H, W, C]."""
    return self._degrade_fn(x0)

  def sample(self, module, variables, key, num: int, steps: int = 0, shape=None,
             sampler: str | None = None, ode_grid: str = 'uniform') -> jax.Array:
    """`num` samples x_0 [num, …] of the trained model, with `steps`
    steps (0: every step of the process; 1,000 for 'pc', 100 for 'ode'); `shape` is one
    example's (default: the data's, from `meta['shapes']`). `sampler` is one of the
    objective's SAMPLERS (default the first): ancestral (ddpm: Algorithm 2 respaced to
    `steps`; d3pm: all T steps), ddim (σ = 0), pc (reverse-diffusion predictor and one
    Langevin corrector step) or ode (probability-flow ODE, RK4, on the time grid
    `ode_grid`: models.generative.sde.TIME_GRIDS). Images (examples of shape [H, W, C]) come
    back in [0, 1]; other data (the 2-D mixtures' points) in their own scale."""
    allowed = SAMPLERS[self.objective]
    sampler = sampler or (allowed[0] if allowed else None)
    if sampler not in allowed:
      names = ', '.join(allowed) or ('none (cold restores a degraded image: '
                                     'models.generative.cold.improved_sample)')
      raise ValueError(f'sampler={sampler!r} does not sample task.objective='
                       f'{self.objective!r}; allowed: {names}.')
    if ode_grid != 'uniform' and sampler != 'ode':
      raise ValueError(f'ode_grid={ode_grid!r} is the time grid of sampler=\'ode\', not of '
                       f'sampler={sampler!r}.')
    shape = tuple(shape or self.meta['shapes'][self.input_key])
    apply = lambda x, t: module.apply(variables, x, t)
    fn = self.model_fn(apply)
    full = (num,) + shape
    if self.objective == 'd3pm':
      x = d3pm_lib.sample(key, self._parts['schedule'], fn, full[:-1])[..., None]
      return x.astype(jnp.float32)
    if sampler == 'ancestral':
      x = ddpm_lib.sample(self._parts['schedule'], fn, full, key, num_steps=steps or None)
    elif sampler == 'ddim':
      x_T = jax.random.normal(key, full, jnp.float32)
      x = ddpm_lib.ddim_sample(self._parts['schedule'], fn, x_T, num_steps=steps or None)
    elif sampler == 'pc':
      x = sde_lib.pc_sample(*self.score_model(apply), full, key, num_steps=steps or PC_STEPS)
    else:
      x = sde_lib.ode_sample(*self.score_model(apply), full, key, num_steps=steps or 100,
                             spacing=ode_grid)
    return jnp.clip((x + 1) / 2, 0, 1) if len(shape) == 3 else x

  def eval_hooks(self):
    wants = self.num_samples and self.objective != 'cold'
    images = len(self.meta.get('shapes', {}).get(self.input_key, ())) == 3
    return [self._sample_grid] if wants and images else []

  def _sample_grid(self, context: base.HookContext) -> dict:
    images = np.asarray(jax.jit(lambda v, k: self.sample(
        context.module, v, k, self.num_samples, self.sample_steps))(context.variables,
                                                                     context.rng))
    return {'samples': image_grid(images)}


def image_grid(images_NxHxWxC: np.ndarray, columns: int | None = None) -> np.ndarray:
  """The images side by side, `columns` per row (default ⌈√N⌉), one pixel of 1 between."""
  n, h, w, c = images_NxHxWxC.shape
  columns = columns or int(np.ceil(np.sqrt(n)))
  rows = -(-n // columns)
  grid = np.ones((rows * (h + 1) - 1, columns * (w + 1) - 1, c), np.float32)
  for i, image in enumerate(images_NxHxWxC):
    r, col = divmod(i, columns)
    grid[r * (h + 1):r * (h + 1) + h, col * (w + 1):col * (w + 1) + w] = image
  return grid
