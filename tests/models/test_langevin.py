"""Langevin dynamics (Roberts & Tweedie 1996; Song & Ermon 2019) with the exact scores of
Gaussian mixtures, the mixtures of `data/toy2d.py` themselves, and the two-sample test.
References: scipy's float64 Gaussian densities and finite differences of them, the
mixtures' analytic moments (Monte-Carlo tolerances of 4 standard errors, seeds fixed),
brute-force loops for the two-sample statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from data import toy2d
from models.generative import langevin

# Overlapping components with unequal weights: a chain must cross between them.
MIXTURE = toy2d.gaussian_mixture(
    [0.5, 0.3, 0.2], [[-1.0, 0.0], [1.0, 0.5], [0.0, -1.2]],
    [[[0.5, 0.2], [0.2, 0.4]], [[0.3, -0.1], [-0.1, 0.6]], [[0.4, 0.0], [0.0, 0.3]]])
# Separated modes with unequal weights: only annealing finds the weights.
RING = toy2d.ring(8, radius=2.0, std=0.25, weights=np.arange(1, 9))

# Mixtures are pytrees: passed as arguments, mixtures of the same shapes share one program.
log_prob_and_score = jax.jit(lambda mixture, x, sigma: (mixture.log_prob(x, sigma),
                                                        mixture.score(x, sigma)))
sample = jax.jit(lambda mixture, key, n: mixture.sample(key, n), static_argnums=2)
moments = jax.jit(lambda mixture: (mixture.mean(), mixture.covariance()))


def scipy_log_prob(mixture, x, sigma=0.0):
  """float64 log Σ_k w_k N(x; μ_k, Σ_k + σ² I) with scipy's Gaussian densities."""
  weights, means, covariances = (np.asarray(a, np.float64) for a in mixture)
  densities = [w * stats.multivariate_normal(mu, cov + sigma**2 * np.eye(len(mu))).pdf(x)
               for w, mu, cov in zip(weights, means, covariances)]
  return np.log(np.sum(densities, axis=0))


def check_moments(samples, mean, covariance, what):
  """Means within 4 SE (√(Σ_dd/n)); covariance entries within 4 SE, the SE of a mean of
  products (x_d − x̄_d)(x_e − x̄_e) estimated from the samples. Returns the largest |z|'s."""
  samples = np.asarray(samples, np.float64)
  n = samples.shape[0]
  mean, covariance = np.asarray(mean, np.float64), np.asarray(covariance, np.float64)
  z_mean = (samples.mean(0) - mean) / np.sqrt(np.diag(covariance) / n)
  centred = samples - samples.mean(0)
  products = centred[:, :, None] * centred[:, None, :]
  z_cov = (products.mean(0) - covariance) / (products.std(0) / np.sqrt(n))
  assert (np.abs(z_mean) < 4).all(), (what, z_mean)
  assert (np.abs(z_cov) < 4).all(), (what, z_cov)
  return np.abs(z_mean).max(), np.abs(z_cov).max()


@pytest.mark.parametrize('sigma', [0.0, 0.3])
def test_mixture_log_prob_and_score_match_scipy_and_its_finite_differences(sigma):
  x = np.random.default_rng(0).normal(size=(16, 2)) * 1.5
  for mixture in (MIXTURE, RING):
    log_p, score = log_prob_and_score(mixture, jnp.asarray(x, jnp.float32), sigma)
    # float32 against float64: measured ≤ 1.9e-6 (log p).
    np.testing.assert_allclose(log_p, scipy_log_prob(mixture, x, sigma), rtol=1e-5, atol=1e-5)
    # Central differences of the float64 density, h = 1e-5 (error ~1e-9): measured ≤ 4.8e-6.
    h = 1e-5
    differences = np.stack([
        (scipy_log_prob(mixture, x + h * e, sigma) - scipy_log_prob(mixture, x - h * e, sigma))
        / (2 * h) for e in np.eye(2)], axis=-1)
    np.testing.assert_allclose(score, differences, rtol=1e-4, atol=1e-5)


