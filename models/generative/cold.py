"""Cold diffusion (Bansal et al. 2022, "Cold Diffusion: Inverting Arbitrary Image Transforms
Without Noise").

A deterministic degradation D(x_0, t), t = 0 … T, with D(x_0, 0) = x_0, takes the place of
Gaussian noise; a restoration network R(x_t, t) ≈ x_0 is trained with the ℓ1 loss (§3)

  min_R E_{x_0, t} ‖R(D(x_0, t), t) − x_0‖₁.

Sampling starts from a degraded x_T and, for s = T … 1 with x̂_0 = R(x_s, s), steps

  Algorithm 1 (naive):     x_{s−1} = D(x̂_0, s − 1)
  Algorithm 2 (improved):  x_{s−1} = x_s − D(x̂_0, s) + D(x̂_0, s − 1).

With an exact R both give x_{s−1} = D(x_0, s − 1) at every step. Algorithm 2 tolerates an
imperfect R (§3): for a linear D(x, s) = A_s x and a restorer off by a fixed e
(x̂_0 = x_0 + e), started from x_T = A_T x_0, its steps telescope to
x_0 + e − A_T e, while Algorithm 1 returns x_0 + e; for the blur below A_T e = e when e is
constant. The samplers take their start x_T: D(x_0, T) to restore a known image; to generate
with the blur the paper starts from a fully blurred image, every pixel of a channel at that
channel's mean colour (means drawn from data, plus a little noise so that samples differ, §5).

Degradations of images x [B, H, W, C] at steps t (a scalar or one per example, [B]):
  blur (§4): a fixed Gaussian kernel G of standard deviation σ (radius ⌈3σ⌉, taps summing to
    1) applied t times, D(x_0, t) = Gᵗ x_0, as a separable depthwise convolution. Images are
    padded by mirroring about the edge with the edge pixel repeated ('symmetric'), which makes
    the step a symmetric, doubly stochastic matrix along each axis: each channel keeps its
    mean, a constant image stays constant, the variance falls with t and x_t tends to the
    channel means. In the interior Gᵗ is a Gaussian of variance tσ². Because the step is
    symmetric, Gᵗ = V diag(λᵗ) Vᵀ from its eigendecomposition, so D costs the same for any t.
  mask (§4, inpainting): pixels are hidden in a fixed random order, ⌈tN/T⌉ of the N pixels at
    step t, replaced by a constant: the masked fraction grows linearly in t and is 1 at t = T
    (a pixel-wise form of the paper's growing masks).
"""

import functools
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from models.generative import ddpm as ddpm_lib

RestoreFn = Callable[[jax.Array, jax.Array], jax.Array]  # (x_t, t [B]) → x̂_0
DegradeFn = Callable[[jax.Array, jax.Array], jax.Array]  # (x_0, t [B]) → D(x_0, t)


def gaussian_taps(sigma: float) -> np.ndarray:
  """g_k ∝ exp(−k²/(2σ²)) for k = −⌈3σ⌉ … ⌈3σ⌉, normalised to Σ_k g_k = 1 (float64)."""
  _check_sigma(sigma)
  radius = math.ceil(3 * sigma)
  offsets = np.arange(-radius, radius + 1)
  taps = np.exp(-offsets ** 2 / (2 * sigma ** 2))
  return taps / taps.sum()


def blur_step(x_BxHxWxC, sigma: float = 1.0) -> jax.Array:
  """G x: one Gaussian blur, a depthwise convolution with g along H and then along W,
  after 'symmetric' padding by the radius (the edge pixel repeated in the mirror image)."""
  _check_images(x_BxHxWxC)
  taps = gaussian_taps(sigma)
  radius, channels = len(taps) // 2, x_BxHxWxC.shape[-1]
  padded = jnp.pad(x_BxHxWxC, ((0, 0), (radius, radius), (radius, radius), (0, 0)),
                   mode='symmetric')
  taps_C = np.broadcast_to(taps[:, None], (len(taps), channels))
  for kernel_shape in ((len(taps), 1, 1, channels), (1, len(taps), 1, channels)):
    padded = jax.lax.conv_general_dilated(
        padded, jnp.asarray(taps_C.reshape(kernel_shape), x_BxHxWxC.dtype), (1, 1), 'VALID',
        dimension_numbers=('NHWC', 'HWIO', 'NHWC'), feature_group_count=channels,
        precision=jax.lax.Precision.HIGHEST)
  return padded


def blur(x0_BxHxWxC, t, *, sigma: float = 1.0) -> jax.Array:
  """D(x_0, t) = Gᵗ x_0, `blur_step` applied t times, for any t ≥ 0 at the cost of one step:
  along each axis Gᵗ = V diag(λᵗ) Vᵀ with G's eigenvalues λ and orthonormal eigenvectors V.
  D(x_0, 0) = x_0 exactly."""
  _check_images(x0_BxHxWxC)
  t_B = ddpm_lib.per_example_steps(t, x0_BxHxWxC, first=0)
  _, height, width, _ = x0_BxHxWxC.shape
  dtype = x0_BxHxWxC.dtype
  (lam_H, v_HxH), (lam_W, v_WxW) = _blur_eigen(height, sigma), _blur_eigen(width, sigma)
  v_HxH, v_WxW = jnp.asarray(v_HxH, dtype), jnp.asarray(v_WxW, dtype)
  highest = jax.lax.Precision.HIGHEST
  spectrum_BxHxWxC = jnp.einsum('hk,bhwc,wl->bklc', v_HxH, x0_BxHxWxC, v_WxW, precision=highest)
  decay_BxH = jnp.asarray(lam_H, dtype)[None] ** t_B[:, None]
  decay_BxW = jnp.asarray(lam_W, dtype)[None] ** t_B[:, None]
  spectrum_BxHxWxC = spectrum_BxHxWxC * decay_BxH[:, :, None, None] * decay_BxW[:, None, :, None]
  blurred = jnp.einsum('hk,bklc,wl->bhwc', v_HxH, spectrum_BxHxWxC, v_WxW, precision=highest)
  return jnp.where((t_B == 0)[:, None, None, None], x0_BxHxWxC, blurred)


