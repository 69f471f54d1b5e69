"""Discrete denoising diffusion, D3PM (Austin et al. 2021, "Structured Denoising Diffusion
Models in Discrete State-Spaces").

Each position holds a category x ∈ {0, …, K−1}, written as a one-hot row vector. The forward
process multiplies by row-stochastic matrices, [Q_t]_ij = q(x_t = j | x_{t−1} = i):

  q(x_t | x_{t−1}) = Cat(x_t; x_{t−1} Q_t),   q(x_t | x_0) = Cat(x_t; x_0 Q̄_t),
  Q̄_t = Q_1 Q_2 ⋯ Q_t                                                        (eqs. 1–2)
  q(x_{t−1} | x_t, x_0) ∝ (x_t Q_tᵀ) ⊙ (x_0 Q̄_{t−1})                          (eq. 3)
  p_θ(x_{t−1} | x_t) ∝ Σ_{x̃_0} q(x_{t−1}, x_t | x̃_0) p̃_θ(x̃_0 | x_t)            (eq. 4)
  L_λ = L_vb + λ E_{q(x_0)} E_{q(x_t|x_0)}[−log p̃_θ(x_0 | x_t)]               (eq. 5)

with L_vb = KL(q(x_T|x_0) ‖ p(x_T)) + Σ_{t≥2} KL(q(x_{t−1}|x_t,x_0) ‖ p_θ(x_{t−1}|x_t))
− log p_θ(x_0|x_1). The network p̃_θ predicts x_0 (`logits_fn(x_t, t)` → logits [..., K]).

Both kinds of corruption have the form Q_t = (1 − β_t) I + β_t 1 mᵀ for a distribution m:
  'uniform'   (Appendix A.2.1): m = 1/K, so [Q_t]_ij = (1 − β_t) δ_ij + β_t / K;
  'absorbing' (Appendix A.2.2): m = e_{K−1}, the mask token (data use 0 … K−2): a token stays
              with probability 1 − β_t and becomes the mask with β_t; the mask stays the mask.
Since mᵀ1 = 1, (aI + (1−a) 1mᵀ)(bI + (1−b) 1mᵀ) = ab I + (1 − ab) 1mᵀ, hence the closed form
  Q̄_t = ᾱ_t I + (1 − ᾱ_t) 1 mᵀ,   ᾱ_t = Π_{s≤t} (1 − β_s),
and the prior p(x_T) = m.

Default schedules (the noise-schedule discussion of Austin et al. 2021, §3):
  absorbing: the mutual-information schedule β_t = 1/(T − t + 1) (Sohl-Dickstein et al. 2015),
             for which ᾱ_t = 1 − t/T: a fraction t/T of the tokens is masked and x_T is all mask;
  uniform:   the cosine schedule of Nichol & Dhariwal 2021 (eq. 17), ᾱ_t = f(t)/f(0) with
             f(t) = cos²(π/2 · (t/T + s)/(1 + s)), s = 0.008, so ᾱ_T = 0 and
             β_t = 1 − ᾱ_t/ᾱ_{t−1}.
Any β_1 … β_T in [0, 1] can be given instead.

Zero probabilities (the absorbing state) are kept as log-probabilities of −∞. Losses return one
value per example, in nats per position (the mean over every non-batch axis of x_0).
"""

import numbers
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from models.generative import ddpm as ddpm_lib

KINDS = ('uniform', 'absorbing')
DEFAULT_HYBRID_WEIGHT = 0.01  # λ of eq. 5, the paper's value
COSINE_OFFSET = 0.008  # s of Nichol & Dhariwal 2021, eq. 17

LogitsFn = Callable[[jax.Array, jax.Array], jax.Array]  # (x_t [B, …], t [B]) → logits [B, …, K]


@struct.dataclass
class Schedule:
  """β_t and ᾱ_t for t = 0 … T of a D3PM with K categories, indexed by t (β_0 = 0, ᾱ_0 = 1).

  1 − ᾱ_t is kept apart from ᾱ_t: for small t it is tiny and would lose its digits in
  float32 as 1 − ᾱ_t.
  """
  betas: jax.Array  # [T + 1]
  alpha_bars: jax.Array  # [T + 1]
  one_minus_alpha_bars: jax.Array  # [T + 1]
  kind: str = struct.field(pytree_node=False)
  num_classes: int = struct.field(pytree_node=False)

  @property
  def num_steps(self) -> int:
    return self.betas.shape[0] - 1


