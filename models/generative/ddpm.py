"""Denoising diffusion probabilistic models (Ho et al. 2020, "DDPM").

The forward process adds Gaussian noise in T steps with variances β_1 … β_T:

  q(x_t | x_{t−1}) = N(√α_t x_{t−1}, β_t I),          α_t = 1 − β_t           (eq. 2)
  q(x_t | x_0)     = N(√ᾱ_t x_0, (1 − ᾱ_t) I),        ᾱ_t = Π_{s≤t} α_s       (eq. 4)
  q(x_{t−1} | x_t, x_0) = N(μ̃_t(x_t, x_0), β̃_t I),                            (eqs. 6–7)
      μ̃_t = √ᾱ_{t−1} β_t / (1 − ᾱ_t) · x_0 + √α_t (1 − ᾱ_{t−1}) / (1 − ᾱ_t) · x_t,
      β̃_t = (1 − ᾱ_{t−1}) / (1 − ᾱ_t) · β_t.

A network ε_θ(x_t, t) predicts the noise of x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε and is
trained on ‖ε − ε_θ(x_t, t)‖² (eq. 14); sampling runs Algorithm 2 from x_T ~ N(0, I):

  x_{t−1} = (x_t − β_t / √(1 − ᾱ_t) · ε_θ(x_t, t)) / √α_t + σ_t z,  σ_t² = β_t or β̃_t.

Indexing: timesteps are 1-based, t = 1 … T, as in the paper; a `Schedule` stores the
value of timestep t at index t − 1, and ᾱ_0 = 1. The network is called with the
*original* timestep, also after respacing (Nichol & Dhariwal 2021, §4), which keeps
K < T of the timesteps τ_1 < … < τ_K = T and recomputes β_k = 1 − ᾱ_{τ_k} / ᾱ_{τ_{k−1}}
so that q(x_{τ_k} | x_0) is unchanged. `ddim_sample` is the deterministic sampler of
Song et al. 2021a (η = 0).

Noise-predicting functions have the signature `eps_fn(x_t, t_B) -> ε̂` with x_t
[B, …] of any trailing shape and t_B int32 [B].
"""

import numbers
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

EpsFn = Callable[[jax.Array, jax.Array], jax.Array]

VARIANCES = ('beta', 'beta_tilde')


class Schedule(NamedTuple):
  """Per-timestep constants of a T-step forward process; entry t − 1 belongs to timestep t.

  1 − ᾱ is stored beside ᾱ: near t = 1 it is ~1e-4, and 1 − float32(ᾱ) would keep only
  four digits of it.

  Attributes:
    betas_T: β_t.
    alphas_T: α_t = 1 − β_t.
    alpha_bars_T, one_minus_alpha_bars_T: ᾱ_t = Π_{s≤t} α_s and 1 − ᾱ_t.
    alpha_bars_prev_T, one_minus_alpha_bars_prev_T: ᾱ_{t−1} and 1 − ᾱ_{t−1} (ᾱ_0 = 1).
    posterior_variances_T: β̃_t = (1 − ᾱ_{t−1}) / (1 − ᾱ_t) β_t (0 at t = 1).
    timesteps_T: the timestep the network is called with (t itself, or the original
      timestep τ_t of a respaced schedule).
  """
  betas_T: jax.Array
  alphas_T: jax.Array
  alpha_bars_T: jax.Array
  one_minus_alpha_bars_T: jax.Array
  alpha_bars_prev_T: jax.Array
  one_minus_alpha_bars_prev_T: jax.Array
  posterior_variances_T: jax.Array
  timesteps_T: jax.Array

  @property
  def num_steps(self) -> int:
    return self.betas_T.shape[0]


