"""DDPM (Ho et al. 2020) against references written out here: the closed form q(x_t | x_0)
against composing the one-step kernels (a float64 mean/variance recursion and a Monte-Carlo
chain), the posterior against Bayes' rule for Gaussians, and the samplers with the exact
noise prediction of Gaussian data x_0 ~ N(m, s²I), for which

  E[ε | x_t] = √(1 − ᾱ_t) (x_t − √ᾱ_t m) / (ᾱ_t s² + 1 − ᾱ_t).

Monte-Carlo tolerances are 4 standard errors (seeds fixed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.generative import ddpm

T = 1000
SCHEDULE = ddpm.linear_schedule(T)
BETAS = np.linspace(1e-4, 0.02, T)  # float64, Ho et al. 2020 §4
ALPHA_BARS = np.cumprod(1 - BETAS)
# x_0 ~ N(M, S²) with a [2, 2] trailing shape, so images' broadcasting is exercised.
M_2x2 = np.array([[1.0, -0.5], [0.0, 2.0]], np.float32)
S = 0.8


def exact_eps(x_t, t_B):
  """E[ε | x_t] for x_0 ~ N(M, S²I): the regression of ε on x_t, from the float64 table."""
  alpha_bar = jnp.asarray(ALPHA_BARS, jnp.float32)[t_B - 1][:, None, None]
  return (jnp.sqrt(1 - alpha_bar) * (x_t - jnp.sqrt(alpha_bar) * M_2x2)
          / (alpha_bar * S**2 + 1 - alpha_bar))


def composed_kernels(betas):
  """Mean coefficient and variance of x_t | x_0 after composing N(√α_t x_{t−1}, β_t)."""
  mean_coefs, variances, mean_coef, variance = [], [], 1.0, 0.0
  for beta in np.asarray(betas, np.float64):
    mean_coef, variance = np.sqrt(1 - beta) * mean_coef, (1 - beta) * variance + beta
    mean_coefs.append(mean_coef)
    variances.append(variance)
  return np.array(mean_coefs), np.array(variances)


def test_closed_form_equals_the_composed_one_step_kernels():
  mean_coefs, variances = composed_kernels(BETAS)
  # float32 storage of values computed in float64: measured ≤ 5.7e-8 relative.
  np.testing.assert_allclose(np.sqrt(SCHEDULE.alpha_bars_T), mean_coefs, rtol=2e-7)
  np.testing.assert_allclose(SCHEDULE.one_minus_alpha_bars_T, variances, rtol=2e-7)
  np.testing.assert_allclose(SCHEDULE.betas_T, BETAS, rtol=2e-7)
  np.testing.assert_array_equal(SCHEDULE.timesteps_T, np.arange(1, T + 1))
  # Respaced to 50 steps, the recomputed β's compose to the kept timesteps' marginals.
  respaced = ddpm.respace(SCHEDULE, 50)
  kept = np.round(np.linspace(1, T, 50)).astype(int)
  np.testing.assert_array_equal(respaced.timesteps_T, kept)
  mean_coefs, variances = composed_kernels(respaced.betas_T)
  # Measured 1.8e-8 and 2.5e-8 relative.
  np.testing.assert_allclose(mean_coefs, np.sqrt(ALPHA_BARS[kept - 1]), rtol=2e-7)
  np.testing.assert_allclose(variances, 1 - ALPHA_BARS[kept - 1], rtol=2e-7)


def test_q_sample_has_the_moments_of_a_chain_of_one_step_kernels():
  chains, steps = 4096, 300
  x0_B = jnp.array([-2.0, 0.0, 0.5, 3.0])
  betas = jnp.asarray(BETAS[:steps], jnp.float32)

  @jax.jit
  def both(key):
    chain_key, closed_key = jax.random.split(key)

    def kernel(x, beta_and_key):
      beta, step_key = beta_and_key
      return jnp.sqrt(1 - beta) * x + jnp.sqrt(beta) * jax.random.normal(step_key, x.shape), None

    x0 = jnp.broadcast_to(x0_B, (chains, 4))
    chain, _ = jax.lax.scan(kernel, x0, (betas, jax.random.split(chain_key, steps)))
    closed = ddpm.q_sample(SCHEDULE, x0.reshape(-1), steps,
                           jax.random.normal(closed_key, (chains * 4,))).reshape(chains, 4)
    return chain, closed

  chain, closed = (np.asarray(a, np.float64) for a in both(jax.random.PRNGKey(0)))
  mean_se = np.sqrt((chain.var(0) + closed.var(0)) / chains)
  # Two-sample z-scores of the means, measured ≤ 2.0.
  assert (np.abs(chain.mean(0) - closed.mean(0)) < 4 * mean_se).all()
  assert (np.abs(closed.mean(0) - np.sqrt(ALPHA_BARS[steps - 1]) * x0_B) < 4 * mean_se).all()
  # Gaussian sample variances: SE of the log-ratio is √(2/(n−1)) per sample, √(4/n) for two.
  log_ratio = np.log(chain.var(0) / closed.var(0))
  assert (np.abs(log_ratio) < 4 * np.sqrt(4 / chains)).all(), log_ratio  # measured ≤ 0.058


@pytest.mark.parametrize('t', [1, 2, 10, 500, 1000])
def test_posterior_is_bayes_rule_for_gaussians(t):
  rng = np.random.default_rng(t)
  x0, x_t = rng.normal(size=(2, 3, 2, 2)).astype(np.float32)
  mean, variance = ddpm.posterior_mean_variance(SCHEDULE, x0, x_t, t)
  assert mean.shape == x0.shape and variance.shape == (3, 1, 1)
  if t == 1:  # x_{t−1} = x_0 is known: no uncertainty left.
    np.testing.assert_allclose(mean, x0, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(variance, 0.0)
    return
  # Prior x_{t−1} ~ N(√ᾱ_{t−1} x_0, 1 − ᾱ_{t−1}), likelihood x_t ~ N(√α_t x_{t−1}, β_t):
  # precisions add, and the mean is the precision-weighted sum.
  prior_mean, prior_var = np.sqrt(ALPHA_BARS[t - 2]) * x0, 1 - ALPHA_BARS[t - 2]
  alpha, beta = 1 - BETAS[t - 1], BETAS[t - 1]
  precision = 1 / prior_var + alpha / beta
  expected_mean = (prior_mean / prior_var + np.sqrt(alpha) * x_t / beta) / precision
  # float32: measured ≤ 3.7e-8 relative (variance) and ≤ 2.3e-7 absolute (mean).
  np.testing.assert_allclose(variance[:, 0, 0], 1 / precision, rtol=2e-6)
  np.testing.assert_allclose(mean, expected_mean, rtol=2e-6, atol=2e-6)


def test_ancestral_step_draws_from_the_posterior_at_the_predicted_x0():
  # With ε_θ = the ε that made x_t, Algorithm 2 draws from N(μ̃_t(x_t, x_0), σ_t²). At t = 3
  # β̃_t = 0.61 β_t, so the two variances are far apart against the tolerance (at t = 20 their
  # log-ratio, 0.086, was within it).
  draws, t = 4000, 3
  x0, noise = np.random.default_rng(1).normal(size=(2, 2, 2, 2)).astype(np.float32)
  given_eps = lambda x, t_B: noise

  @jax.jit
  def steps(keys):
    x_t = ddpm.q_sample(SCHEDULE, x0, t, noise)
    mean, _ = ddpm.posterior_mean_variance(SCHEDULE, x0, x_t, t)
    samples = {variance: jax.vmap(lambda key: ddpm.p_sample_step(
        SCHEDULE, given_eps, x_t, t, key, variance))(keys) for variance in ddpm.VARIANCES}
    # At t = 1 the step adds no noise: two keys give the same x_0.
    last = [ddpm.p_sample_step(SCHEDULE, given_eps, x0, 1, key, 'beta') for key in keys[:2]]
    return mean, samples, last

  mean, samples, last = steps(jax.random.split(jax.random.PRNGKey(2), draws))
  np.testing.assert_array_equal(last[0], last[1])
  beta_tilde = (1 - ALPHA_BARS[t - 2]) / (1 - ALPHA_BARS[t - 1]) * BETAS[t - 1]
  for variance, sigma2 in (('beta', BETAS[t - 1]), ('beta_tilde', beta_tilde)):
    draws_of_x = np.asarray(samples[variance], np.float64)
    # Measured ≤ 1.9 SE (means) and ≤ 0.054 (log-variance ratios, SE √(2/n) = 0.022).
    assert (np.abs(draws_of_x.mean(0) - mean) < 4 * np.sqrt(sigma2 / draws)).all(), variance
    log_ratio = np.log(draws_of_x.var(0) / sigma2)
    assert (np.abs(log_ratio) < 4 * np.sqrt(2 / draws)).all(), (variance, log_ratio)


def test_sampler_with_the_exact_eps_draws_the_gaussian_data():
  # The sampler's own output is Gaussian; its exact std (a float64 recursion of the affine
  # steps) differs from S by 0.04 % (1,000 steps, β), 0.96 % (50 respaced steps, β) and
  # 0.53 % (1,000 steps, β̃), its mean by < 1e-4: far inside the tolerances below.
  batch = 1024
  runs = [(None, 'beta'), (50, 'beta'), (None, 'beta_tilde')]
  outputs = jax.jit(lambda: [ddpm.sample(SCHEDULE, exact_eps, (batch, 2, 2),
                                         jax.random.PRNGKey(seed), *run)
                             for seed, run in enumerate(runs)])()
  for run, samples in zip(runs, outputs):
    samples = np.asarray(samples, np.float64)
    # Means per coordinate (SE S/√B), measured ≤ 1.4 SE; pooled std (SE S/√(2·4B) = 1.1 %),
    # measured ≤ 1.3 % off.
    assert (np.abs(samples.mean(0) - M_2x2) < 4 * S / np.sqrt(batch)).all(), (run, samples.mean(0))
    pooled_std = np.sqrt(samples.var(0).mean())
    assert abs(pooled_std / S - 1) < 4 / np.sqrt(2 * 4 * batch), (run, pooled_std)


def test_sampler_is_its_documented_steps_with_the_chosen_variance():
  # x_T from fold_in(key, 0), then step t of the respaced schedule with fold_in(key, t) and the
  # chosen variance: the test's loop over `p_sample_step` (tested against the posterior above).
  key, shape, num_steps = jax.random.PRNGKey(4), (3, 2, 2), 3
  respaced = ddpm.respace(SCHEDULE, num_steps)

  @jax.jit
  def both():
    out = {}
    for variance in ddpm.VARIANCES:
      x = jax.random.normal(jax.random.fold_in(key, 0), shape)
      for t in range(num_steps, 0, -1):
        x = ddpm.p_sample_step(respaced, exact_eps, x, t, jax.random.fold_in(key, t), variance)
      out[variance] = (ddpm.sample(SCHEDULE, exact_eps, shape, key, num_steps, variance), x)
    return out

  out = both()
  for variance, (sampled, by_hand) in out.items():
    # A loop against unrolled steps compile differently: measured ≤ 1.4e-6 apart.
    np.testing.assert_allclose(sampled, by_hand, rtol=1e-5, atol=1e-5, err_msg=variance)
  assert np.abs(out['beta'][0] - out['beta_tilde'][0]).max() > 1e-3  # the variance reaches the steps


@pytest.mark.parametrize('num_steps', [10, 50])
def test_ddim_is_a_rotation_for_gaussian_data(num_steps):
  # In z_t = (x_t − √ᾱ_t m)/√v_t, v_t = ᾱ_t s² + 1 − ᾱ_t, the η = 0 step with the exact ε is
  # z_{t'} = cos(θ_{t'} − θ_t) z_t with θ_t = atan2(s√ᾱ_t, √(1 − ᾱ_t)); θ_0 = π/2 and v_0 = s².
  x_T = np.random.default_rng(6).normal(size=(16, 2, 2)).astype(np.float32)
  out = jax.jit(lambda x: ddpm.ddim_sample(SCHEDULE, exact_eps, x, num_steps))(x_T)
  kept = np.round(np.linspace(1, T, num_steps)).astype(int)
  alpha_bars = np.concatenate([[1.0], ALPHA_BARS[kept - 1]])
  thetas = np.arctan2(S * np.sqrt(alpha_bars), np.sqrt(1 - alpha_bars))
  shrink = np.prod(np.cos(np.diff(thetas)))
  alpha_bar_T = alpha_bars[-1]
  z_T = (x_T - np.sqrt(alpha_bar_T) * M_2x2) / np.sqrt(alpha_bar_T * S**2 + 1 - alpha_bar_T)
  # float32 through the steps: measured ≤ 7.2e-7 absolute.
  np.testing.assert_allclose(out, M_2x2 + S * shrink * z_T, rtol=0, atol=5e-6)


def test_loss_at_the_exact_eps_is_the_expected_posterior_variance_of_eps():
  # E‖ε − E[ε | x_t]‖² = D · E_t[ᾱ_t s² / (ᾱ_t s² + 1 − ᾱ_t)], D = 4, t ~ U{1 … T}.
  batch = 8192
  x0 = M_2x2 + S * jax.random.normal(jax.random.PRNGKey(7), (batch, 2, 2))
  losses = np.asarray(jax.jit(lambda x, key: ddpm.loss_terms(SCHEDULE, exact_eps, x, key))(
      x0, jax.random.PRNGKey(8)), np.float64)
  expected = 4 * np.mean(ALPHA_BARS * S**2 / (ALPHA_BARS * S**2 + 1 - ALPHA_BARS))
  assert losses.shape == (batch,)
  # Measured −1.3 SE; a zero prediction would give 4 (160 SE away).
  assert abs(losses.mean() - expected) < 4 * losses.std() / np.sqrt(batch)


def test_bad_arguments_raise():
  for call, message in [(lambda: ddpm.linear_schedule(0), 'T=0'),
                        (lambda: ddpm.linear_schedule(10, 0.1, 0.01), 'beta_start=0.1'),
                        (lambda: ddpm.respace(SCHEDULE, 0), 'num_steps=0'),
                        (lambda: ddpm.sample(SCHEDULE, exact_eps, (2, 2, 2), jax.random.PRNGKey(0),
                                             num_steps=2000), 'num_steps=2000'),
                        (lambda: ddpm.sample(SCHEDULE, exact_eps, (2, 2, 2), jax.random.PRNGKey(0),
                                             variance='learned'), "variance='learned'"),
                        (lambda: ddpm.sample(SCHEDULE, exact_eps, (0, 2), jax.random.PRNGKey(0)),
                         r'shape=\(0, 2\)')]:
    with pytest.raises(ValueError, match=message):
      call()


@pytest.mark.parametrize('kind', [np.int64, bool, float])
def test_step_counts_may_be_numpy_integers_but_not_bools_or_floats(kind):
  # A NumPy integer (np.arange's, a config's) was refused as not an integer; True passed as 1.
  key = jax.random.PRNGKey(0)
  for call, n, message in [
      (lambda n: ddpm.linear_schedule(n).betas_T, 10, 'T={!r} must be a positive integer.'),
      (lambda n: ddpm.respace(SCHEDULE, n).timesteps_T, 10,
       'num_steps={!r} must be an integer from 1 to T=1000.'),
      (lambda n: ddpm.sample(SCHEDULE, exact_eps, (2, 2, 2), key, num_steps=n), 10,
       'num_steps={!r} must be an integer from 1 to T=1000.')]:
    if kind is np.int64:
      np.testing.assert_array_equal(call(kind(n)), call(n))
    else:
      with pytest.raises(ValueError, match=message.format(kind(n))):
        call(kind(n))


@pytest.mark.parametrize('t', [0, 1001, 2.5, [1, 0]])
def test_steps_outside_one_to_t_are_refused(t):
  # Step 0 read step T's ᾱ (index −1) and 1001 was clamped to T, both without a word.
  x0 = jnp.zeros((2, 2, 2))
  for call in (lambda: ddpm.q_sample(SCHEDULE, x0, t, x0),
               lambda: ddpm.posterior_mean_variance(SCHEDULE, x0, x0, t)):
    with pytest.raises(ValueError, match=r'Steps t=.* must be integers from 1 to 1000\.'):
      call()


def test_a_traced_step_outside_one_to_t_gives_nan():
  # Traced, a step cannot be checked before use: it reads NaN, not a neighbouring step's ᾱ.
  x0 = jnp.ones((3, 2, 2))
  x_t = jax.jit(lambda t_B: ddpm.q_sample(SCHEDULE, x0, t_B, x0))(jnp.array([0, 1, 1001]))
  assert np.all(np.isnan(x_t[0])) and np.all(np.isnan(x_t[2]))
  np.testing.assert_allclose(x_t[1], np.sqrt(ALPHA_BARS[0]) + np.sqrt(1 - ALPHA_BARS[0]),
                             rtol=1e-6)


def test_loss_draws_every_respaced_step_uniformly_and_calls_the_net_with_its_original_timestep():
  # x_0 = 0, so x_t = √(1 − ᾱ_t) ε, and the net below returns ε exactly from the original
  # table plus an offset equal to the timestep it is called with: each loss term is then
  # τ², which tells which step was drawn and with which timestep the net was called.
  # Guards against the net being called with the respaced index and against t = K never
  # being drawn.
  original = ddpm.linear_schedule(10, 0.05, 0.3)
  one_minus_alpha_bars = 1 - np.cumprod(1 - np.linspace(0.05, 0.3, 10))
  respaced = ddpm.respace(original, 4)  # timesteps 1, 4, 7, 10 (0-based 0, 3, 6, 9)

  def net(x_t, t_B):
    scale = jnp.sqrt(jnp.asarray(one_minus_alpha_bars, jnp.float32)[t_B - 1])[:, None]
    return x_t / scale + t_B[:, None].astype(jnp.float32)

  batch = 4000
  losses = np.asarray(ddpm.loss_terms(respaced, net, jnp.zeros((batch, 1)), jax.random.PRNGKey(3)))
  np.testing.assert_allclose(np.sqrt(losses), np.round(np.sqrt(losses)), atol=1e-3)
  values, counts = np.unique(np.round(np.sqrt(losses)).astype(int), return_counts=True)
  np.testing.assert_array_equal(values, [1, 4, 7, 10])
  # Each count is Binomial(4000, 1/4): SD 27, so ±110 is 4 SD.
  assert np.all(np.abs(counts - batch / 4) < 110), counts


def test_respacing_a_respaced_schedule_keeps_the_original_timesteps():
  # The 4 kept steps of T = 10 are 1, 4, 7, 10; 2 of those are the first and last, whose
  # timesteps are 1 and 10 of the original process, not 1 and 4 (their places in the 4).
  original = ddpm.linear_schedule(10, 0.05, 0.3)
  twice = ddpm.respace(ddpm.respace(original, 4), 2)
  np.testing.assert_array_equal(twice.timesteps_T, [1, 10])
  alpha_bars = np.cumprod(1 - np.linspace(0.05, 0.3, 10))
  np.testing.assert_allclose(twice.alpha_bars_T, alpha_bars[[0, 9]], rtol=1e-6)


def test_linear_schedule_defaults_to_ho_et_al():
  # Ho et al. 2020 §4: T = 1000 steps with β linear from 1e-4 to 0.02. Every other test gives T.
  np.testing.assert_allclose(ddpm.linear_schedule().betas_T, BETAS, rtol=2e-7)


def test_respacing_to_one_step_keeps_the_last_timestep():
  # K = 1 keeps τ_1 = T, with β_1 = 1 − ᾱ_T: one step from pure noise to x_0, not step 1.
  one = ddpm.respace(SCHEDULE, 1)
  np.testing.assert_array_equal(one.timesteps_T, [T])
  np.testing.assert_allclose(one.alpha_bars_T, ALPHA_BARS[-1:], rtol=1e-5)
  np.testing.assert_allclose(one.betas_T, 1 - ALPHA_BARS[-1:], rtol=1e-6)


def test_ancestral_step_adds_noise_at_every_step_but_the_first():
  # Per-example steps t = [1, 2, 3] with the same ε: x_{t−1} = (x_t − β_t/√(1 − ᾱ_t) ε)/√α_t
  # + σ_t z, σ_t² = β_t, written out in float64; only t = 1 is noise-free (t = 2 dropped
  # its noise unnoticed, the other tests looking at t = 1 and t ≥ 3).
  t_B, key = np.array([1, 2, 3]), jax.random.PRNGKey(5)
  x_t, eps = np.random.default_rng(9).normal(size=(2, 3, 2, 2))
  out = ddpm.p_sample_step(SCHEDULE, lambda x, t: jnp.asarray(eps, jnp.float32),
                           jnp.asarray(x_t, jnp.float32), t_B, key)
  beta = BETAS[t_B - 1][:, None, None]
  mean = (x_t - beta / np.sqrt(1 - ALPHA_BARS[t_B - 1])[:, None, None] * eps) / np.sqrt(1 - beta)
  z = np.asarray(jax.random.normal(key, x_t.shape), np.float64)
  sigma = np.where(t_B > 1, np.sqrt(BETAS[t_B - 1]), 0.0)[:, None, None]
  np.testing.assert_allclose(out, mean + sigma * z, rtol=1e-5, atol=1e-5)


def test_sampler_defaults_to_all_steps_with_variance_beta():
  # Algorithm 2 as Ho et al. ran it: all T steps and σ_t² = β_t unless asked otherwise.
  schedule, key, shape = ddpm.respace(SCHEDULE, 4), jax.random.PRNGKey(6), (2, 2, 2)
  np.testing.assert_array_equal(ddpm.sample(schedule, exact_eps, shape, key),
                                ddpm.sample(schedule, exact_eps, shape, key, 4, 'beta'))
