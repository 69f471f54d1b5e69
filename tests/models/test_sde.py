"""Score SDEs (Song et al. 2021b) against references written out here: each SDE's
perturbation kernel against an Euler–Maruyama simulation of the forward SDE, and the
samplers, the ODE likelihood and the score-matching loss with the exact score of Gaussian
data x(0) ~ N(m, s²I), whose marginals are Gaussian too:

  p_t = N(a(t) m, (a(t)² s² + σ(t)²) I),   ∇ log p_t(x) = −(x − a(t) m) / (a(t)² s² + σ(t)²).

Monte-Carlo tolerances are 4 standard errors (seeds fixed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.generative import sde as sde_lib

SDES = {'vp': sde_lib.VPSDE(), 'subvp': sde_lib.SubVPSDE(), 've': sde_lib.VESDE()}
M = np.array([0.5, -1.0], np.float32)
S = 0.6


def exact_score(sde):
  def score(x, t_B):
    a, sigma = sde.marginal(jnp.ones_like(x), t_B)
    return -(x - a * M) / (a**2 * S**2 + sigma**2)
  return score


def gaussian_log_prob(x, mean, variance):
  x = np.asarray(x, np.float64)
  return np.sum(-0.5 * (x - mean)**2 / variance - 0.5 * np.log(2 * np.pi * variance), axis=-1)


def check_moments(samples_BxD, mean, std, what):
  """Per-coordinate means within 4 SE (std/√B); the std pooled over coordinates within
  4 SE (std/√(2BD)). Returns the means' z-scores and the std's relative error."""
  samples = np.asarray(samples_BxD, np.float64)
  batch, dims = samples.shape
  z = (samples.mean(0) - mean) / (std / np.sqrt(batch))
  std_error = np.sqrt(samples.var(0).mean()) / std - 1
  assert (np.abs(z) < 4).all(), (what, z)
  assert abs(std_error) < 4 / np.sqrt(2 * batch * dims), (what, std_error)
  return z, std_error


def test_marginals_match_an_euler_maruyama_simulation_of_the_forward_sde():
  chains, steps, dt = 2048, 1000, 1e-3
  x0 = jnp.broadcast_to(jnp.array([1.0, -2.0]), (chains, 2))

  @jax.jit
  def simulate(key):
    out = {}
    for name, sde in SDES.items():
      sde_key = jax.random.fold_in(key, len(out))

      def em_step(x, i, sde=sde, sde_key=sde_key):
        drift, diffusion = sde.drift_diffusion(x, jnp.full((chains,), i * dt))
        noise = jax.random.normal(jax.random.fold_in(sde_key, i), x.shape)
        return x + drift * dt + diffusion * np.sqrt(dt) * noise, None
      at_03, _ = jax.lax.scan(em_step, x0, jnp.arange(300))
      at_1, _ = jax.lax.scan(em_step, at_03, jnp.arange(300, steps))
      out[name] = (at_03, at_1,
                   sde.marginal(x0[:1], jnp.full((1,), 0.3)), sde.marginal(x0[:1], jnp.ones((1,))))
    return out

  # Euler–Maruyama's own bias at dt = 1e-3 is ≤ 0.5 % in variance (VP: β dt/4 at β = 20).
  # Measured: |z| ≤ 1.1 for the means and ≤ 1.4 % for the stds (tolerance 4.4 %).
  for name, (at_03, at_1, kernel_03, kernel_1) in simulate(jax.random.PRNGKey(0)).items():
    for t, samples, (mean, std) in ((0.3, at_03, kernel_03), (1.0, at_1, kernel_1)):
      check_moments(samples, np.asarray(mean[0]), float(std.reshape(-1)[0]), (name, t))


def test_pc_sampler_with_the_exact_score_draws_the_gaussian_data():
  batch = 2048
  runs = [('vp', 'reverse_diffusion', 'langevin'), ('ve', 'reverse_diffusion', 'langevin'),
          ('subvp', 'euler_maruyama', None)]
  outputs = jax.jit(lambda key: [sde_lib.pc_sample(SDES[name], exact_score(SDES[name]),
                                                   (batch, 2), jax.random.fold_in(key, i),
                                                   num_steps=100, predictor=predictor,
                                                   corrector=corrector)
                                 for i, (name, predictor, corrector) in enumerate(runs)])(
                                     jax.random.PRNGKey(1))
  # On 65,536 samples the 100-step samplers' own std bias measures +0.3 % (VP), +1.5 % (VE)
  # and +0.6 % (sub-VP, Euler–Maruyama alone), their means' ≤ 0.009 (0.7 SE here).
  # Here: |z| ≤ 1.7 and std errors ≤ 1.8 % (tolerance 4.4 %).
  for run, samples in zip(runs, outputs):
    check_moments(samples, M, S, run)


def test_ode_sampler_with_the_exact_score_draws_the_gaussian_data():
  batch = 2048
  runs = [('vp', 'rk4', 'uniform'), ('ve', 'rk4', 'uniform'), ('subvp', 'heun', 'uniform'),
          ('vp', 'rk4', 'log')]
  outputs = jax.jit(lambda key: [sde_lib.ode_sample(SDES[name], exact_score(SDES[name]),
                                                    (batch, 2), jax.random.fold_in(key, i),
                                                    num_steps=50, method=method, spacing=spacing)
                                 for i, (name, method, spacing) in enumerate(runs)])(
                                     jax.random.PRNGKey(2))
  # Measured |z| ≤ 1.9 and std errors ≤ 1.7 % (tolerance 4.4 %).
  for run, samples in zip(runs, outputs):
    check_moments(samples, M, S, run)


def terminal_marginal(sde):
  """a(T) m and a(T)² s² + σ(T)², the mean and variance of p_T."""
  a, sigma = (float(v.reshape(-1)[0]) for v in sde.marginal(jnp.ones((1, 1)), jnp.ones((1,))))
  return a * M, a**2 * S**2 + sigma**2


class _ExactPrior:
  """`sde` with its prior replaced by the exact p_T of the Gaussian data."""

  def __init__(self, sde):
    self.sde = sde
    self.mean, self.variance = terminal_marginal(sde)

  def __getattr__(self, name):
    return getattr(self.sde, name)

  def prior_log_prob(self, z):
    return jnp.sum(-0.5 * (z - self.mean)**2 / self.variance
                   - 0.5 * np.log(2 * np.pi * self.variance), axis=-1)


def test_ode_log_likelihood_with_the_exact_divergence_is_the_gaussian_log_density():
  x = np.random.default_rng(3).normal(size=(8, 2)).astype(np.float32) * S + M
  expected = gaussian_log_prob(x, M, S**2)
  with_exact_prior = {name: _ExactPrior(sde) for name, sde in SDES.items()}
  log_p = jax.jit(lambda x: {name: [
      sde_lib.ode_log_likelihood(s, exact_score(sde), x, None, num_steps=100, divergence='exact')
      for s in (sde, with_exact_prior[name])] for name, sde in SDES.items()})(x)
  for name, (own_prior, exact_prior) in log_p.items():
    # With the exact p_T only the solver errs: measured ≤ 2.0e-5 (RK4, 100 steps).
    np.testing.assert_allclose(exact_prior, expected, rtol=0, atol=1e-4, err_msg=name)
    # With the SDE's own prior, N(0, I) or N(0, σ_max² I), the result is off by
    # log prior(x(T)) − log p_T(x(T)), 0.025 (VP) to 0.074 (VE) here. For Gaussian data the
    # flow keeps (x − a m)/√v fixed, so x(T) = a(T) m + √v(T) (x − m)/s is known.
    mean_T, variance_T = terminal_marginal(SDES[name])
    x_T = mean_T + np.sqrt(variance_T) * (x - M) / S
    prior_variance = SDES[name].sigma_max**2 if name == 've' else 1.0
    mismatch = gaussian_log_prob(x_T, 0.0, prior_variance) - gaussian_log_prob(x_T, mean_T,
                                                                               variance_T)
    assert np.abs(mismatch).max() > 0.02, name
    np.testing.assert_allclose(own_prior, expected + mismatch, rtol=0, atol=1e-4, err_msg=name)


def test_a_log_time_grid_follows_the_ode_near_t_0_where_uniform_steps_fail():
  # Data N(m, s²I) with s = 0.003 (finer than the 1/127.5 between two pixel levels): the
  # score at t = ε = 1e-5 is ~1/(s² + σ²) ≈ 1e5, so a uniform first step of 0.05 crosses
  # two decades of noise at once. With the exact p_T only the solver errs.
  s, eps = 0.003, 1e-5
  sde = _ExactPrior(SDES['vp'])

  def variance(t):
    a, sigma = (float(v.reshape(-1)[0]) for v in sde.marginal(jnp.ones((1, 1)), jnp.full((1,), t)))
    return a**2 * s**2 + sigma**2

  sde.variance = variance(sde.T)

  def score(x, t_B):
    a, sigma = sde.marginal(jnp.ones_like(x), t_B)
    return -(x - a * M) / (a**2 * s**2 + sigma**2)

  x = (np.random.default_rng(5).normal(size=(8, 2)) * s + M).astype(np.float32)
  a_eps = float(sde.marginal(jnp.ones((1, 1)), jnp.full((1,), eps))[0].reshape(-1)[0])
  expected = gaussian_log_prob(x, a_eps * M, variance(eps))
  log_p = jax.jit(lambda x: {spacing: sde_lib.ode_log_likelihood(
      sde, score, x, None, num_steps=20, divergence='exact', eps=eps, spacing=spacing)
                             for spacing in sde_lib.TIME_GRIDS})(x)
  # Measured: log grid ≤ 0.016 nats off, uniform grid 78 nats off (20 RK4 steps each).
  np.testing.assert_allclose(log_p['log'], expected, rtol=0, atol=0.05)
  assert np.abs(log_p['uniform'] - expected).min() > 10


def test_hutchinson_log_likelihood_is_unbiased():
  # Correlated data, N(m, C): the flow's Jacobian is not diagonal, so neither probe is exact
  # (Rademacher probes are for a diagonal Jacobian). p_t = N(a m, a² C + σ² I).
  copies = 512
  sde = SDES['vp']
  cov_2x2 = np.array([[0.36, 0.15], [0.15, 0.25]], np.float32)

  def score(x, t_B):
    a, sigma = sde.marginal(jnp.ones_like(x[:, :1]), t_B)
    # a² C + σ² I = [[p, q], [q, r]], each entry [B, 1].
    p, q, r = (a**2 * cov_2x2[i, j] + sigma**2 * (i == j) for i, j in ((0, 0), (0, 1), (1, 1)))
    u_Bx2 = x - a * M
    # −[[p, q], [q, r]]⁻¹ u, the inverse of a 2 × 2 matrix written out.
    return -jnp.concatenate([r * u_Bx2[:, :1] - q * u_Bx2[:, 1:],
                             p * u_Bx2[:, 1:] - q * u_Bx2[:, :1]], axis=1) / (p * r - q * q)

  x = jnp.broadcast_to(jnp.array([0.9, -1.4]), (copies, 2))
  log_p = jax.jit(lambda x, key: {probe: sde_lib.ode_log_likelihood(
      sde, score, x, key, num_steps=50, probe=probe) for probe in sde_lib.PROBES} | {
          'exact': sde_lib.ode_log_likelihood(sde, score, x[:1], None, 50, divergence='exact')})(
              x, jax.random.PRNGKey(4))
  exact = float(log_p.pop('exact')[0])
  for probe, estimates in log_p.items():
    estimates = np.asarray(estimates, np.float64)
    se = estimates.std() / np.sqrt(copies)
    # One probe per copy: measured |z| ≤ 1.2 (SE 0.024 Rademacher, 0.063 Gaussian).
    assert se > 1e-3, probe
    assert abs(estimates.mean() - exact) < 4 * se, (probe, estimates.mean(), exact, se)


def test_flow_divergence_is_the_jacobian_trace():
  weights = np.random.default_rng(5).normal(size=(3, 3)).astype(np.float32)
  fn = lambda x: jnp.tanh(x.reshape(-1, 3) @ weights).reshape(x.shape) * x
  x = np.random.default_rng(6).normal(size=(4, 3, 1)).astype(np.float32)
  jacobians = jax.jit(jax.vmap(jax.jacrev(lambda xi: fn(xi[None])[0].reshape(3))))(x)
  traces = np.trace(np.asarray(jacobians).reshape(4, 3, 3), axis1=1, axis2=2)
  # Measured 2.4e-7.
  np.testing.assert_allclose(jax.jit(lambda x: sde_lib.flow_divergence(fn, x))(x), traces,
                             rtol=1e-5, atol=1e-6)


def test_dsm_loss_is_lowest_at_the_exact_score():
  batch = 8192
  shift = jnp.array([0.3, -0.2])
  t = (np.arange(100_000) + 0.5) / 100_000 * (1 - 1e-5) + 1e-5  # midpoints of U(ε, 1)

  @jax.jit
  def losses_and_kernels(key):
    x0 = M + S * jax.random.normal(jax.random.fold_in(key, 0), (batch, 2))
    out = {}
    for name in ('vp', 've'):
      sde, score = SDES[name], exact_score(SDES[name])
      # The same key, so the same t and z: the differences have little variance.
      out[name] = ([sde_lib.dsm_loss(sde, fn, x0, key) for fn in (
          score, lambda x, t: score(x, t) + shift, lambda x, t: 1.2 * score(x, t))],
                   sde.marginal(jnp.ones((t.size, 1)), jnp.asarray(t, jnp.float32)))
    return out

  for name, (losses, (a, sigma)) in losses_and_kernels(jax.random.PRNGKey(8)).items():
    exact, shifted, scaled = (np.asarray(v, np.float64) for v in losses)
    a, sigma = np.asarray(a, np.float64)[:, 0], np.asarray(sigma, np.float64)[:, 0]
    # E‖σ s* + z‖² = D E_t[a² s² / (a² s² + σ²)], t ~ U(ε, 1); measured |z| ≤ 0.9.
    expected = 2 * np.mean(a**2 * S**2 / (a**2 * S**2 + sigma**2))
    se = exact.std() / np.sqrt(batch)
    assert abs(exact.mean() - expected) < 4 * se, (name, exact.mean(), expected, se)
    # A constant shift c adds E_t[σ²] ‖c‖² in expectation; measured |z| ≤ 1.6.
    gap = shifted - exact
    assert abs(gap.mean() - np.mean(sigma**2) * 0.13) < 4 * gap.std() / np.sqrt(batch), name
    # Any other function scores higher: measured gaps 25 to 53 SE above zero.
    for other in (shifted, scaled):
      gap = other - exact
      assert gap.mean() > 10 * gap.std() / np.sqrt(batch), name


def ddpm_exact_eps(betas_T):
  """The best ε-predictor of a T-step DDPM for the Gaussian data (Ho et al. 2020, eq. 4):
  E[ε | x_τ] = √(1 − ᾱ) (x − √ᾱ m) / (ᾱ s² + 1 − ᾱ), at fractional steps τ with log ᾱ
  interpolated linearly between steps (ᾱ_0 = 1)."""
  log_alpha_bars = np.concatenate([[0.0], np.cumsum(np.log(1 - np.asarray(betas_T, np.float64)))])

  def eps(x, tau_B):
    alpha_bar = jnp.exp(jnp.interp(tau_B, jnp.arange(len(log_alpha_bars), dtype=jnp.float32),
                                   jnp.asarray(log_alpha_bars, jnp.float32)))[:, None]
    return (jnp.sqrt(1 - alpha_bar) * (x - jnp.sqrt(alpha_bar) * M)
            / (alpha_bar * S**2 + 1 - alpha_bar))
  return eps


def test_a_ddpm_eps_network_is_the_score_of_its_vp_sde():
  from models.generative import ddpm  # pylint: disable=g-import-not-at-top
  schedule = ddpm.linear_schedule(1000, 1e-4, 0.02)
  sde = sde_lib.vp_sde_from_ddpm(schedule)
  # Song et al. 2021b, App. B: β_min = N β_1, β_max = N β_N.
  assert (sde.beta_min, sde.beta_max) == pytest.approx((0.1, 20.0))
  score_fn = sde_lib.score_from_eps(sde, ddpm_exact_eps(np.linspace(1e-4, 0.02, 1000)), schedule)
  called = []
  probe = lambda x, tau: called.append(np.asarray(tau)) or jnp.zeros_like(x)
  t_B = jnp.array([1e-3, 0.01, 0.1, 0.3, 0.5, 0.8, 1.0])
  x = jnp.asarray(np.random.default_rng(4).normal(size=(len(t_B), 2)), jnp.float32)
  # The step the network is called at is ≈ tN, e.g. not t itself: measured 1.08 at t = 1e-3,
  # 10.33 at t = 0.01 and 996.6 at t = 1 (the schedules differ at second order: −log(1 − β) = β + β²/2 + …).
  sde_lib.score_from_eps(sde, probe, schedule)(x, t_B)
  np.testing.assert_allclose(called[0], np.asarray(t_B) * 1000, rtol=5e-3, atol=0.5)
  # With the exact ε of the Gaussian data it is the VP SDE's exact score at every t (the
  # noise levels match): measured ≤ 1.2e-4 relative, at t = 1e-3 where 1 − ᾱ ≈ 1e-4 in float32.
  np.testing.assert_allclose(score_fn(x, t_B), exact_score(sde)(x, t_B), rtol=5e-4, atol=1e-5)
  # … and the samplers draw the data from it.
  samples = jax.jit(lambda key: sde_lib.ode_sample(sde, score_fn, (2048, 2), key, num_steps=50))(
      jax.random.PRNGKey(5))
  check_moments(samples, M, S, 'ddpm as VP ODE')


def test_a_constant_beta_ddpm_is_sampled_and_scored_through_its_constant_beta_vp_sde():
  # β_start = β_end, a schedule DDPM training takes, gives β(t) = β = 10, B(t) = βt: refused
  # before as beta_min = beta_max, so the PC and ODE samplers and the likelihood could not run.
  from models.generative import ddpm  # pylint: disable=g-import-not-at-top
  schedule = ddpm.linear_schedule(1000, 0.01, 0.01)
  sde = sde_lib.vp_sde_from_ddpm(schedule)
  assert (sde.beta_min, sde.beta_max) == pytest.approx((10.0, 10.0))
  t_B = np.array([1e-3, 0.1, 0.5, 1.0], np.float32)
  mean, std = sde.marginal(jnp.ones((4, 1)), t_B)
  np.testing.assert_allclose(mean[:, 0], np.exp(-5 * t_B.astype(np.float64)), rtol=1e-6)
  np.testing.assert_allclose(std[:, 0], np.sqrt(1 - np.exp(-10 * t_B.astype(np.float64))),
                             rtol=1e-6)
  score_fn = sde_lib.score_from_eps(sde, ddpm_exact_eps(np.full(1000, 0.01)), schedule)
  assert sde_lib.min_pc_steps(sde) == 10
  pc, ode = jax.jit(lambda key: [
      sde_lib.pc_sample(sde, score_fn, (2048, 2), key, num_steps=1000),
      sde_lib.ode_sample(sde, score_fn, (2048, 2), jax.random.fold_in(key, 1), num_steps=50)])(
          jax.random.PRNGKey(6))
  # Measured |z| ≤ 2.2 and std errors ≤ 1.3 % (tolerance 4.4 %); 100 PC steps, β h = 0.1,
  # are 6 % narrow, with the exact score too.
  check_moments(pc, M, S, 'constant-β PC')
  check_moments(ode, M, S, 'constant-β ODE')
  x = np.random.default_rng(3).normal(size=(8, 2)).astype(np.float32) * S + M
  a, sigma = (float(v.reshape(-1)[0]) for v in sde.marginal(jnp.ones((1, 1)), jnp.full((1,), 1e-3)))
  exact_prior = _ExactPrior(sde)
  log_p = jax.jit(lambda x: sde_lib.ode_log_likelihood(
      exact_prior, score_fn, x, None, num_steps=100, divergence='exact', eps=1e-3))(x)
  # log p_ε of the data's p_ε = N(a(ε) m, (a(ε)² s² + σ(ε)²) I): measured ≤ 2.6e-5.
  np.testing.assert_allclose(log_p, gaussian_log_prob(x, a * M, a**2 * S**2 + sigma**2),
                             rtol=0, atol=1e-4)


def test_only_a_linear_ddpm_schedule_gives_a_vp_sde():
  from models.generative import ddpm  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='not linear in β'):
    sde_lib.vp_sde_from_ddpm(ddpm.schedule_from_betas(np.geomspace(1e-4, 0.02, 100)))


@pytest.mark.parametrize('name, predictor, corrector, fewest', [
    ('vp', 'reverse_diffusion', 'langevin', 20), ('vp', 'reverse_diffusion', None, 20),
    ('vp', 'euler_maruyama', 'langevin', 20), ('subvp', 'reverse_diffusion', 'langevin', 20),
    ('subvp', 'reverse_diffusion', None, 1), ('ve', 'reverse_diffusion', 'langevin', 1)])
def test_pc_sampler_refuses_exactly_the_step_counts_that_give_nan(name, predictor, corrector,
                                                                   fewest, monkeypatch):
  # β(T) h < 1 with β(T) = 20, h = (1 − 0.001)/N: N > 19.98. Sub-VP's predictor steps by
  # Euler–Maruyama, but its corrector's α = 1 − β(t) h is the VP one.
  sde = SDES[name]
  assert sde_lib.min_pc_steps(sde, predictor, corrector) == fewest
  sample = lambda n: np.asarray(sde_lib.pc_sample(sde, exact_score(sde), (64, 2),
                                                  jax.random.PRNGKey(0), num_steps=n,
                                                  predictor=predictor, corrector=corrector))
  assert np.isfinite(sample(max(fewest, 5))).all()
  if fewest > 1:
    with pytest.raises(ValueError, match=f'num_steps={fewest - 1} is too few .* at least {fewest}'):
      sample(fewest - 1)
    monkeypatch.setattr(sde_lib, 'min_pc_steps', lambda *args, **kwargs: 1)
    assert np.isnan(sample(fewest - 1)).any()  # unchecked, one step fewer gives NaN


def test_bad_arguments_raise():
  x, key = jnp.zeros((2, 2)), jax.random.PRNGKey(0)
  score = exact_score(SDES['vp'])
  for call, message in [
      (lambda: sde_lib.VPSDE(beta_min=0.0), 'beta_min=0.0'),
      (lambda: sde_lib.VESDE(sigma_min=1.0, sigma_max=0.5), 'sigma_min=1.0'),
      (lambda: sde_lib.pc_sample(SDES['vp'], score, (2, 2), key, predictor='ddim'),
       "predictor='ddim'"),
      (lambda: sde_lib.pc_sample(SDES['vp'], score, (2, 2), key, predictor=None, corrector=None),
       'both None'),
      (lambda: sde_lib.pc_sample(SDES['vp'], score, (2, 2), key, num_steps=0), 'num_steps=0'),
      (lambda: sde_lib.pc_sample(SDES['vp'], score, (2, 2), key, snr=0.0), 'snr=0.0'),
      (lambda: sde_lib.ode_sample(SDES['vp'], score, (2, 2), key, method='euler'),
       "method='euler'"),
      (lambda: sde_lib.ode_sample(SDES['vp'], score, (2, 2), key, spacing='cosine'),
       "spacing='cosine'"),
      (lambda: sde_lib.ode_sample(SDES['vp'], score, 4, key), 'shape=4'),
      (lambda: sde_lib.ode_log_likelihood(SDES['vp'], score, x, key, divergence='trace'),
       "divergence='trace'"),
      (lambda: sde_lib.ode_log_likelihood(SDES['vp'], score, x, key, probe='uniform'),
       "probe='uniform'"),
      (lambda: sde_lib.dsm_loss(SDES['vp'], score, x, key, eps=1.5), 'eps=1.5')]:
    with pytest.raises(ValueError, match=message):
      call()


@pytest.mark.parametrize('kind', [np.int64, bool, float])
def test_step_counts_may_be_numpy_integers_but_not_bools_or_floats(kind):
  # A NumPy integer (np.arange's, a config's) was refused as "must be a positive integer";
  # True passed as 1 (or was "too few" for the PC sampler).
  sde, score, key = SDES['vp'], exact_score(SDES['vp']), jax.random.PRNGKey(0)
  x = jnp.zeros((2, 2)) + M
  for call, n, name in [
      (lambda n: sde_lib.pc_sample(sde, score, (2, 2), key, num_steps=n), 20, 'num_steps'),
      (lambda n: sde_lib.pc_sample(sde, score, (2, 2), key, num_steps=20, corrector_steps=n), 2,
       'corrector_steps'),
      (lambda n: sde_lib.ode_sample(sde, score, (2, 2), key, num_steps=n), 5, 'num_steps'),
      (lambda n: sde_lib.ode_log_likelihood(sde, score, x, key, num_steps=n), 5, 'num_steps')]:
    if kind is np.int64:
      np.testing.assert_array_equal(call(kind(n)), call(n))
    else:
      with pytest.raises(ValueError, match=rf'^{name}={kind(n)!r} must be a positive integer\.$'):
        call(kind(n))


@pytest.mark.parametrize('name', ['vp', 'subvp', 've'])
def test_langevin_corrector_takes_the_documented_steps(name):
  # Against Algorithms 4 and 5 written out in float64: ε = 2α(snr ‖z‖ / ‖s‖)² with the norms
  # averaged over the batch, α = 1 − β(t) dt for VP and sub-VP and 1 for VE. The sampler
  # tests run the corrector with the exact score, where any small step leaves the data's
  # distribution as it is: dropping α or the factor 2 passed them.
  sde, t, dt, snr = SDES[name], 0.5, 0.01, 0.16
  x0 = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (4, 3)), np.float64)
  score = lambda x: -0.7 * x + 0.1
  key = jax.random.PRNGKey(1)
  x, mean = sde_lib.langevin_corrector(sde, lambda x, t_B: score(x), jnp.asarray(x0, jnp.float32),
                                       t, dt, key, snr, n_steps=2)
  alpha = 1 - (0.1 + t * (20.0 - 0.1)) * dt if name != 've' else 1.0
  ref = x0
  for i in range(2):
    z = np.asarray(jax.random.normal(jax.random.fold_in(key, i), ref.shape), np.float64)
    s = score(ref)
    norm = lambda v: np.mean(np.linalg.norm(v, axis=1))
    eps = 2 * alpha * (snr * norm(z) / norm(s))**2
    ref_mean = ref + eps * s
    ref = ref_mean + np.sqrt(2 * eps) * z
  np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('method, order', [('heun', 2), ('rk4', 4)])
def test_ode_sampler_converges_at_the_order_of_its_method(method, order):
  # With the exact score of Gaussian data the probability-flow ODE is affine in x: the
  # solution from x(T) is x(ε) = a(ε) m + √(v(ε)/v(T)) (x(T) − a(T) m), v = a² s² + σ².
  # Doubling the steps must divide the error by about 2^order (measured 4.4 for Heun, 17
  # for RK4 on this log grid); a Heun step whose second slope is taken at t instead of t + h
  # is first order (ratio about 2). The exact solution starts from the prior draw of `key`, a
  # key other than PRNGKey(0): a sampler that drew x(T) from a fixed key fails.
  sde = SDES['vp']
  key, shape, eps = jax.random.PRNGKey(5), (4, 2), 1e-3
  x_T = np.asarray(sde.prior_sample(key, shape), np.float64)
  # a(t) = e^{−B(t)/2}, σ(t)² = 1 − e^{−B(t)}, B(t) = β_min t + ½ t² (β_max − β_min).
  big_b = lambda t: sde.beta_min * t + 0.5 * t**2 * (sde.beta_max - sde.beta_min)
  a_T, a_eps = np.exp(-0.5 * big_b(1.0)), np.exp(-0.5 * big_b(eps))
  v_T, v_eps = (a**2 * S**2 + 1 - a**2 for a in (a_T, a_eps))
  exact = a_eps * M + np.sqrt(v_eps / v_T) * (x_T - a_T * M)
  errors = [np.abs(np.asarray(sde_lib.ode_sample(sde, exact_score(sde), shape, key, num_steps=n,
                                                 method=method, spacing='log')) - exact).max()
            for n in (20, 40)]
  assert errors[0] / errors[1] > 2**order * 0.75, errors


def test_an_eps_network_of_a_respaced_schedule_is_called_with_its_original_timesteps():
  # T = 10 respaced to the steps 1, 4, 7, 10: at the time t where B(t) = −log ᾱ_4, the noise
  # level of the second kept step, the network must see its own timestep 4 (not the step's
  # place 2); halfway in −log ᾱ between the second and third kept steps, 5.5.
  from models.generative import ddpm  # pylint: disable=g-import-not-at-top
  betas = np.linspace(0.01, 0.2, 10)
  log_alpha_bars = np.cumsum(np.log1p(-betas))
  respaced = ddpm.respace(ddpm.schedule_from_betas(betas), 4)
  sde = sde_lib.VPSDE(beta_min=1.0, beta_max=5.0)
  # B(t) = β_min t + ½ t² (β_max − β_min) = c, solved for t.
  a, b = 0.5 * (sde.beta_max - sde.beta_min), sde.beta_min
  time_of = lambda c: (-b + np.sqrt(b * b + 4 * a * c)) / (2 * a)
  levels = np.array([-log_alpha_bars[3], -0.5 * (log_alpha_bars[3] + log_alpha_bars[6])])
  called = []
  probe = lambda x, label: called.append(np.asarray(label)) or jnp.zeros_like(x)
  t_B = jnp.asarray(time_of(levels), jnp.float32)
  sde_lib.score_from_eps(sde, probe, respaced)(jnp.zeros((2, 1)), t_B)
  np.testing.assert_allclose(called[0], [4.0, 5.5], atol=1e-3)


def test_discretisations_are_the_ddpm_and_smld_steps():
  # VP (Song et al. 2021b, App. E): x_{i+1} = √(1 − β_i) x_i + √β_i z with β_i = β(t) h, so
  # f_i = (√(1 − β_i) − 1) x and G_i = √β_i. VE: f_i = 0, G_i = √(σ(t)² − σ(t − h)²), the
  # step between the noise levels at t − h and t (not t and t + h).
  x = jnp.array([[1.5, -2.0]])
  t, h = 0.6, 0.05
  f, g = SDES['vp'].discretize(x, jnp.array([t]), h)
  beta_i = (0.1 + t * (20.0 - 0.1)) * h
  np.testing.assert_allclose(f, (np.sqrt(1 - beta_i) - 1) * np.array([[1.5, -2.0]]), rtol=1e-5)
  np.testing.assert_allclose(g.reshape(-1), [np.sqrt(beta_i)], rtol=1e-5)
  f, g = SDES['ve'].discretize(x, jnp.array([t]), h)
  sigma = lambda s: 0.01 * (50.0 / 0.01) ** s
  np.testing.assert_array_equal(f, 0.0)
  np.testing.assert_allclose(g.reshape(-1), [np.sqrt(sigma(t)**2 - sigma(t - h)**2)], rtol=1e-5)
  # sub-VP: the Euler–Maruyama step of eq. 17, f_i = −½β(t) x h and
  # G_i = g(t) √h = √(β(t)(1 − e^{−2B(t)}) h), B(t) = β_min t + ½ t² (β_max − β_min). Its
  # sampler test uses the Euler–Maruyama predictor, not this step: G_i = g(t) h passed it.
  f, g = SDES['subvp'].discretize(x, jnp.array([t]), h)
  beta, big_b = 0.1 + t * (20.0 - 0.1), 0.1 * t + 0.5 * t**2 * (20.0 - 0.1)
  np.testing.assert_allclose(f, -0.5 * beta * h * np.array([[1.5, -2.0]]), rtol=1e-5)
  np.testing.assert_allclose(g.reshape(-1), [np.sqrt(beta * (1 - np.exp(-2 * big_b)) * h)],
                             rtol=1e-5)


def test_pc_sampler_starts_from_the_prior():
  # One Langevin corrector step with a tiny snr moves x_T by ~1e-6 of its size: the result is
  # x_T, whose standard deviation is the VE prior's σ_max = 50 within 4 SE (50/√(2n)).
  n, sde = 2048, SDES['ve']
  x_T = np.asarray(sde_lib.pc_sample(sde, exact_score(sde), (n, 2), jax.random.PRNGKey(0),
                                     num_steps=1, predictor=None, snr=1e-6), np.float64)
  assert np.all(np.abs(x_T.std(0) - 50.0) < 4 * 50.0 / np.sqrt(2 * n)), x_T.std(0)
  assert np.all(np.abs(x_T.mean(0)) < 4 * 50.0 / np.sqrt(n)), x_T.mean(0)


def test_min_pc_steps_keeps_beta_h_strictly_below_one_at_an_integer_boundary():
  # β(T)(T − ε) = 20 · 0.95 = 19 exactly: 19 steps give β(T) h = 1 (a DDPM step √(1 − β h) = 0
  # and a corrector α = 0), so 20 are needed.
  assert 20.0 * (1.0 - 0.05) == 19.0
  assert sde_lib.min_pc_steps(SDES['vp'], eps=0.05) == 20
  # Just below the boundary, 18.998: 19 steps give β(T) h = 0.99989 < 1.
  assert sde_lib.min_pc_steps(SDES['vp'], eps=0.0501) == 19


def test_pc_sampler_is_its_documented_steps():
  # Algorithm 1 written out for the VE SDE (f = 0): x_T ~ N(0, σ_max² I) from fold_in(key, N);
  # at t_i = T − i h the corrector (keyed by the first of split(fold_in(key, i))), then the
  # reverse-diffusion predictor from t_i to t_i − h, written out with the second key:
  #   mean = x + G² s(x, t_i),  G² = σ(t_i)² − σ(t_i − h)²,  x = mean + G z;
  # the sample is the last predictor's mean. A sampler that gave the corrector and the
  # predictor one key, drew x_T with step 0's key, returned the last step with its noise, or
  # stepped from t_i − h instead of t_i fails this test; the moment tests above miss them.
  sde, key, shape, steps, eps, snr = SDES['ve'], jax.random.PRNGKey(3), (3, 2), 3, 1e-3, 0.16
  score = exact_score(sde)
  sigma = lambda t: 0.01 * (50.0 / 0.01) ** t
  h = (1.0 - eps) / steps

  @jax.jit
  def both():
    x = 50.0 * jax.random.normal(jax.random.fold_in(key, steps), shape)
    for i in range(steps):
      t = 1.0 - i * h
      corrector_key, predictor_key = jax.random.split(jax.random.fold_in(key, i))
      x, _ = sde_lib.langevin_corrector(sde, score, x, t, h, corrector_key, snr, 1)
      g2 = sigma(t)**2 - sigma(t - h)**2
      mean = x + g2 * score(x, jnp.full(shape[:1], t, jnp.float32))
      x = mean + np.sqrt(g2) * jax.random.normal(predictor_key, shape)
    return sde_lib.pc_sample(sde, score, shape, key, num_steps=steps, snr=snr, eps=eps), mean

  sampled, by_hand = both()
  # Samples of size ~1 after steps of size ~50: float32 differences measured ≤ 2e-6.
  np.testing.assert_allclose(sampled, by_hand, rtol=1e-4, atol=1e-4)


def test_dsm_loss_draws_t_uniformly_from_eps_to_t():
  # t ~ U(ε, T): with ε = 0.5 no draw may fall below 0.5 (a loss that ignored ε and drew
  # t ~ U(0, T) puts half its draws there), and the draws fill [0.5, 1]. The score is
  # called eagerly here, so it can record the t it is given.
  called = []
  score = lambda x, t_B: called.append(np.asarray(t_B)) or jnp.zeros_like(x)
  sde_lib.dsm_loss(SDES['vp'], score, jnp.zeros((4000, 2)), jax.random.PRNGKey(9), eps=0.5)
  (t,) = called
  assert t.shape == (4000,)
  assert t.min() >= 0.5 and t.max() <= 1.0, (t.min(), t.max())
  # Mean of U(0.5, 1) is 0.75, SE √(1/48 / 4000) = 0.0023.
  assert abs(t.mean() - 0.75) < 4 * np.sqrt(1 / 48 / 4000), t.mean()
  assert t.min() < 0.51 and t.max() > 0.99


def test_rademacher_probes_are_exact_for_a_diagonal_jacobian_and_gaussian_ones_are_not():
  # Independent Gaussian data: the VP flow f̃ is affine with a diagonal Jacobian J, so a
  # Rademacher probe gives vᵀ J v = Σ_d J_dd v_d² = tr J exactly and every copy equals the
  # exact-divergence log-likelihood; a Gaussian probe gives Σ_d J_dd v_d², which varies from
  # copy to copy. Swapping the two kinds of probe passed the unbiasedness test above.
  sde, copies = SDES['vp'], 64
  x = jnp.broadcast_to(jnp.array([0.9, -1.4]), (copies, 2))
  log_p = jax.jit(lambda x, key: {probe: sde_lib.ode_log_likelihood(
      sde, exact_score(sde), x, key, num_steps=20, probe=probe) for probe in sde_lib.PROBES} | {
          'exact': sde_lib.ode_log_likelihood(sde, exact_score(sde), x[:1], None, 20,
                                              divergence='exact')})(x, jax.random.PRNGKey(10))
  exact = float(log_p['exact'][0])
  # float32 solves of the same ODE: measured ≤ 1.2e-7 apart; the Gaussian probes' spread
  # measured 1.3.
  np.testing.assert_allclose(log_p['rademacher'], exact, rtol=0, atol=1e-4)
  assert np.std(np.asarray(log_p['gaussian'])) > 0.1, log_p['gaussian']


@pytest.mark.parametrize('spacing', sde_lib.TIME_GRIDS)
def test_time_grid_has_num_steps_plus_one_times_from_eps_to_t(spacing):
  # num_steps steps need num_steps + 1 times: uniform t_i = ε + i (T − ε)/N, log
  # t_i = ε (T/ε)^{i/N}. A grid of N times takes one step fewer than asked.
  eps, end, steps = 1e-3, 1.0, 4
  grid = sde_lib.time_grid(eps, end, steps, spacing)
  i = np.arange(steps + 1)
  expected = (eps + i * (end - eps) / steps if spacing == 'uniform'
              else eps * (end / eps)**(i / steps))
  np.testing.assert_allclose(grid, expected, rtol=1e-12)


def test_prior_log_probs_sum_over_every_trailing_axis():
  # log N(z; 0, v I) of examples [B, 2, 3] has D = 6 in its normaliser: one that counted only
  # the last axis (D = 3) passed every test on [B, 2] data.
  z = np.random.default_rng(11).normal(size=(4, 2, 3)).astype(np.float32)
  for name, variance in (('vp', 1.0), ('subvp', 1.0), ('ve', 50.0**2)):
    np.testing.assert_allclose(SDES[name].prior_log_prob(jnp.asarray(z)),
                               gaussian_log_prob(z.reshape(4, 6), 0.0, variance), rtol=1e-5,
                               err_msg=name)


def test_euler_maruyama_predictor_is_its_documented_step():
  # x ← x − [f(x, t) − g(t)² s(x, t)] dt + g(t) √dt z with sub-VP's f = −½β(t)x and
  # g² = β(t)(1 − e^{−2B(t)}) written out, and the mean returned without the noise. The
  # samplers return the last mean: a predictor that returned its noisy x as the mean passed
  # the moment tests, its last noise g(ε) √h being small; so did the score taken at t − dt.
  sde, t, dt, key = SDES['subvp'], 0.4, 0.02, jax.random.PRNGKey(3)
  x0 = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (3, 2)), np.float64)
  score = lambda x, t: -0.8 * x + 2.0 * t
  x, mean = sde_lib.euler_maruyama_predictor(sde, lambda x, t_B: score(x, t_B[:, None]),
                                             jnp.asarray(x0, jnp.float32), t, dt, key)
  beta, big_b = 0.1 + t * (20.0 - 0.1), 0.1 * t + 0.5 * t**2 * (20.0 - 0.1)
  g2 = beta * (1 - np.exp(-2 * big_b))
  ref_mean = x0 - (-0.5 * beta * x0 - g2 * score(x0, t)) * dt
  z = np.asarray(jax.random.normal(key, x0.shape), np.float64)
  np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(x, ref_mean + np.sqrt(g2 * dt) * z, rtol=1e-5, atol=1e-6)


def test_pc_sampler_takes_the_corrector_steps_it_is_given():
  # corrector_steps = 3 Langevin steps at t = T: with the corrector alone and one step the
  # sample is `langevin_corrector` (checked against Algorithm 4 above) with n_steps = 3 from
  # x_T, keyed as in the documented-steps test. A sampler that always took one corrector step
  # passed the moment tests.
  sde, key, shape, snr = SDES['ve'], jax.random.PRNGKey(7), (3, 2), 0.16
  score = exact_score(sde)

  @jax.jit
  def both():
    x_T = 50.0 * jax.random.normal(jax.random.fold_in(key, 1), shape)
    corrector_key, _ = jax.random.split(jax.random.fold_in(key, 0))
    return (sde_lib.pc_sample(sde, score, shape, key, num_steps=1, predictor=None, snr=snr,
                              corrector_steps=3),
            sde_lib.langevin_corrector(sde, score, x_T, 1.0, 1 - 1e-3, corrector_key, snr, 3)[1])

  sampled, by_hand = both()
  np.testing.assert_allclose(sampled, by_hand, rtol=1e-4, atol=1e-4)


def test_samplers_default_to_the_settings_of_their_signatures():
  # pc_sample: reverse diffusion and one Langevin step of snr 0.16 down to ε = 1e-3;
  # ode_sample: 100 RK4 steps on the uniform grid down to ε = 1e-3. A changed default (Heun,
  # snr 0.1) passed every test, which all give these arguments.
  sde, key, shape = SDES['ve'], jax.random.PRNGKey(4), (3, 2)
  score = exact_score(sde)
  pc = lambda key, **kw: sde_lib.pc_sample(sde, score, shape, key, num_steps=3, **kw)
  ode = lambda key, **kw: sde_lib.ode_sample(sde, score, shape, key, **kw)
  np.testing.assert_array_equal(pc(key), pc(key, predictor='reverse_diffusion',
                                           corrector='langevin', snr=0.16, corrector_steps=1,
                                           eps=1e-3))
  np.testing.assert_array_equal(ode(key), ode(key, num_steps=100, method='rk4', eps=1e-3,
                                             spacing='uniform'))