def schedule_from_betas(betas_T, timesteps_T=None) -> Schedule:
  """The schedule of variances β_1 … β_T: log ᾱ_t = Σ_{s≤t} log(1 − β_s), ᾱ_t and 1 − ᾱ_t
  from it by exp and expm1. Computed in float64 and stored in float32, unless β is traced
  (inside jax.jit), when it is computed in float32. `timesteps_T` defaults to 1 … T."""
  xp, dtype = (jnp, jnp.float32) if isinstance(betas_T, jax.core.Tracer) else (np, np.float64)
  betas_T = xp.asarray(betas_T, dtype)
  log_alpha_bars_T = xp.cumsum(xp.log1p(-betas_T))
  log_alpha_bars_prev_T = xp.concatenate([xp.zeros((1,), dtype), log_alpha_bars_T[:-1]])
  one_minus_alpha_bars_T = -xp.expm1(log_alpha_bars_T)
  one_minus_alpha_bars_prev_T = -xp.expm1(log_alpha_bars_prev_T)
  float32 = lambda a: jnp.asarray(a, jnp.float32)
  if timesteps_T is None:
    timesteps_T = np.arange(1, betas_T.shape[0] + 1)
  return Schedule(
      betas_T=float32(betas_T), alphas_T=float32(1 - betas_T),
      alpha_bars_T=float32(xp.exp(log_alpha_bars_T)),
      one_minus_alpha_bars_T=float32(one_minus_alpha_bars_T),
      alpha_bars_prev_T=float32(xp.exp(log_alpha_bars_prev_T)),
      one_minus_alpha_bars_prev_T=float32(one_minus_alpha_bars_prev_T),
      posterior_variances_T=float32(one_minus_alpha_bars_prev_T / one_minus_alpha_bars_T * betas_T),
      timesteps_T=jnp.asarray(timesteps_T, jnp.int32))


def linear_schedule(T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> Schedule:
  """β_t linear from β_1 = beta_start to β_T = beta_end (Ho et al. 2020, §4: 1e-4 to 0.02)."""
  if isinstance(T, bool) or not isinstance(T, numbers.Integral) or T < 1:
    raise ValueError(f'T={T!r} must be a positive integer.')
  if not 0 < beta_start <= beta_end < 1:
    raise ValueError(f'beta_start={beta_start} and beta_end={beta_end} must satisfy '
                     f'0 < beta_start <= beta_end < 1.')
  return schedule_from_betas(np.linspace(beta_start, beta_end, int(T)))


def respace(schedule: Schedule, num_steps: int) -> Schedule:
  """The K = num_steps timesteps τ_k = round(1 + (k − 1)(T − 1)/(K − 1)), k = 1 … K (τ_1 = T
  if K = 1), with β_k = 1 − ᾱ_{τ_k}/ᾱ_{τ_{k−1}} (Nichol & Dhariwal 2021, §4), so that
  q(x_{τ_k} | x_0) is unchanged; K = T returns `schedule`."""
  total = schedule.num_steps
  if (isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral)
      or not 1 <= num_steps <= total):
    raise ValueError(f'num_steps={num_steps!r} must be an integer from 1 to T={total}.')
  num_steps = int(num_steps)
  if num_steps == total:
    return schedule
  # Spacing (T − 1)/(K − 1) ≥ 1, so the rounded indices are distinct.
  kept = (np.round(np.linspace(0, total - 1, num_steps)).astype(np.int32) if num_steps > 1
          else np.array([total - 1], np.int32))
  betas_T = schedule.betas_T
  xp, dtype = (jnp, jnp.float32) if isinstance(betas_T, jax.core.Tracer) else (np, np.float64)
  log_alpha_bars_K = xp.cumsum(xp.log1p(-xp.asarray(betas_T, dtype)))[kept]
  log_alphas_K = xp.diff(log_alpha_bars_K, prepend=xp.zeros((1,), dtype))
  return schedule_from_betas(-xp.expm1(log_alphas_K), schedule.timesteps_T[kept])


def _at(values_T, t_B, x):
  """values[t − 1] for each example, shaped to broadcast against x [B, …]; NaN for a step
  outside 1 … T (a traced step cannot be checked before it is used)."""
  picked_B = values_T.at[t_B - 1].get(mode='fill', fill_value=jnp.nan, wrap_negative_indices=False)
  return picked_B.reshape((-1,) + (1,) * (x.ndim - 1))