def test_mixture_samples_have_the_analytic_moments():
  n = 20_000
  for seed, mixture in enumerate((MIXTURE, RING, RING.smoothed(0.5))):
    # Measured max |z| ≤ 2.2.
    check_moments(sample(mixture, jax.random.PRNGKey(seed), n), *moments(mixture), seed)
  # The smoothed ring is the ring plus N(0, σ² I).
  np.testing.assert_allclose(moments(RING.smoothed(0.5))[1], moments(RING)[1] + 0.25 * np.eye(2),
                             rtol=1e-6)


def test_dataset_is_fixed_by_its_seed():
  first, again, other = (toy2d.dataset('grid', 300, 300, seed=s) for s in (3, 3, 4))
  assert first['train'].shape == (300, 2) and first['test'].shape == (300, 2)
  assert first['train'].dtype == np.float32
  np.testing.assert_array_equal(first['train'], again['train'])
  np.testing.assert_array_equal(first['test'], again['test'])
  assert not np.allclose(first['train'], first['test'])
  assert not np.allclose(first['train'], other['train'])
  # Every grid point has its points: nine clusters 2 apart, std 0.2.
  nearest = np.round(first['train'] / 2.0)
  assert len({tuple(p) for p in nearest}) == 9 and np.abs(nearest).max() == 1


def test_langevin_with_the_exact_score_samples_the_mixture():
  chains = 2048
  # Started away from the data, at N((2, 2), 0.25 I); η = 0.02 for 1,000 steps (time 10).
  x0 = jnp.array([2.0, 2.0]) + 0.5 * jax.random.normal(jax.random.PRNGKey(1), (chains, 2))

  @jax.jit
  def run(x0, key):
    samples = langevin.langevin_sample(MIXTURE.score, x0, jax.random.fold_in(key, 0), 0.02, 1000)
    # The two-sample test against exact mixture samples, and against them shifted by 0.5.
    exact = MIXTURE.sample(jax.random.fold_in(key, 1), 500)
    tests = [langevin.two_sample_test(samples[:500], y, jax.random.fold_in(key, 2), 200)[1]
             for y in (exact, exact + jnp.array([0.5, 0.0]))]
    return samples, tests

  samples, (p_same, p_shifted) = run(x0, jax.random.PRNGKey(2))
  # ULA's own bias at η = 0.02 is ~1 % of the covariance (measured on 16,384 chains, SE
  # 1.1 %); here measured max |z| ≤ 1.2 (means) and ≤ 0.9 (covariances).
  check_moments(samples, *moments(MIXTURE), 'langevin')
  # Measured p = 0.68 and the smallest possible, 1/201.
  assert p_same > 0.01, p_same
  assert p_shifted <= 0.01, p_shifted


def test_annealed_langevin_finds_the_weights_of_separated_modes():
  chains, sigma_min = 2048, 0.1
  sigmas = langevin.geometric_sigmas(4.0, sigma_min, 10)
  x0 = jax.random.uniform(jax.random.PRNGKey(5), (chains, 2), minval=-4, maxval=4)
  smoothed_score = lambda x, sigma_B: RING.score(x, sigma_B[0])
  annealed, plain = jax.jit(lambda x0, key: (
      langevin.annealed_langevin_sample(smoothed_score, x0, key, sigmas, 2e-3, 100),
      langevin.langevin_sample(lambda x: RING.score(x, sigma_min), x0, key, 2e-3, 1000)))(
          x0, jax.random.PRNGKey(6))
  # The last level samples the ring smoothed by σ_L = 0.1, a mixture with covariances
  # (0.25² + 0.1²) I; measured max |z| ≤ 2.0 (means) and ≤ 2.3 (covariances).
  target = RING.smoothed(sigma_min)
  target_mean, target_covariance = moments(target)
  check_moments(annealed, target_mean, target_covariance, 'annealed')
  # Plain Langevin at σ_L with as many steps keeps the modes it started in: its mean is off
  # by more than 4 SE (measured 5.5 and 15 SE).
  z = (np.asarray(plain).mean(0) - target_mean) / np.sqrt(np.diag(target_covariance) / chains)
  assert np.abs(z).max() > 4, z


