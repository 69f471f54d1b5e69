"""Optax optimisers, gradient clipping and learning-rate schedules from config.

`config` is the `optimizer` block of an experiment config (an
`ml_collections.ConfigDict` or any object with the same attributes):

  name: 'sgd' | 'momentum' | 'adam' | 'adamw'
  learning_rate: peak learning rate (> 0)
  momentum, nesterov: for 'momentum' (heavy ball or Nesterov)
  b1, b2, eps: for 'adam'/'adamw' (eps > 0)
  weight_decay: λ. For 'adamw' the decoupled decay of Loshchilov & Hutter
    (θ ← θ − η(update + λθ)); for 'sgd' and 'momentum' the classic L2 term
    added to the gradient before the momentum (g ← g + λθ, as in He et al.
    2016); 'adam' has none.
  weight_decay_mask: 'all' (every parameter) | 'kernels' (parameters of two or
    more dimensions other than biases and log-variances: kernels and embedding
    tables; no decay on biases, even an attention layer's [heads, head_dim] ones,
    on normalisation scales/offsets, nor on a VAE's per-pixel decoder log σ²)
  grad_clip_norm: clip by global norm (Pascanu et al. 2013) when > 0
  schedule: 'constant' | 'step' | 'cosine' | 'warmup_cosine'
  warmup_steps (an integer, for 'warmup_cosine' only), decay_factor, boundaries
  (fractions of the run for 'step'),
  final_lr_fraction (the cosine floor as a fraction of the peak).
"""

import fractions
import math
import numbers

import jax
import optax

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adamw')
SCHEDULES = ('constant', 'step', 'cosine', 'warmup_cosine')
DECAY_MASKS = ('all', 'kernels')


def validate(config, total_steps: int) -> None:
  """Raises ValueError, in one sentence, for an optimizer block that cannot work."""
  if config.name not in OPTIMIZERS:
    raise ValueError(f'Unknown optimizer {config.name!r}; allowed: {", ".join(OPTIMIZERS)}.')
  _check_number(config, 'learning_rate', None, lambda v: v > 0, 'positive')
  schedule = config.get('schedule', 'constant')
  if schedule not in SCHEDULES:
    raise ValueError(f'Unknown learning-rate schedule {schedule!r}; allowed: {", ".join(SCHEDULES)}.')
  warmup = config.get('warmup_steps', 0)
  if (not isinstance(warmup, numbers.Integral) or isinstance(warmup, bool)
      or not 0 <= warmup < total_steps):
    raise ValueError(f'optimizer.warmup_steps must be an integer in [0, {total_steps}) for a '
                     f'run of {total_steps} steps, got {warmup!r}.')
  if warmup and schedule != 'warmup_cosine':
    raise ValueError(f'optimizer.warmup_steps={warmup} warms up only the \'warmup_cosine\' '
                     f'schedule, not {schedule!r}; set it to 0 or choose warmup_cosine.')
  if config.get('weight_decay_mask', 'all') not in DECAY_MASKS:
    raise ValueError(f'Unknown optimizer.weight_decay_mask {config.weight_decay_mask!r}; allowed: '
                     f'{", ".join(DECAY_MASKS)}.')
  _check_number(config, 'weight_decay', 0.0, lambda v: v >= 0, '>= 0')
  _check_number(config, 'grad_clip_norm', 0.0, lambda v: v >= 0, '>= 0 (0 disables clipping)')
  _check_number(config, 'momentum', 0.9, lambda v: 0 <= v < 1, 'in [0, 1)')
  if config.get('nesterov', False) not in (True, False):
    raise ValueError(f'optimizer.nesterov must be True or False, got {config.nesterov!r}.')
  for key, default in (('b1', 0.9), ('b2', 0.999)):
    _check_number(config, key, default, lambda v: 0 <= v < 1, 'in [0, 1)')
  if config.name in ('adam', 'adamw'):
    # Adam divides by √v̂ + ε: with ε = 0, a parameter whose gradients have all been 0 so far
    # (an input pixel that is always 0, an embedding row not yet seen) gets 0/0 = NaN.
    _check_number(config, 'eps', 1e-8, lambda v: v > 0,
                  f'positive for {config.name} (it divides by sqrt(v) + eps, so with 0 a '
                  'parameter whose gradient is 0 gets 0/0)')
  else:
    _check_number(config, 'eps', 1e-8, lambda v: v >= 0, '>= 0')
  _check_number(config, 'final_lr_fraction', 0.0, lambda v: 0 <= v <= 1,
                'in [0, 1] (the cosine floor as a fraction of the peak learning rate)')
  _check_number(config, 'decay_factor', 0.1, lambda v: v > 0,
                'positive (the learning rate is multiplied by it at each boundary)')
  if schedule == 'step':
    _check_boundaries(config.get('boundaries', (0.5, 0.75)), total_steps)


