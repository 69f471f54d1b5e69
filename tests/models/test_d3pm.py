"""D3PM (Austin et al. 2021) against references written out here in float64 numpy: transition
matrices from their entry-wise definitions and multiplied step by step, Bayes' rule summed over
x_{t−1}, eq. 4 summed over x̃_0, and the negative ELBO over every trajectory x_1 … x_T; sampled
frequencies and Monte-Carlo losses against their exact values within standard-error bounds."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from models.generative import d3pm

K, T = 4, 6
KINDS = d3pm.KINDS


def key(seed):
  # RngBitGenerator keys: on the CPU, XLA compiles threefry's random bits in ~1 s per program,
  # these in ~0.2 s. The module takes keys of any implementation.
  return jax.random.key(seed, impl='rbg')


def reference_step_matrix(kind, num_classes, beta):
  """[Q_t]_ij from the entry-wise definitions: uniform 1 − (K−1)β/K on the diagonal and β/K
  off it; absorbing 1 − β on the diagonal, β into the last (mask) column, the mask stays."""
  if kind == 'uniform':
    q = np.full((num_classes, num_classes), beta / num_classes)
    np.fill_diagonal(q, 1 - (num_classes - 1) * beta / num_classes)
  else:
    q = np.diag(np.full(num_classes, 1 - beta))
    q[:, -1] += beta
  return q


def reference_betas(kind, num_steps):
  """β_1 … β_T: 1/(T − t + 1) for absorbing, 1 − f(t)/f(t − 1) from the cosine f for uniform."""
  t = np.arange(1, num_steps + 1)
  if kind == 'absorbing':
    return 1 / (num_steps - t + 1)
  f = lambda t: np.cos((t / num_steps + 0.008) / 1.008 * np.pi / 2) ** 2
  return 1 - f(t) / f(t - 1)


def reference_matrices(kind, num_classes, betas):
  """[Q_0 = I, Q_1 … Q_T] and [Q̄_0 … Q̄_T] by explicit products."""
  steps = [np.eye(num_classes)] + [reference_step_matrix(kind, num_classes, b) for b in betas]
  cumulative = [np.eye(num_classes)]
  for q in steps[1:]:
    cumulative.append(cumulative[-1] @ q)
  return steps, cumulative


def stationary(kind, num_classes):
  return (np.full(num_classes, 1 / num_classes) if kind == 'uniform'
          else np.eye(num_classes)[-1])


def chi_square_p_value(samples, probs):
  """p-value of Pearson's chi-square test of integer samples against probs; categories with
  zero probability must not occur at all."""
  counts = np.bincount(np.asarray(samples).ravel(), minlength=len(probs))
  support = probs > 0
  assert counts[~support].sum() == 0, (counts, probs)
  expected = counts.sum() * probs[support]
  statistic = np.sum((counts[support] - expected) ** 2 / expected)
  return special.chdtrc(support.sum() - 1, statistic) if support.sum() > 1 else 1.0


@pytest.mark.parametrize('kind', KINDS)
def test_schedules_and_closed_form_cumulative_matrix(kind):
  with jax.enable_x64(True):
    matrices = jax.jit(lambda schedule, t: (
        d3pm.one_step_matrix(schedule, t), d3pm.cumulative_matrix(schedule, t),
        d3pm.q_probs(schedule, jnp.arange(K)[:, None], t)[:, 0]))
    for betas in (None, np.linspace(0.05, 0.3, T)):
      schedule = d3pm.make_schedule(kind, K, T, betas)
      expected_betas = reference_betas(kind, T) if betas is None else betas
      np.testing.assert_allclose(schedule.betas[1:], expected_betas, rtol=1e-13, atol=1e-15)
      steps, cumulative = reference_matrices(kind, K, expected_betas)
      for t in range(T + 1):
        q_t, q_bar_t, q_x0 = matrices(schedule, t)
        # float64: measured differences ≤ 4.4e−16.
        np.testing.assert_allclose(q_t, steps[t], rtol=0, atol=1e-13, err_msg=f't={t}')
        np.testing.assert_allclose(q_bar_t, cumulative[t], rtol=0, atol=1e-13, err_msg=f't={t}')
        for matrix in (q_t, q_bar_t):
          assert np.all(np.asarray(matrix) >= 0)
          np.testing.assert_allclose(np.sum(matrix, axis=1), 1.0, rtol=0, atol=1e-13)
        # q(x_t | x_0) is the row x_0 of Q̄_t.
        np.testing.assert_allclose(q_x0, cumulative[t], rtol=0, atol=1e-13)
    schedule = d3pm.make_schedule(kind, K, T)
    if kind == 'absorbing':  # ᾱ_t = 1 − t/T
      np.testing.assert_allclose(schedule.alpha_bars, 1 - np.arange(T + 1) / T, atol=1e-15)
    else:  # ᾱ_t = f(t)/f(0), 0 at t = T
      f = lambda t: np.cos((t / T + 0.008) / 1.008 * np.pi / 2) ** 2
      np.testing.assert_allclose(schedule.alpha_bars, f(np.arange(T + 1)) / f(0), atol=1e-15)
      np.testing.assert_allclose(schedule.one_minus_alpha_bars, 1 - f(np.arange(T + 1)) / f(0),
                                 rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize('kind', KINDS)
def test_posterior_is_bayes_rule_by_brute_force(kind):
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    schedule = d3pm.make_schedule(kind, K, T)
    steps, cumulative = reference_matrices(kind, K, reference_betas(kind, T))
    batch, width = 16, 3
    data_classes = K if kind == 'uniform' else K - 1
    x0 = rng.integers(0, data_classes, (batch, width))
    t = rng.integers(1, T + 1, batch)
    x_t = np.array([[rng.choice(K, p=cumulative[t[b]][x0[b, i]]) for i in range(width)]
                    for b in range(batch)])
    posterior = np.exp(jax.jit(d3pm.q_posterior_logits)(schedule, x0, x_t, t))
    for b, i in itertools.product(range(batch), range(width)):
      # q(x_{t−1} = j | x_t, x_0) = q(x_t | x_{t−1} = j) q(x_{t−1} = j | x_0) / Σ_j (same).
      joint = np.array([steps[t[b]][j, x_t[b, i]] * cumulative[t[b] - 1][x0[b, i], j]
                        for j in range(K)])
      # float64: measured differences ≤ 7.8e−16.
      np.testing.assert_allclose(posterior[b, i], joint / joint.sum(), rtol=0, atol=1e-13)


def perfect_logits(x0):
  """Logits of x_0 that put all but e^{−40} ≈ 4e−18 of the mass on the true x_0."""
  return 40.0 * jax.nn.one_hot(x0, K, dtype=jnp.float64)


@pytest.mark.parametrize('kind', KINDS)
def test_perfect_predictor_gives_the_true_posterior(kind):
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    schedule = d3pm.make_schedule(kind, K, T)
    x0 = rng.integers(0, K - 1, (T, 5))
    t = np.arange(1, T + 1)  # every step, t = 1 included
    fns = jax.jit(lambda schedule, x0, x_t, t: (
        d3pm.p_logits(schedule, x_t, t, perfect_logits(x0)),
        d3pm.q_posterior_logits(schedule, x0, x_t, t),
        d3pm.vb_term(schedule, x0, x_t, t, perfect_logits(x0)),
        d3pm.x0_cross_entropy(x0, perfect_logits(x0))))
    x_t = jax.jit(d3pm.q_sample)(key(0), schedule, x0, t)
    log_p, log_q, vb, ce = fns(schedule, x0, x_t, t)
    # Wrong classes carry K·e^{−40} ≈ 1.3e−17; measured ≤ 1.4e−18, and 0.0 for vb and ce.
    np.testing.assert_allclose(np.exp(log_p), np.exp(log_q), rtol=0, atol=1e-15)
    np.testing.assert_array_less(np.abs(vb), 1e-15)
    np.testing.assert_array_less(ce, 1e-15)


@pytest.mark.parametrize('kind', KINDS)
def test_vb_terms_sum_to_the_negative_elbo_over_all_trajectories(kind):
  # −ELBO = E_{q(x_{1:T}|x_0)}[log q(x_{1:T}|x_0) − log p(x_T) − Σ_t log p_θ(x_{t−1}|x_t)],
  # enumerated over all K^T trajectories, with p_θ from eq. 4 summed over x̃_0 here; the
  # module's L_T + Σ_t E_{x_t}[L_{t−1}] must equal it for ANY predictor (here a random table
  # of logits for each (t, x_t)). The uniform schedule keeps ᾱ_T > 0 so that L_T ≠ 0.
  num_classes, num_steps = 3, 3
  rng = np.random.default_rng(2)
  logits_TxKxK = rng.normal(size=(num_steps + 1, num_classes, num_classes)) * 2
  betas = reference_betas(kind, num_steps) if kind == 'absorbing' else np.array([0.1, 0.3, 0.2])
  steps, cumulative = reference_matrices(kind, num_classes, betas)
  prior = stationary(kind, num_classes)

  def p_theta(t, x_t):
    """p_θ(x_{t−1} | x_t) ∝ Σ_{x̃0} p̃(x̃0) q(x_{t−1}, x_t | x̃0), by a sum over x̃0."""
    p_tilde = np.exp(logits_TxKxK[t, x_t]) / np.exp(logits_TxKxK[t, x_t]).sum()
    p = np.array([sum(p_tilde[x] * cumulative[t - 1][x, j] * steps[t][j, x_t]
                      for x in range(num_classes)) for j in range(num_classes)])
    return p / p.sum()

  with jax.enable_x64(True):
    schedule = d3pm.make_schedule(kind, num_classes, num_steps, betas)
    vb_term = jax.jit(d3pm.vb_term)
    # Per x_0: the exact −ELBO, and E_t E_{x_t}[L_{t−1} + λ CE] for t ~ U{1 … T}, λ = 0.5.
    exact_elbo, exact_hybrid = np.zeros(2), np.zeros(2)
    for x0 in range(2):
      expected = 0.0
      for path in itertools.product(range(num_classes), repeat=num_steps):
        xs = (x0,) + path
        q = np.prod([steps[t][xs[t - 1], xs[t]] for t in range(1, num_steps + 1)])
        if q > 0:
          log_p = np.log(prior[xs[-1]]) + sum(np.log(p_theta(t, xs[t])[xs[t - 1]])
                                              for t in range(1, num_steps + 1))
          expected += q * (np.log(q) - log_p)
      x0_Kx1 = np.full((num_classes, 1), x0)
      x_t_Kx1 = np.arange(num_classes)[:, None]
      total = float(jax.jit(d3pm.prior_kl)(schedule, x0_Kx1)[0])
      for t in range(1, num_steps + 1):
        terms = vb_term(schedule, x0_Kx1, x_t_Kx1, t, jnp.asarray(logits_TxKxK[t][:, None]))
        weights = cumulative[t][x0]  # q(x_t | x_0); impossible x_t (NaN posterior) weigh 0
        vb = np.sum(np.where(weights > 0, weights * np.asarray(terms), 0))
        log_p_tilde = logits_TxKxK[t] - np.log(np.exp(logits_TxKxK[t]).sum(-1, keepdims=True))
        total += vb
        exact_hybrid[x0] += (vb - 0.5 * np.sum(weights * log_p_tilde[:, x0])) / num_steps
      assert expected > 0.1
      # float64: measured difference 8.9e−16 (relative 4.5e−16).
      np.testing.assert_allclose(total, expected, rtol=1e-12, err_msg=f'x0={x0}')
      exact_elbo[x0] = expected

    # The sampling estimates draw t and x_t themselves and call the predictor with them.
    x0_Nx1 = np.tile([0, 1], 2000)[:, None]
    table = jnp.asarray(logits_TxKxK)
    logits_fn = lambda x_t, t: table[t[:, None], x_t]
    estimates = jax.jit(lambda rng, schedule: (
        d3pm.negative_elbo(rng, schedule, logits_fn, x0_Nx1),
        d3pm.hybrid_loss(jax.random.fold_in(rng, 1), schedule, logits_fn, x0_Nx1, 0.5)))(
            key(13), schedule)
    for estimate_N, exact in zip(estimates, (exact_elbo, exact_hybrid)):
      residual_N = np.asarray(estimate_N) - exact[x0_Nx1[:, 0]]
      standard_error = residual_N.std() / np.sqrt(len(residual_N))
      # 4 standard errors of a mean of 4000 (SE ≈ 0.02 nats); measured ≤ 0.85 SE.
      assert abs(residual_N.mean()) < 4 * standard_error, (residual_N.mean(), standard_error)


def test_perfect_predictor_bound_is_the_prior_term():
  # Every L_{t−1} (t = 1 the reconstruction) vanishes, leaving L_T = KL(q(x_T|x_0) ‖ 1/K),
  # written out for Q̄_T: a = ᾱ_T + (1 − ᾱ_T)/K at x_0 and b = (1 − ᾱ_T)/K elsewhere.
  betas = np.full(T, 0.1)
  alpha_bar = 0.9 ** T
  a, b = alpha_bar + (1 - alpha_bar) / K, (1 - alpha_bar) / K
  expected = a * np.log(a * K) + (K - 1) * b * np.log(b * K)
  x0 = np.random.default_rng(3).integers(0, K, (4, 3))
  with jax.enable_x64(True):
    schedule = d3pm.make_schedule('uniform', K, T, betas)
    bound = jax.jit(lambda key, schedule, x0: d3pm.negative_elbo(
        key, schedule, lambda x_t, t: perfect_logits(x0), x0))(key(4), schedule, x0)
    # float64: measured 3.3e−16 apart (relative 9.5e−16).
    np.testing.assert_allclose(bound, expected, rtol=1e-12)
    prior_kl = jax.jit(d3pm.prior_kl)
    np.testing.assert_allclose(prior_kl(schedule, x0), expected, rtol=1e-12)
    assert expected > 0.3
    # Both default schedules end at ᾱ_T = 0, where q(x_T | x_0) is the prior itself.
    for kind in KINDS:
      np.testing.assert_allclose(prior_kl(d3pm.make_schedule(kind, K, T), x0 % (K - 1)),
                                 0.0, atol=1e-15)


def test_absorbing_masks_a_fraction_t_over_t_max():
  schedule = d3pm.make_schedule('absorbing', K, T)
  x0 = np.random.default_rng(5).integers(0, K - 1, (T + 1, 3000))
  t = np.arange(T + 1)
  x_t = np.asarray(jax.jit(d3pm.q_sample)(key(6), schedule, x0, t))
  masked = x_t == K - 1
  np.testing.assert_array_equal(x_t[~masked], x0[~masked])  # a token is kept or masked
  assert masked[T].all() and not masked[0].any()
  for step in range(1, T):
    p = step / T
    standard_error = np.sqrt(p * (1 - p) / x0.shape[1])
    # 4 standard errors of a binomial fraction; measured ≤ 2.0 SE.
    assert abs(masked[step].mean() - p) < 4 * standard_error, (step, masked[step].mean())


def test_uniform_q_sample_draws_from_q_probs():
  schedule = d3pm.make_schedule('uniform', K, T)
  steps, cumulative = reference_matrices('uniform', K, reference_betas('uniform', T))
  q_sample = jax.jit(d3pm.q_sample)
  for t in (1, 3, 5):
    x_t = q_sample(key(t), schedule, jnp.full((4000,), 2), t)
    # 3 draws at level 1e−4 each; measured p-values ≥ 0.29.
    assert chi_square_p_value(x_t, cumulative[t][2]) > 1e-4, t


def test_sampler_with_an_oracle_has_the_forward_marginals():
  # A predictor that always returns the data distribution π makes p_θ(x_{t−1}|x_t) the exact
  # reverse of the forward chain started from x_0 ~ π; since ᾱ_T = 0, x_T ~ m = πQ̄_T, and every
  # x_t must have the marginal πQ̄_t = ᾱ_t π + (1 − ᾱ_t) m, x_0 in particular π.
  pi = np.array([0.1, 0.2, 0.3, 0.4])
  schedule = d3pm.make_schedule('uniform', K, T)
  log_pi = jnp.log(jnp.asarray(pi, jnp.float32))
  logits_fn = lambda x_t, t: jnp.broadcast_to(log_pi, x_t.shape + (K,))
  xs = jax.jit(lambda rng: d3pm.sample(rng, schedule, logits_fn, (20, 150), trajectory=True))(
      key(7))
  assert xs.shape == (T + 1, 20, 150) and xs.dtype == jnp.int32
  _, cumulative = reference_matrices('uniform', K, reference_betas('uniform', T))
  for t in range(T + 1):
    # 7 tests at level 1e−4 each; measured p-values ≥ 0.04.
    assert chi_square_p_value(xs[t], pi @ cumulative[t]) > 1e-4, t


def test_absorbing_sampler_unmasks_a_fraction_one_over_t_max_per_step():
  # The reverse of ᾱ_t = 1 − t/T unmasks a masked token at step t with probability
  # (ᾱ_{t−1} − ᾱ_t)/(1 − ᾱ_t) = 1/t, so a fraction t/T stays masked in x_t, and the token it
  # unmasks into is drawn from p̃_θ(x_0 | x_t, t). The predictor here is sure of a category c(t)
  # that depends on t only, so every token unmasked at step t must be c(t).
  category_T = jnp.array([0, 0, 0, 1, 1, 2, 2])  # c(t), t = 0 … T
  logits_fn = lambda x_t, t: jnp.broadcast_to(40.0 * jax.nn.one_hot(category_T[t], K)[:, None],
                                               x_t.shape + (K,))
  schedule = d3pm.make_schedule('absorbing', K, T)
  xs = np.asarray(jax.jit(lambda rng: d3pm.sample(rng, schedule, logits_fn, (20, 150),
                                                   trajectory=True))(key(8)))
  masked = xs == K - 1
  assert masked[T].all() and not masked[0].any()
  assert (masked[1:] >= masked[:-1]).all()  # once unmasked, a token stays
  for t in range(1, T + 1):
    unmasked_now = masked[t] & ~masked[t - 1]
    np.testing.assert_array_equal(xs[t - 1][unmasked_now], category_T[t])
    p = t / T
    # 4 binomial standard errors; measured ≤ 2.0 SE.
    assert abs(masked[t].mean() - p) <= 4 * np.sqrt(p * (1 - p) / masked[t].size), t


@pytest.mark.parametrize('mask_logit', [None, -np.inf])
def test_absorbing_loss_gradients_are_finite_at_every_step(mask_logit):
  # log 0 of the absorbing state must not leak NaN into the gradient, also at t = 1 and t = T,
  # also for a predictor that rules out the mask as x_0 (a logit of −∞): at t = 1 both terms
  # of ᾱ_0 p̃ + (1 − ᾱ_0) m are then 0 at the mask, and log(e^{−∞} + e^{−∞})'s gradient NaN.
  schedule = d3pm.make_schedule('absorbing', K, T)
  x0 = jnp.asarray(np.random.default_rng(10).integers(0, K - 1, (T, 7)))
  t = jnp.arange(1, T + 1)
  table_KxK = jnp.asarray(np.random.default_rng(12).normal(size=(K, K)), jnp.float32)

  def loss(table_KxK):
    x_t = d3pm.q_sample(key(11), schedule, x0, t)
    logits = table_KxK[x_t]
    if mask_logit is not None:
      logits = logits.at[..., K - 1].set(mask_logit)
    return jnp.sum(d3pm.vb_term(schedule, x0, x_t, t, logits)
                   + d3pm.DEFAULT_HYBRID_WEIGHT * d3pm.x0_cross_entropy(x0, logits))

  value, grad = jax.jit(jax.value_and_grad(loss))(table_KxK)
  assert np.isfinite(value) and np.isfinite(grad).all() and np.abs(grad).sum() > 0


def test_bad_arguments_raise():
  schedule = d3pm.make_schedule('uniform', K, T)
  cases = [(lambda: d3pm.make_schedule('gaussian', K, T), "kind='gaussian'"),
           (lambda: d3pm.make_schedule('uniform', 1, T), 'num_classes=1'),
           (lambda: d3pm.make_schedule('uniform', K, 0), 'num_steps=0'),
           (lambda: d3pm.make_schedule('uniform', K, 2, [0.5, 1.5]), 'betas must be 2 values'),
           (lambda: d3pm.make_schedule('uniform', K, 2, [0.5]), 'betas must be 2 values'),
           (lambda: d3pm.p_logits(schedule, jnp.zeros((2, 3), int), 1, jnp.zeros((2, 3, K + 1))),
            r'x0 logits of shape \(2, 3, 5\)'),
           (lambda: d3pm.q_probs(schedule, jnp.zeros((2, 3), int), jnp.ones(3, int)),
            r't of shape \(3,\)'),
           (lambda: d3pm.hybrid_loss(key(0), schedule, None, jnp.zeros((2,), int), -1.0),
            'hybrid_weight=-1.0'),
           (lambda: d3pm.sample(key(0), schedule, None, (0, 3)), r'shape=\(0, 3\)'),
           # Steps are 0 … T for q(x_t | x_0) and 1 … T for the posteriors: −1 read step T
           # and T + 1 nothing at all, without a word.
           (lambda: d3pm.q_probs(schedule, jnp.zeros((2,), int), -1),
            rf'Steps t=-1 must be integers from 0 to {T}\.'),
           (lambda: d3pm.q_probs(schedule, jnp.zeros((2,), int), T + 1),
            rf'Steps t={T + 1} must be integers from 0 to {T}\.'),
           (lambda: d3pm.q_posterior_logits(schedule, jnp.zeros((2,), int), jnp.zeros((2,), int),
                                            0), rf'Steps t=0 must be integers from 1 to {T}\.'),
           (lambda: d3pm.p_logits(schedule, jnp.zeros((2,), int), 1.5, jnp.zeros((2, K))),
            rf'Steps t=1.5 must be integers from 1 to {T}\.')]
  for make, message in cases:
    with pytest.raises(ValueError, match=message):
      make()


@pytest.mark.parametrize('kind', [np.int64, bool, float])
def test_step_counts_may_be_numpy_integers_but_not_bools_or_floats(kind):
  # A NumPy integer (np.arange's, a config's) was refused as "must be a positive integer".
  make = lambda n: d3pm.make_schedule('uniform', 2, n)
  if kind is np.int64:
    jax.tree.map(np.testing.assert_array_equal, make(kind(10)), make(10))
  else:
    with pytest.raises(ValueError, match=rf'^num_steps={kind(10)!r} must be a positive integer\.$'):
      make(kind(10))


def test_a_traced_step_outside_zero_to_t_gives_nan():
  schedule = d3pm.make_schedule('uniform', K, T)
  probs = jax.jit(lambda t_B: d3pm.q_probs(schedule, jnp.zeros((3,), int), t_B))(
      jnp.array([-1, 0, T + 1]))
  assert np.all(np.isnan(probs[0])) and np.all(np.isnan(probs[2]))
  np.testing.assert_array_equal(probs[1], np.eye(K)[0])  # q(x_0 | x_0) at t = 0


def test_one_minus_alpha_bar_keeps_its_digits_for_tiny_betas():
  # β_t = 1e−10: 1 − ᾱ_t = 1 − (1 − 1e−10)^t ≈ t·1e−10 (to 1e−10 relative), which 1 − ᾱ_t
  # computed from ᾱ_t in float64 gets only to ~1e−6.
  with jax.enable_x64(True):
    schedule = d3pm.make_schedule('uniform', K, 3, np.full(3, 1e-10))
    np.testing.assert_allclose(schedule.one_minus_alpha_bars, np.arange(4) * 1e-10, rtol=1e-9,
                               atol=0)


def test_hybrid_loss_defaults_to_lambda_0_01():
  # L_λ = L_vb term + λ·CE with λ = 0.01 (Austin et al. 2021) unless given: with one key the
  # loss is affine in λ, so L_default = L_0 + 0.01 (L_1 − L_0).
  schedule = d3pm.make_schedule('uniform', K, T)
  x0 = jnp.asarray(np.random.default_rng(14).integers(0, K, (8, 3)))
  logits_fn = lambda x_t, t: jax.nn.one_hot(x_t, K) * 2.0 + 0.1 * t[:, None, None]
  loss = lambda *weight: d3pm.hybrid_loss(key(15), schedule, logits_fn, x0, *weight)
  default, at_0, at_1 = jax.jit(lambda: (loss(), loss(0.0), loss(1.0)))()
  assert np.all(np.asarray(at_1 - at_0) > 0.1)  # the cross-entropy term is not negligible
  np.testing.assert_allclose(default, at_0 + 0.01 * (at_1 - at_0), rtol=1e-6, atol=1e-7)