def test_two_sample_statistics_equal_their_double_sums():
  rng = np.random.default_rng(7)
  x, y = rng.normal(size=(7, 2)), rng.normal(size=(5, 2)) + 0.3
  distance = lambda a, b: np.linalg.norm(a - b)
  gaussian = lambda a, b: np.exp(-np.sum((a - b)**2) / (2 * 0.7**2))
  values = jax.jit(lambda x, y: [langevin.two_sample_statistic(x, y, statistic, bandwidth=0.7)
                                 for statistic in langevin.STATISTICS])(
                                     jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  for value, kernel, sign in zip(values, (distance, gaussian), (-1, 1)):
    mean_kernel = lambda a, b: np.mean([[kernel(u, v) for v in b] for u in a])
    expected = sign * (mean_kernel(x, x) + mean_kernel(y, y) - 2 * mean_kernel(x, y))
    # float32 sums of ≤ 144 terms: measured ≤ 2.8e-7.
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
  # The energy distance, 2 E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖, is positive for different data.
  assert values[0] > 0


def test_geometric_sigmas_have_a_constant_ratio():
  sigmas = np.asarray(langevin.geometric_sigmas(4.0, 0.1, 10), np.float64)
  np.testing.assert_allclose(sigmas[[0, -1]], [4.0, 0.1], rtol=1e-6)
  np.testing.assert_allclose(sigmas[1:] / sigmas[:-1], (0.1 / 4.0)**(1 / 9), rtol=1e-5)


def test_bad_arguments_raise():
  x = jnp.zeros((3, 2))
  key = jax.random.PRNGKey(0)
  for call, message in [
      (lambda: langevin.langevin_sample(MIXTURE.score, x, key, 0.0, 10), 'step_size=0.0'),
      (lambda: langevin.langevin_sample(MIXTURE.score, x, key, 0.1, 0), 'num_steps=0'),
      (lambda: langevin.geometric_sigmas(0.1, 1.0, 5), 'sigma_max=0.1'),
      (lambda: langevin.annealed_langevin_sample(RING.score, x, key, [1.0], -1.0, 5),
       'epsilon=-1.0'),
      (lambda: langevin.two_sample_test(x, jnp.zeros((3, 3)), key),
       r'shapes \(3, 2\) and \(3, 3\)'),
      (lambda: langevin.two_sample_test(x, x, key, statistic='ks'), "statistic='ks'"),
      (lambda: langevin.two_sample_test(x, x, key, num_permutations=0), 'num_permutations=0'),
      (lambda: toy2d.gaussian_mixture([1.0, -1.0], [[0, 0], [1, 1]], np.tile(np.eye(2), (2, 1, 1))),
       'positive numbers'),
      (lambda: toy2d.gaussian_mixture([1.0], [[0, 0]], [[[1.0, 2.0], [2.0, 1.0]]]),
       'positive definite'),
      (lambda: toy2d.dataset('moons'), "'moons'")]:
    with pytest.raises(ValueError, match=message):
      call()


@pytest.mark.parametrize('kind', [np.int64, bool, float])
def test_counts_may_be_numpy_integers_but_not_bools_or_floats(kind):
  # A NumPy integer (np.arange's, a config's) was refused as "must be a positive integer";
  # True passed as 1.
  key = jax.random.PRNGKey(0)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 2)), jnp.float32)
  score = lambda x: -x
  for call, n, name in [
      (lambda n: langevin.langevin_sample(score, x, key, 0.1, n), 5, 'num_steps'),
      (lambda n: langevin.geometric_sigmas(1.0, 0.1, n), 5, 'num_levels'),
      (lambda n: langevin.annealed_langevin_sample(lambda x, s: -x, x, key, [1.0, 0.5], 0.1, n),
       3, 'steps_per_level'),
      (lambda n: langevin.two_sample_test(x, x + 1, key, num_permutations=n), 10,
       'num_permutations')]:
    if kind is np.int64:
      jax.tree.map(np.testing.assert_array_equal, call(kind(n)), call(n))
    else:
      with pytest.raises(ValueError, match=rf'^{name}={kind(n)!r} must be a positive integer\.$'):
        call(kind(n))