def _check_number(config, key: str, default, in_range, allowed: str) -> None:
  """Raises ValueError unless optimizer.`key` is a finite number for which `in_range` holds."""
  value = config.get(key, default)
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f'optimizer.{key} must be a finite number that is {allowed}, got {value!r}.')
  if not in_range(value):
    raise ValueError(f'optimizer.{key} must be {allowed}, got {value!r}.')


def _boundary_steps(boundaries, total_steps: int) -> list[int]:
  """The steps at which the 'step' schedule decays: boundary b (a fraction of the run) at b·T
  rounded down, b taken as the decimal it prints as (in floats 0.29 · 100 is 28.999…)."""
  return [math.floor(fractions.Fraction(repr(float(b))) * total_steps) for b in boundaries]


def _check_boundaries(boundaries, total_steps: int) -> None:
  """Boundaries are increasing fractions of the run, each on its own step after 0."""
  if (not isinstance(boundaries, (tuple, list))
      or not all(isinstance(b, numbers.Real) and not isinstance(b, bool) and 0 < b < 1
                 for b in boundaries)):
    raise ValueError(f'optimizer.boundaries must be fractions of the run, each strictly between 0 '
                     f'and 1 (not step numbers), got {boundaries!r}.')
  if any(a >= b for a, b in zip(boundaries, boundaries[1:])):
    raise ValueError(f'optimizer.boundaries must be strictly increasing, got {boundaries!r}.')
  steps = _boundary_steps(boundaries, total_steps)
  if steps and steps[0] == 0:
    raise ValueError(f'optimizer.boundaries {boundaries[0]!r} falls on step 0 of a run of '
                     f'{total_steps} steps (boundary b decays at step b·{total_steps} rounded '
                     f'down), so the peak learning rate would never be used; allowed: fractions '
                     f'>= 1/{total_steps}.')
  for (a, step_a), (b, step_b) in zip(zip(boundaries, steps), zip(boundaries[1:], steps[1:])):
    if step_a == step_b:
      raise ValueError(f'optimizer.boundaries {a!r} and {b!r} both fall on step {step_a} of a run '
                       f'of {total_steps} steps (boundary b decays at step b·{total_steps} '
                       f'rounded down), so only one decay would happen; allowed: boundaries on '
                       f'distinct steps (fractions at least 1/{total_steps} apart).')


def make_schedule(config, total_steps: int) -> optax.Schedule:
  """The learning rate as a function of the step."""
  peak = config.learning_rate
  schedule = config.get('schedule', 'constant')
  floor = peak * config.get('final_lr_fraction', 0.0)
  if schedule == 'constant':
    return optax.constant_schedule(peak)
  if schedule == 'step':
    boundaries = config.get('boundaries', (0.5, 0.75))
    factor = config.get('decay_factor', 0.1)
    return optax.piecewise_constant_schedule(
        peak, {step: factor for step in _boundary_steps(boundaries, total_steps)})
  if schedule == 'cosine':
    return optax.cosine_decay_schedule(peak, total_steps, alpha=floor / peak)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=config.get('warmup_steps', 0),
      decay_steps=total_steps, end_value=floor)


def make_optimizer(config, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns the Optax transformation and its learning-rate schedule."""
  validate(config, total_steps)
  lr = make_schedule(config, total_steps)
  if config.name in ('sgd', 'momentum'):
    momentum = config.get('momentum', 0.9) if config.name == 'momentum' else None
    tx = optax.sgd(lr, momentum=momentum, nesterov=momentum is not None and config.get('nesterov', False))
    if config.get('weight_decay', 0.0) > 0:
      tx = optax.chain(optax.add_decayed_weights(config.weight_decay,
                                                 decay_mask(config.get('weight_decay_mask', 'all'))), tx)
  elif config.name == 'adam':
    tx = optax.adam(lr, b1=config.get('b1', 0.9), b2=config.get('b2', 0.999), eps=config.get('eps', 1e-8))
  else:
    tx = optax.adamw(lr, b1=config.get('b1', 0.9), b2=config.get('b2', 0.999),
                     eps=config.get('eps', 1e-8), weight_decay=config.get('weight_decay', 1e-4),
                     mask=decay_mask(config.get('weight_decay_mask', 'all')))
  if config.get('grad_clip_norm', 0.0) > 0:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, lr


# Parameters of two or more dimensions that 'kernels' spares by name: an attention layer's
# [heads, head_dim] bias, and the VAE's Gaussian decoder log σ², per pixel [H, W, C] (a
# variance, which decay would pull towards σ = 1 whatever the data).
NOT_DECAYED = ('bias', 'decoder_log_var')


def decay_mask(kind: str):
  """The pytree mask (True: decayed) of `weight_decay_mask` kind, or None for 'all'."""
  if kind == 'all':
    return None
  # Kernels and embeddings have two or more dimensions; batch- and layer-norm scales and
  # offsets have one, biases one or two.
  def spared(path) -> bool:
    return getattr(path[-1], 'key', None) in NOT_DECAYED if path else False
  return lambda params: jax.tree_util.tree_map_with_path(
      lambda path, p: p.ndim >= 2 and not spared(path), params)