@functools.lru_cache(maxsize=None)
def _blur_eigen(size: int, sigma: float):
  """λ [n] and V [n, n] (float64) with G = V diag(λ) Vᵀ for the 1-D step on n pixels:
  [G]_ij = Σ_k g_k [fold(i + k) = j], fold mirroring indices outside 0 … n−1 back inside
  (period 2n, so a kernel wider than the image still folds correctly)."""
  taps = gaussian_taps(sigma)
  radius = len(taps) // 2
  source_NxS = np.arange(size)[:, None] + np.arange(-radius, radius + 1)[None, :]
  source_NxS = np.mod(source_NxS, 2 * size)
  source_NxS = np.where(source_NxS >= size, 2 * size - 1 - source_NxS, source_NxS)
  step_NxN = np.zeros((size, size))
  np.add.at(step_NxN, (np.arange(size)[:, None], source_NxS), taps[None, :])
  return np.linalg.eigh(step_NxN)


def pixel_order(key, height: int, width: int) -> jax.Array:
  """A fixed random order of the pixels for `mask`: rank [H, W], a permutation of
  0 … HW − 1 (int32); pixel (i, j) is masked from the first t with rank·T < t·HW."""
  return jax.random.permutation(key, height * width).reshape(height, width).astype(jnp.int32)


def mask(x0_BxHxWxC, t, *, rank_HxW, num_steps: int, fill: float = 0.0) -> jax.Array:
  """D(x_0, t): x_0 with the pixels of rank r < tN/T set to `fill` (all channels), i.e. the
  ⌈tN/T⌉ first pixels of `rank_HxW` out of N = HW; nothing at t = 0, everything at t = T."""
  _check_images(x0_BxHxWxC)
  num_steps = _check_num_steps(num_steps)
  _, height, width, _ = x0_BxHxWxC.shape
  if tuple(rank_HxW.shape) != (height, width):
    raise ValueError(f'rank_HxW of shape {tuple(rank_HxW.shape)} must match the images\' '
                     f'[H, W] = [{height}, {width}].')
  t_B = ddpm_lib.per_example_steps(t, x0_BxHxWxC, first=0)
  # r < tN/T compared in integers: r·T < t·N.
  masked_BxHxW = rank_HxW[None] * num_steps < t_B[:, None, None] * (height * width)
  return jnp.where(masked_BxHxW[..., None], jnp.asarray(fill, x0_BxHxWxC.dtype), x0_BxHxWxC)


def restoration_loss(restore_fn: RestoreFn, degrade_fn: DegradeFn, x0, t) -> jax.Array:
  """‖R(D(x_0, t), t) − x_0‖₁ per example [B], averaged over its entries (§3)."""
  t_B = ddpm_lib.per_example_steps(t, x0, first=0)
  x0_hat = restore_fn(degrade_fn(x0, t_B), t_B)
  return jnp.mean(jnp.abs(x0_hat - x0).reshape(x0.shape[0], -1), axis=1)


def naive_sample(restore_fn: RestoreFn, degrade_fn: DegradeFn, x_T, num_steps: int,
                 trajectory: bool = False):
  """Algorithm 1: x_{s−1} = D(R(x_s, s), s − 1) for s = T … 1, from the given x_T [B, …].
  Returns x_0, or with `trajectory` all of x_0 … x_T as [T + 1, B, …], indexed by t."""
  return _sample(lambda x_s, x0_hat, s_B: degrade_fn(x0_hat, s_B - 1), restore_fn, x_T,
                 num_steps, trajectory)


def improved_sample(restore_fn: RestoreFn, degrade_fn: DegradeFn, x_T, num_steps: int,
                    trajectory: bool = False):
  """Algorithm 2: x_{s−1} = x_s − D(x̂_0, s) + D(x̂_0, s − 1), x̂_0 = R(x_s, s), for
  s = T … 1 from the given x_T [B, …]. Returns x_0, or with `trajectory` all of x_0 … x_T as
  [T + 1, B, …], indexed by t."""
  return _sample(
      lambda x_s, x0_hat, s_B: x_s - degrade_fn(x0_hat, s_B) + degrade_fn(x0_hat, s_B - 1),
      restore_fn, x_T, num_steps, trajectory)


def _sample(update, restore_fn, x_T, num_steps, trajectory):
  num_steps = _check_num_steps(num_steps)

  def step(x_s, s):
    s_B = jnp.full(x_T.shape[:1], s, jnp.int32)
    x_prev = update(x_s, restore_fn(x_s, s_B), s_B)
    return x_prev, x_prev

  x0, xs_from_T = jax.lax.scan(step, x_T, jnp.arange(num_steps, 0, -1))
  if trajectory:
    return jnp.concatenate([xs_from_T[::-1], x_T[None]])
  return x0


def _check_images(x):
  if x.ndim != 4:
    raise ValueError(f'Images of shape {tuple(x.shape)} must be [B, H, W, C].')


def _check_sigma(sigma):
  if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma > 0:
    raise ValueError(f'sigma={sigma!r} must be a positive number (the blur\'s standard '
                     'deviation in pixels).')


def _check_num_steps(num_steps) -> int:
  """`num_steps` as an int: any positive integer (a NumPy one too), not a bool."""
  if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1:
    raise ValueError(f'num_steps={num_steps!r} must be a positive integer.')
  return int(num_steps)