@pytest.mark.parametrize('statistic', ['energy', 'mmd'])
def test_permutation_p_value_counts_the_observed_labelling(statistic):
  # Two samples of 20 points 10 apart: of the C(40, 20) labellings only the observed one and
  # its swap reach the observed statistic, so none of 19 random permutations does (probability
  # about 19 · 2 / 1.4e11) and p = (1 + 0)/(1 + 19) = 0.05 (Phipson & Smyth 2010), never 0.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(20, 2)), jnp.float32)
  y = x + 10.0
  _, p_value = langevin.two_sample_test(x, y, jax.random.PRNGKey(0), 19, statistic=statistic)
  np.testing.assert_allclose(p_value, 0.05, rtol=1e-6)


@pytest.mark.parametrize('statistic', ['energy', 'mmd'])
def test_permutations_that_tie_the_observed_statistic_count_toward_p(statistic):
  # Every point equal: every labelling gives D = 0 exactly, so each of the 19 permutations
  # reaches the observed D and p = (1 + 19)/(1 + 19) = 1. Counting only D_π > D gave
  # p = 1/20, rejecting identical samples.
  x = jnp.full((6, 2), 0.3, jnp.float32)
  statistic_value, p_value = langevin.two_sample_test(x, x[:4], jax.random.PRNGKey(0), 19,
                                                      statistic=statistic)
  assert statistic_value == 0.0
  np.testing.assert_allclose(p_value, 1.0, rtol=1e-6)


def test_langevin_sample_takes_its_documented_steps():
  # num_steps of x ← x + (η/2) s(x) + √η z_i, z_i from fold_in(key, i), written out in float64.
  # The moment tests run 1,000 steps, where one step fewer goes unnoticed.
  key, eta = jax.random.PRNGKey(3), 0.1
  score = lambda x: -0.5 * x + 0.3
  x = np.random.default_rng(4).normal(size=(5, 2))
  out = langevin.langevin_sample(score, jnp.asarray(x, jnp.float32), key, eta, 3)
  for i in range(3):
    x = x + 0.5 * eta * score(x) + np.sqrt(eta) * np.asarray(
        jax.random.normal(jax.random.fold_in(key, i), x.shape), np.float64)
  np.testing.assert_allclose(out, x, rtol=1e-5, atol=1e-6)


def test_annealed_langevin_steps_have_the_documented_sizes_and_independent_noise():
  # A score c/σ that ignores x: after T steps at each level x = x_0 + Σ_i T (α_i/2) c/σ_i
  # + Σ_ij √α_i z_ij, so the mean moves by T Σ_i α_i c/(2σ_i) and the variance grows by
  # T Σ_i α_i, α_i = ε σ_i²/σ_L². Taking T − 1 steps, α_i without the square, the score at
  # σ_L on every level, or one noise draw for several steps or levels each moves one or the
  # other by 10 SE or more.
  chains, sigmas, eps, steps, c = 4096, np.array([2.0, 1.0]), 0.01, 3, 2.0
  x = jax.jit(lambda key: langevin.annealed_langevin_sample(
      lambda x, sigma_B: jnp.broadcast_to(c / sigma_B[:, None], x.shape), jnp.zeros((chains, 2)),
      key, sigmas, eps, steps))(jax.random.PRNGKey(7))
  alphas = eps * sigmas**2 / sigmas[-1]**2
  mean, variance = steps * np.sum(alphas * c / (2 * sigmas)), steps * np.sum(alphas)
  x = np.asarray(x, np.float64)
  # 4 SE: of the means √(v/n), of the pooled variance v √(2/(2n)); measured ≤ 1.1 and 1.4 SE.
  assert np.all(np.abs(x.mean(0) - mean) < 4 * np.sqrt(variance / chains)), x.mean(0)
  assert abs(x.var(0).mean() / variance - 1) < 4 * np.sqrt(1 / chains), x.var(0)