def per_example_steps(t, x, first: int = 1, last: int | None = None):
  """t as int32 [B] for x [B, …]: a scalar is used for every example (ddpm, cold, d3pm).

  Steps given as values (not traced) must be integers from `first` to `last` (None: no upper
  bound): a step 0 of a process numbered from 1 would otherwise read step T, and 0.5 step 0.
  """
  if not isinstance(t, jax.core.Tracer):
    values = np.asarray(t)
    whole = np.issubdtype(values.dtype, np.integer) or np.all(values == np.round(values))
    if values.size and (values.dtype == bool or not whole or values.min() < first
                        or (last is not None and values.max() > last)):
      bounds = f'from {first} to {last}' if last is not None else f'of at least {first}'
      raise ValueError(f'Steps t={values.tolist()} must be integers {bounds}.')
  t = jnp.asarray(t)
  if t.ndim > 1 or (t.ndim == 1 and t.shape[0] != x.shape[0]):
    raise ValueError(f't of shape {t.shape} must be a scalar or one step per example, '
                     f'[B] = [{x.shape[0]}].')
  return jnp.broadcast_to(t.astype(jnp.int32), x.shape[:1])


def q_sample(schedule: Schedule, x0, t, noise):
  """x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε (eq. 4); t is an int or int [B] in 1 … T."""
  t_B = per_example_steps(t, x0, last=schedule.num_steps)
  return (jnp.sqrt(_at(schedule.alpha_bars_T, t_B, x0)) * x0
          + jnp.sqrt(_at(schedule.one_minus_alpha_bars_T, t_B, x0)) * noise)


def loss_terms(schedule: Schedule, eps_fn: EpsFn, x0, key):
  """Per-example ‖ε − ε_θ(x_t, t)‖² summed over all but the batch axis, t ~ U{1 … T} and
  ε ~ N(0, I) drawn from `key` (the "simple" objective, Ho et al. 2020 eq. 14). Returns
  float32 [B]; divide by the number of dimensions for a per-dimension mean."""
  t_key, noise_key = jax.random.split(key)
  t_B = jax.random.randint(t_key, x0.shape[:1], 1, schedule.num_steps + 1)
  noise = jax.random.normal(noise_key, x0.shape, jnp.float32)
  error = noise - eps_fn(q_sample(schedule, x0, t_B, noise), schedule.timesteps_T[t_B - 1])
  return jnp.sum(jnp.square(error.astype(jnp.float32)).reshape(x0.shape[0], -1), axis=-1)


def posterior_mean_variance(schedule: Schedule, x0, x_t, t):
  """Mean μ̃_t(x_t, x_0) [B, …] and variance β̃_t [B, 1, …] of q(x_{t−1} | x_t, x_0) (eqs. 6–7)."""
  t_B = per_example_steps(t, x_t, last=schedule.num_steps)
  alpha_bar_prev, one_minus_alpha_bar_prev, one_minus_alpha_bar, beta, alpha = (
      _at(a, t_B, x_t) for a in (schedule.alpha_bars_prev_T, schedule.one_minus_alpha_bars_prev_T,
                                 schedule.one_minus_alpha_bars_T, schedule.betas_T,
                                 schedule.alphas_T))
  mean = (jnp.sqrt(alpha_bar_prev) * beta * x0 + jnp.sqrt(alpha) * one_minus_alpha_bar_prev * x_t
          ) / one_minus_alpha_bar
  return mean, _at(schedule.posterior_variances_T, t_B, x_t)


def check_shape(shape):
  """Raises ValueError unless `shape` is a batch shape [B, …] of positive integers."""
  if (not isinstance(shape, (tuple, list)) or not shape
      or not all(isinstance(n, int) and n > 0 for n in shape)):
    raise ValueError(f'shape={shape!r} must be a non-empty tuple of positive integers [B, …].')