def make_schedule(kind: str, num_classes: int, num_steps: int, betas=None) -> Schedule:
  """The schedule of a D3PM of `kind` ('uniform' or 'absorbing') with K = `num_classes`
  categories (for 'absorbing' the last one is the mask) and T = `num_steps` steps; `betas`
  [T] are β_1 … β_T, by default the kind's schedule of the module doc. Arrays are float64 when
  64-bit JAX is enabled, float32 otherwise."""
  if kind not in KINDS:
    raise ValueError(f'kind={kind!r} is not a D3PM transition; allowed: {", ".join(KINDS)}.')
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
    raise ValueError(f'num_classes={num_classes!r} must be an integer of at least 2.')
  if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1:
    raise ValueError(f'num_steps={num_steps!r} must be a positive integer.')
  num_steps = int(num_steps)
  steps = np.arange(1, num_steps + 1, dtype=np.float64)
  if betas is not None:
    betas = np.asarray(betas, np.float64)
    if betas.shape != (num_steps,) or not np.all((betas >= 0) & (betas <= 1)):
      raise ValueError(f'betas must be {num_steps} values β_1 … β_T in [0, 1], got '
                       f'{np.array2string(betas, threshold=8, precision=3)}.')
  elif kind == 'absorbing':
    betas = 1 / (num_steps - steps + 1)
  else:
    f = lambda t: np.cos(np.pi / 2 * (t / num_steps + COSINE_OFFSET) / (1 + COSINE_OFFSET)) ** 2
    betas = 1 - f(steps) / f(steps - 1)
  betas = np.concatenate([[0.0], betas])
  with np.errstate(divide='ignore'):  # log 0 = −∞ from β_s = 1 on
    log_alpha_bars = np.cumsum(np.log1p(-betas))
  alpha_bars = np.exp(log_alpha_bars)
  return Schedule(betas=jnp.asarray(betas), alpha_bars=jnp.asarray(alpha_bars),
                  one_minus_alpha_bars=jnp.asarray(-np.expm1(log_alpha_bars)), kind=kind,
                  num_classes=num_classes)


def stationary_probs(schedule: Schedule) -> jax.Array:
  """m [K]: 1/K for 'uniform', the mask e_{K−1} for 'absorbing'; p(x_T) = m."""
  dtype = schedule.alpha_bars.dtype
  if schedule.kind == 'uniform':
    return jnp.full((schedule.num_classes,), 1 / schedule.num_classes, dtype)
  return jax.nn.one_hot(schedule.num_classes - 1, schedule.num_classes, dtype=dtype)


def one_step_matrix(schedule: Schedule, t) -> jax.Array:
  """Q_t = (1 − β_t) I + β_t 1 mᵀ [K, K] for one step t ∈ {1 … T} (t = 0 gives I)."""
  beta = schedule.betas[t]
  eye_KxK = jnp.eye(schedule.num_classes, dtype=beta.dtype)
  return (1 - beta) * eye_KxK + beta * stationary_probs(schedule)[None, :]


def cumulative_matrix(schedule: Schedule, t) -> jax.Array:
  """Q̄_t = Q_1 ⋯ Q_t = ᾱ_t I + (1 − ᾱ_t) 1 mᵀ [K, K] in closed form, t ∈ {0 … T}."""
  eye_KxK = jnp.eye(schedule.num_classes, dtype=schedule.alpha_bars.dtype)
  return (schedule.alpha_bars[t] * eye_KxK
          + schedule.one_minus_alpha_bars[t] * stationary_probs(schedule)[None, :])


def q_probs(schedule: Schedule, x0, t) -> jax.Array:
  """q(x_t | x_0) = x_0 Q̄_t = ᾱ_t x_0 + (1 − ᾱ_t) m [B, …, K] (eq. 2) for integer x_0 [B, …]
  and steps t (a scalar or one per example, [B])."""
  t_B = ddpm_lib.per_example_steps(t, x0, first=0, last=schedule.num_steps)
  x0_onehot = jax.nn.one_hot(x0, schedule.num_classes, dtype=schedule.alpha_bars.dtype)
  return (_at(schedule.alpha_bars, t_B, x0_onehot.ndim) * x0_onehot
          + _at(schedule.one_minus_alpha_bars, t_B, x0_onehot.ndim) * stationary_probs(schedule))


def q_sample(key, schedule: Schedule, x0, t) -> jax.Array:
  """x_t ~ q(x_t | x_0) [B, …] (int32)."""
  return jax.random.categorical(key, jnp.log(q_probs(schedule, x0, t))).astype(jnp.int32)


