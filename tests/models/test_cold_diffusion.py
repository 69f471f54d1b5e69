"""Cold diffusion (Bansal et al. 2022): the blur against a 2-D convolution written out in float64
numpy and against its one-step convolution applied t times, its conservation properties, the
mask by brute-force counting, and Algorithms 1 and 2 with exact and offset restorers, whose
final images are known in closed form."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.generative import cold

B, H, W, C = 3, 6, 8, 2
T = 12


def key(seed):
  # RngBitGenerator keys: on the CPU, XLA compiles threefry's random bits in ~1 s per program,
  # these in ~0.2 s.
  return jax.random.key(seed, impl='rbg')


def images(seed, shape=(B, H, W, C)):
  return np.random.default_rng(seed).uniform(0.1, 1.0, shape).astype(np.float32)


def reference_blur_step(x_BxHxWxC, sigma):
  """float64: Σ_{a,b} g_a g_b x̃[i + a, j + b] over the full 2-D kernel, x̃ padded by numpy's
  'symmetric' mode."""
  x = np.asarray(x_BxHxWxC, np.float64)
  radius = int(np.ceil(3 * sigma))
  offsets = np.arange(-radius, radius + 1)
  g = np.exp(-offsets ** 2 / (2 * sigma ** 2))
  kernel = np.outer(g, g) / np.outer(g, g).sum()
  padded = np.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode='symmetric')
  out = np.zeros_like(x)
  for a in range(2 * radius + 1):
    for b in range(2 * radius + 1):
      out += kernel[a, b] * padded[:, a:a + x.shape[1], b:b + x.shape[2]]
  return out


# Radius 3; ⌈3.3⌉ = 4 (not round(3.3) = 3); and radius 8 > H: folded twice.
@pytest.mark.parametrize('sigma', [1.0, 1.1, 2.5])
def test_blur_step_is_a_normalised_gaussian_convolution(sigma):
  taps = cold.gaussian_taps(sigma)
  assert len(taps) == 2 * int(np.ceil(3 * sigma)) + 1
  np.testing.assert_allclose(taps.sum(), 1.0, rtol=1e-15)
  offsets = np.arange(len(taps)) - len(taps) // 2
  np.testing.assert_allclose(taps / taps[len(taps) // 2], np.exp(-offsets ** 2 / (2 * sigma ** 2)),
                             rtol=1e-14)
  x = images(0)
  # float32 sums of ≤ 17 + 17 terms; measured ≤ 1.4e−7.
  np.testing.assert_allclose(jax.jit(cold.blur_step, static_argnums=1)(x, sigma),
                             reference_blur_step(x, sigma), rtol=0, atol=1e-6)
  if sigma == 1.0:  # the default σ
    np.testing.assert_allclose(jax.jit(cold.blur_step)(x), reference_blur_step(x, sigma), rtol=0,
                               atol=1e-6)


def test_blur_is_the_step_applied_t_times():
  x = images(1)
  t_B = np.array([0, 1, 5])
  blurred = jax.jit(cold.blur)(x, t_B)
  np.testing.assert_array_equal(blurred[0], x[0])  # D(x_0, 0) = x_0 exactly
  stepped = x
  for t in range(1, t_B.max() + 1):
    stepped = reference_blur_step(stepped, 1.0)
    for b in np.flatnonzero(t_B == t):
      # float32 eigenvectors of the 6×6 and 8×8 steps; measured ≤ 9.9e−8.
      np.testing.assert_allclose(blurred[b], stepped[b], rtol=0, atol=1e-6, err_msg=f't={t}')


def test_blur_keeps_channel_means_and_loses_variance():
  x = images(2)
  steps = np.array([0, 1, 2, 4, 8, 16, 32, 2000])
  blurred = np.asarray(jax.jit(jax.vmap(cold.blur, in_axes=(None, 0)))(x, steps), np.float64)
  means = blurred.mean(axis=(2, 3))
  # The step is doubly stochastic, so the channel means stay; measured ≤ 6.6e−8.
  np.testing.assert_allclose(means, np.broadcast_to(means[0], means.shape), rtol=0, atol=1e-6)
  variances = blurred.var(axis=(2, 3))
  assert np.all(np.diff(variances, axis=0) < 0), variances[:, 0, 0]
  # After 2000 steps only the mean remains (slowest mode 0.93^2000); measured 0.0.
  np.testing.assert_array_less(variances[-1], 1e-10)
  # A constant image is a fixed point (taps sum to 1 and the padding repeats it); measured
  # 4.8e−8.
  constant = jax.jit(cold.blur)(np.full((1, H, W, 1), 0.7, np.float32), 3)
  np.testing.assert_allclose(constant, 0.7, rtol=1e-6)


@pytest.mark.parametrize('num_steps', [T, 5])  # T divides N = 48, and T = 5 does not
def test_mask_hides_a_linearly_growing_set_of_pixels(num_steps):
  x = images(3)
  rank_HxW = np.asarray(cold.pixel_order(key(0), H, W))
  np.testing.assert_array_equal(np.sort(rank_HxW.ravel()), np.arange(H * W))
  degrade = jax.jit(functools.partial(cold.mask, rank_HxW=rank_HxW, num_steps=num_steps,
                                      fill=-1.0))
  previous = np.zeros((B, H, W), bool)
  for t in range(num_steps + 1):
    out = np.asarray(degrade(x, t))
    masked = out == -1.0  # data lie in [0.1, 1)
    assert (masked == masked[:, :, :, :1]).all()  # every channel of a pixel together
    masked = masked[..., 0]
    # Brute count: ⌈tN/T⌉ pixels, 4t when T = 12 divides N = 48.
    np.testing.assert_array_equal(masked.sum(axis=(1, 2)), -(-t * H * W // num_steps))
    assert (masked >= previous).all()  # masked pixels stay masked
    np.testing.assert_array_equal(out[~masked], x[~masked])
    previous = masked
  assert previous.all()  # t = T: everything is the fill


def degradations():
  rank_HxW = cold.pixel_order(key(1), H, W)
  return {'blur': cold.blur,
          'mask': functools.partial(cold.mask, rank_HxW=rank_HxW, num_steps=T, fill=0.5)}


@pytest.mark.parametrize('name', ['blur', 'mask'])
def test_exact_restorer_follows_the_degradation_at_every_step(name):
  # With R(x_t, t) = x_0 both algorithms give x_{t−1} = D(x_0, t − 1) from x_T = D(x_0, T).
  degrade = degradations()[name]
  x0 = images(4)
  restore = lambda x_t, t: jnp.asarray(x0)

  def run(x0):
    expected = jnp.stack([degrade(x0, t) for t in range(T + 1)])
    x_T = degrade(x0, T)
    return (expected, cold.naive_sample(restore, degrade, x_T, T, trajectory=True),
            cold.improved_sample(restore, degrade, x_T, T, trajectory=True),
            cold.improved_sample(restore, degrade, x_T, T))

  expected, naive, improved, improved_x0 = jax.jit(run)(x0)
  assert naive.shape == improved.shape == (T + 1, B, H, W, C)
  # The mask only copies values, so the trajectories are exact; the blur's λᵗ is rounded
  # differently for a traced and a constant t: measured ≤ 2.4e−7.
  tolerance = dict(rtol=0, atol=1e-6 if name == 'blur' else 0)
  np.testing.assert_allclose(naive, expected, **tolerance)
  np.testing.assert_allclose(improved, expected, **tolerance)
  np.testing.assert_array_equal(naive[0], x0)  # D(·, 0) is the identity
  np.testing.assert_allclose(improved_x0, x0, **tolerance)


def test_improved_sampling_cancels_a_constant_restoration_error():
  # R(x_t, t) = x_0 + e. Algorithm 1 returns x_0 + e. Algorithm 2 telescopes, for a linear D
  # and x_T = D(x_0, T), to x_0 + e − D(e, T); the blur keeps a constant image, so a constant
  # e cancels exactly. A random e leaves e − D(e, T), smaller than e: D(·, T) = V diag(λᵀ) Vᵀ
  # with 0 ≤ λᵀ ≤ 1 keeps e's mean, which then cancels.
  degrade = cold.blur
  x0 = images(5)
  e_constant = np.full_like(x0, 0.2)
  e_random = np.random.default_rng(6).normal(0, 0.2, x0.shape).astype(np.float32)

  def run(x0, e):
    restore = lambda x_t, t: x0 + e
    x_T = degrade(x0, T)
    return (cold.naive_sample(restore, degrade, x_T, T),
            cold.improved_sample(restore, degrade, x_T, T), degrade(e, T))

  run = jax.jit(run)
  naive, improved, _ = run(x0, e_constant)
  # float32 rounding only; measured 4.8e−8 and 2.5e−7.
  np.testing.assert_allclose(naive - x0, 0.2, rtol=0, atol=1e-6)
  np.testing.assert_allclose(improved, x0, rtol=0, atol=2e-6)
  naive, improved, blurred_e = run(x0, e_random)
  np.testing.assert_allclose(naive, x0 + e_random, rtol=0, atol=1e-6)  # measured 0.0
  # measured 2.1e−7.
  np.testing.assert_allclose(improved, x0 + e_random - blurred_e, rtol=0, atol=2e-6)
  # White noise is mostly fine detail, which 12 blur steps remove: measured ratio 0.97.
  assert np.linalg.norm(improved - x0) < np.linalg.norm(naive - x0)


def test_restoration_loss_is_the_mean_absolute_error():
  x0 = images(7)
  rank_HxW = np.asarray(cold.pixel_order(key(2), H, W))
  degrade = functools.partial(cold.mask, rank_HxW=rank_HxW, num_steps=T, fill=0.0)
  t_B = np.array([0, 5, T])
  # R = identity: the loss is the masked pixels' |0 − x_0| summed over ⌈tN/T⌉ pixels / HWC.
  loss = jax.jit(lambda x0, t: cold.restoration_loss(lambda x_t, t: x_t, degrade, x0, t))(x0, t_B)
  expected = [np.abs(x0[b][rank_HxW * T < t_B[b] * H * W]).sum() / (H * W * C) for b in range(B)]
  # float32 means of 96 entries; measured 6.0e−8.
  np.testing.assert_allclose(loss, expected, rtol=1e-6, atol=1e-7)
  perfect = cold.restoration_loss(lambda x_t, t: jnp.asarray(x0), degrade, x0, t_B)
  np.testing.assert_array_equal(perfect, 0.0)
  # R(x_t, t) = x_t + 0.01 t must see the t it degraded with: |D(x_0, t) + 0.01 t − x_0|.
  shifted = cold.restoration_loss(lambda x_t, t: x_t + 0.01 * t[:, None, None, None], degrade,
                                  x0, t_B)
  masked_x0 = np.where((rank_HxW * T < t_B[:, None, None] * H * W)[..., None], 0.0, x0)
  expected = np.abs(masked_x0 + 0.01 * t_B[:, None, None, None] - x0).mean(axis=(1, 2, 3))
  np.testing.assert_allclose(shifted, expected, rtol=1e-6, atol=1e-7)


def test_bad_arguments_raise():
  x = jnp.zeros((2, 4, 4, 1))
  rank = jnp.arange(16).reshape(4, 4)
  cases = [(lambda: cold.blur(x, 1, sigma=0.0), 'sigma=0.0'),
           (lambda: cold.blur_step(jnp.zeros((4, 4, 1))), r'Images of shape \(4, 4, 1\)'),
           (lambda: cold.blur(x, jnp.ones(3, int)), r't of shape \(3,\)'),
           (lambda: cold.mask(x, 1, rank_HxW=rank[:3], num_steps=4), r'rank_HxW of shape \(3, 4\)'),
           (lambda: cold.mask(x, 1, rank_HxW=rank, num_steps=0), 'num_steps=0'),
           (lambda: cold.naive_sample(None, None, x, 2.5), 'num_steps=2.5'),
           # A negative or fractional step was cast to an integer and used.
           (lambda: cold.blur(x, -1), r'Steps t=-1 must be integers of at least 0\.'),
           (lambda: cold.mask(x, 0.5, rank_HxW=rank, num_steps=4),
            r'Steps t=0.5 must be integers of at least 0\.')]
  for make, message in cases:
    with pytest.raises(ValueError, match=message):
      make()


@pytest.mark.parametrize('kind', [np.int64, bool, float])
def test_step_counts_may_be_numpy_integers_but_not_bools_or_floats(kind):
  # A NumPy integer (np.arange's, a config's) was refused as "must be a positive integer".
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 4, 1)), jnp.float32)
  rank = jnp.arange(16).reshape(4, 4)
  degrade = lambda x, t_B: cold.mask(x, t_B, rank_HxW=rank, num_steps=4)
  restore = lambda x_s, s_B: 0.5 * x_s
  for call in [lambda n: cold.mask(x, 2, rank_HxW=rank, num_steps=n),
               lambda n: cold.naive_sample(restore, degrade, x, n, trajectory=True),
               lambda n: cold.improved_sample(restore, degrade, x, n, trajectory=True)]:
    if kind is np.int64:
      np.testing.assert_array_equal(call(kind(4)), call(4))
    else:
      with pytest.raises(ValueError, match=rf'^num_steps={kind(4)!r} must be a positive integer'):
        call(kind(4))


def test_pixel_order_is_a_random_permutation_fixed_by_its_key():
  # A raster order would mask the image from its top row down, not at random places.
  orders = [np.asarray(cold.pixel_order(key(seed), H, W)).ravel() for seed in (0, 0, 1)]
  np.testing.assert_array_equal(orders[0], orders[1])
  assert not np.array_equal(orders[0], orders[2])
  for order in orders:
    np.testing.assert_array_equal(np.sort(order), np.arange(H * W))
    # The first half of the pixels to be masked lie in both halves of the rows; a raster
    # order puts them all in the top half (chance for a random order: about 2 · C(24, 24)/C(48, 24)).
    rows = np.nonzero(order.reshape(H, W) < H * W // 2)[0]
    assert rows.min() < H // 2 <= rows.max()


@pytest.mark.parametrize('name', ['blur', 'mask'])
def test_naive_sampler_calls_the_restorer_with_the_step_it_restores(name):
  # R(x_s, s) = x_0 + 0.1 s, a restorer that depends on s: Algorithm 1 steps to
  # x_{s−1} = D(x_0 + 0.1 s, s − 1) and ends at R(x_1, 1) = x_0 + 0.1. A sampler that called R
  # with s − 1 passed the tests above, whose restorers ignore t.
  degrade = degradations()[name]
  x0 = images(8)
  restore = lambda x_t, t: jnp.asarray(x0) + 0.1 * t[:, None, None, None].astype(jnp.float32)

  def run(x0):
    expected = jnp.stack([degrade(x0 + 0.1 * (s + 1), s) for s in range(T)])
    return expected, cold.naive_sample(restore, degrade, degrade(x0, T), T, trajectory=True)

  expected, naive = jax.jit(run)(x0)
  np.testing.assert_allclose(naive[:T], expected, rtol=0, atol=1e-6)
  np.testing.assert_allclose(naive[0], x0 + 0.1, rtol=0, atol=1e-6)


def test_mask_fills_with_zero_by_default():
  # The documented default fill is 0: every pixel is 0 at t = T, none at t = 0.
  rank_HxW = cold.pixel_order(key(3), H, W)
  x = images(9)
  masked = cold.mask(x, np.array([0, T, T]), rank_HxW=rank_HxW, num_steps=T)
  np.testing.assert_array_equal(masked[0], x[0])
  np.testing.assert_array_equal(masked[1:], 0.0)