def _check_variance(variance):
  if variance not in VARIANCES:
    raise ValueError(f'variance={variance!r}; allowed: {", ".join(VARIANCES)}.')


def p_sample_step(schedule: Schedule, eps_fn: EpsFn, x_t, t, key, variance: str = 'beta'):
  """One ancestral step x_t → x_{t−1} of Algorithm 2:

    x_{t−1} = (x_t − β_t / √(1 − ᾱ_t) · ε_θ(x_t, t)) / √α_t + σ_t z,

  σ_t² = β_t (variance='beta') or β̃_t ('beta_tilde'), z ~ N(0, I) from `key`, and no noise
  at t = 1. t is an int or int [B] in 1 … T of `schedule`."""
  _check_variance(variance)
  t_B = per_example_steps(t, x_t, last=schedule.num_steps)
  eps = eps_fn(x_t, schedule.timesteps_T[t_B - 1])
  beta, alpha = _at(schedule.betas_T, t_B, x_t), _at(schedule.alphas_T, t_B, x_t)
  mean = (x_t - beta / jnp.sqrt(_at(schedule.one_minus_alpha_bars_T, t_B, x_t)) * eps
          ) / jnp.sqrt(alpha)
  sigma2 = beta if variance == 'beta' else _at(schedule.posterior_variances_T, t_B, x_t)
  noise = jax.random.normal(key, x_t.shape, x_t.dtype)
  return mean + jnp.where(t_B.reshape(sigma2.shape) > 1, jnp.sqrt(sigma2), 0) * noise


def sample(schedule: Schedule, eps_fn: EpsFn, shape, key, num_steps: int | None = None,
           variance: str = 'beta'):
  """x_0 by Algorithm 2 from x_T ~ N(0, I) of `shape` [B, …]: all T steps, or num_steps
  of the respaced schedule (Nichol & Dhariwal 2021, §4). x_T uses key fold_in(key, 0),
  the step from timestep t key fold_in(key, t)."""
  _check_variance(variance)
  check_shape(shape)
  schedule = respace(schedule, schedule.num_steps if num_steps is None else num_steps)
  x_T = jax.random.normal(jax.random.fold_in(key, 0), tuple(shape), jnp.float32)
  total = schedule.num_steps

  def step(i, x):
    t = total - i
    return p_sample_step(schedule, eps_fn, x, t, jax.random.fold_in(key, t), variance)

  return jax.lax.fori_loop(0, total, step, x_T)


def ddim_sample(schedule: Schedule, eps_fn: EpsFn, x_T, num_steps: int | None = None):
  """The deterministic DDIM sampler (Song et al. 2021a, eq. 12 with σ_t = 0) from x_T:

    x̂_0 = (x_t − √(1 − ᾱ_t) ε_θ(x_t, t)) / √ᾱ_t,
    x_{t−1} = √ᾱ_{t−1} x̂_0 + √(1 − ᾱ_{t−1}) ε_θ(x_t, t),

  over all T steps or over num_steps of the respaced schedule; the last step (ᾱ_0 = 1)
  returns x̂_0."""
  schedule = respace(schedule, schedule.num_steps if num_steps is None else num_steps)
  total = schedule.num_steps

  def step(i, x):
    t_B = per_example_steps(total - i, x)
    eps = eps_fn(x, schedule.timesteps_T[t_B - 1])
    alpha_bar, one_minus_alpha_bar, alpha_bar_prev, one_minus_alpha_bar_prev = (
        _at(a, t_B, x) for a in (schedule.alpha_bars_T, schedule.one_minus_alpha_bars_T,
                                 schedule.alpha_bars_prev_T, schedule.one_minus_alpha_bars_prev_T))
    x0_hat = (x - jnp.sqrt(one_minus_alpha_bar) * eps) / jnp.sqrt(alpha_bar)
    return jnp.sqrt(alpha_bar_prev) * x0_hat + jnp.sqrt(one_minus_alpha_bar_prev) * eps

  return jax.lax.fori_loop(0, total, step, jnp.asarray(x_T, jnp.float32))