def q_posterior_logits(schedule: Schedule, x0, x_t, t) -> jax.Array:
  """log q(x_{t−1} | x_t, x_0) [B, …, K], normalised, for t ∈ {1 … T} (eq. 3):

    q(x_{t−1} = j | x_t, x_0) ∝ [Q_t]_{j, x_t} · [Q̄_{t−1}]_{x_0, j}.

  Impossible pairs (an absorbing x_t that is neither x_0 nor the mask) give NaN.
  """
  log_x0 = jnp.log(jax.nn.one_hot(x0, schedule.num_classes, dtype=schedule.alpha_bars.dtype))
  return _posterior_logits(schedule, log_x0, x_t,
                           ddpm_lib.per_example_steps(t, x_t, last=schedule.num_steps))


def p_logits(schedule: Schedule, x_t, t, x0_logits) -> jax.Array:
  """log p_θ(x_{t−1} | x_t) [B, …, K], normalised, for t ∈ {1 … T}, from the network's logits of
  x_0 [B, …, K] (eq. 4):

    p_θ(x_{t−1} = j | x_t) ∝ Σ_{x̃_0} [Q̄_{t−1}]_{x̃_0, j} [Q_t]_{j, x_t} p̃_θ(x̃_0 | x_t)
                            = [Q_t]_{j, x_t} · (ᾱ_{t−1} p̃_θ(j | x_t) + (1 − ᾱ_{t−1}) m_j).

  At t = 1 (ᾱ_0 = 1) this is p_θ(x_0 | x_1) ∝ [Q_1]_{x_0, x_1} p̃_θ(x_0 | x_1).
  """
  if x0_logits.shape != x_t.shape + (schedule.num_classes,):
    raise ValueError(f'x0 logits of shape {x0_logits.shape} must be x_t.shape + (K,) = '
                     f'{x_t.shape + (schedule.num_classes,)}.')
  log_p0 = jax.nn.log_softmax(x0_logits.astype(
      jnp.promote_types(x0_logits.dtype, schedule.alpha_bars.dtype)), axis=-1)
  return _posterior_logits(schedule, log_p0, x_t,
                           ddpm_lib.per_example_steps(t, x_t, last=schedule.num_steps))


def prior_kl(schedule: Schedule, x0) -> jax.Array:
  """KL(q(x_T | x_0) ‖ p(x_T)) [B] with p(x_T) = m, nats per position: L_T of L_vb. It is 0
  when ᾱ_T = 0 (both default schedules) and +∞ for 'absorbing' with ᾱ_T > 0."""
  q_BxK = q_probs(schedule, x0, schedule.num_steps)
  return _mean_over_positions(_kl(jnp.log(q_BxK), jnp.log(stationary_probs(schedule))))


def vb_term(schedule: Schedule, x0, x_t, t, x0_logits) -> jax.Array:
  """L_{t−1} of L_vb [B], nats per position: KL(q(x_{t−1}|x_t,x_0) ‖ p_θ(x_{t−1}|x_t)).

  At t = 1 the posterior q(x_0 | x_1, x_0) is a point mass on x_0, so the same KL is the
  reconstruction term −log p_θ(x_0 | x_1).
  """
  log_q = q_posterior_logits(schedule, x0, x_t, t)
  return _mean_over_positions(_kl(log_q, p_logits(schedule, x_t, t, x0_logits)))


def x0_cross_entropy(x0, x0_logits) -> jax.Array:
  """−log p̃_θ(x_0 | x_t) [B], nats per position: the auxiliary term of eq. 5."""
  log_p0 = jax.nn.log_softmax(x0_logits, axis=-1)
  return -_mean_over_positions(jnp.take_along_axis(log_p0, x0[..., None], axis=-1)[..., 0])


def hybrid_loss(key, schedule: Schedule, logits_fn: LogitsFn, x0,
                hybrid_weight: float = DEFAULT_HYBRID_WEIGHT) -> jax.Array:
  """L_λ of eq. 5 per example [B]: t ~ U{1 … T}, x_t ~ q(x_t | x_0), and

    L_{t−1} + λ · (−log p̃_θ(x_0 | x_t)),

  the one-t estimate of both terms (T · E_t[L_{t−1}] + L_T = L_vb, and L_T has no parameters).
  """
  if isinstance(hybrid_weight, (int, float)) and hybrid_weight < 0:
    raise ValueError(f'hybrid_weight={hybrid_weight} must be non-negative.')
  t_key, noise_key = jax.random.split(key)
  t_B = jax.random.randint(t_key, x0.shape[:1], 1, schedule.num_steps + 1)
  x_t = q_sample(noise_key, schedule, x0, t_B)
  x0_logits = logits_fn(x_t, t_B)
  return (vb_term(schedule, x0, x_t, t_B, x0_logits)
          + hybrid_weight * x0_cross_entropy(x0, x0_logits))


def negative_elbo(key, schedule: Schedule, logits_fn: LogitsFn, x0) -> jax.Array:
  """L_vb = L_T + Σ_{t=1}^T L_{t−1} [B], nats per position, one x_t ~ q(x_t | x_0) per t
  (T network calls, in a scan): an upper bound on −log p_θ(x_0)."""

  def add_term(total_B, t):
    t_B = jnp.full(x0.shape[:1], t)
    x_t = q_sample(jax.random.fold_in(key, t), schedule, x0, t_B)
    return total_B + vb_term(schedule, x0, x_t, t_B, logits_fn(x_t, t_B)), None

  total_B, _ = jax.lax.scan(add_term, prior_kl(schedule, x0),
                            jnp.arange(1, schedule.num_steps + 1))
  return total_B


def sample(key, schedule: Schedule, logits_fn: LogitsFn, shape, trajectory: bool = False):
  """Ancestral sampling: x_T ~ p(x_T) = m, then x_{t−1} ~ p_θ(x_{t−1} | x_t) for t = T … 1
  (categorical draws, i.e. Gumbel-max, in a scan). Returns x_0 of `shape` [B, …] (int32), or
  with `trajectory` all of x_0 … x_T as [T + 1, B, …], indexed by t."""
  shape = tuple(shape)
  if not shape or not all(isinstance(n, (int, np.integer)) and n > 0 for n in shape):
    raise ValueError(f'shape={shape} must be a non-empty tuple of positive integers [B, …].')
  prior_key, steps_key = jax.random.split(key)
  x_T = jax.random.categorical(prior_key, jnp.log(stationary_probs(schedule)),
                               shape=shape).astype(jnp.int32)

  def denoise(x_t, t):
    t_B = jnp.full(shape[:1], t)
    logits = p_logits(schedule, x_t, t_B, logits_fn(x_t, t_B))
    x_prev = jax.random.categorical(jax.random.fold_in(steps_key, t), logits).astype(jnp.int32)
    return x_prev, x_prev

  x0, xs_from_T = jax.lax.scan(denoise, x_T, jnp.arange(schedule.num_steps, 0, -1))
  if trajectory:
    return jnp.concatenate([xs_from_T[::-1], x_T[None]])
  return x0


def _posterior_logits(schedule, log_p0, x_t, t_B):
  """log of [Q_t]_{j, x_t} · (x̃ Q̄_{t−1})_j normalised over j, for x̃ = exp(log_p0) [B, …, K]."""
  m_K = stationary_probs(schedule)
  ndim = log_p0.ndim
  x_t_onehot = jax.nn.one_hot(x_t, schedule.num_classes, dtype=m_K.dtype)
  beta = _at(schedule.betas, t_B, ndim)
  # The column x_t of Q_t, [Q_t]_{j, x_t} = (1 − β_t) δ_{j, x_t} + β_t m_{x_t}.
  log_transition = jnp.log((1 - beta) * x_t_onehot + beta * m_K[x_t][..., None])
  # x̃ Q̄_{t−1} = ᾱ_{t−1} x̃ + (1 − ᾱ_{t−1}) m, summed in log space: m and x̃ may hold zeros.
  log_marginal = _logaddexp(jnp.log(_at(schedule.alpha_bars, t_B - 1, ndim)) + log_p0,
                            jnp.log(_at(schedule.one_minus_alpha_bars, t_B - 1, ndim))
                            + jnp.log(m_K))
  return jax.nn.log_softmax(log_transition + log_marginal, axis=-1)


def _logaddexp(a, b):
  """log(eᵃ + eᵇ) whose gradient is 0, not NaN, where both are −∞."""
  both = (a == -jnp.inf) & (b == -jnp.inf)
  return jnp.where(both, -jnp.inf,
                   jnp.logaddexp(jnp.where(both, 0, a), jnp.where(both, 0, b)))


def _kl(log_q, log_p):
  """Σ_j q_j (log q_j − log p_j) over the last axis, with 0 · log 0 = 0."""
  q = jnp.exp(log_q)
  return jnp.sum(q * jnp.where(q > 0, log_q - log_p, 0), axis=-1)


def _mean_over_positions(x):
  return jnp.mean(x.reshape(x.shape[0], -1), axis=1)


def _at(values, t_B, ndim):
  """values[t] per example, shaped [B, 1, …, 1] (ndim axes) to broadcast against [B, …, K];
  NaN for a step outside 0 … T (a traced step cannot be checked before it is used)."""
  picked_B = values.at[t_B].get(mode='fill', fill_value=jnp.nan, wrap_negative_indices=False)
  return picked_B.reshape(t_B.shape + (1,) * (ndim - 1))
