"""The 'autoencoder' and 'vae' tasks against independent references: the sparsity penalty
against a loop over units, the contraction penalty against ‖jax.jacrev(encode)‖²_F, the
corruption's statistics, the IWAE bound against a Monte-Carlo ELBO, its monotonicity in K and
the exact log-likelihood of a linear-Gaussian model; and the sparse autoencoder trained in every
parallel mode on 8 simulated devices against one device."""

import concurrent.futures
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from models import registry
from models.generative import autoencoders
from train import step, tasks
from train.state import init_train_state
from train.tasks import base
from tests.models.test_autoencoders import SHAPE, images
from tests.subprocess_util import run_python
from tests.messages import one_sentence

B = 6  # examples per test batch


def _totals(metrics):
  return {name: np.asarray(total, np.float64) for name, (total, _) in metrics.items()}


def _bind(module, params, rngs=None, train=False):
  return base.BoundModel(module, params, {}, rngs or {}, train=train, axis_name=None)


def _random_params(model, inputs, scale=1.0, seed=0, **init_kwargs):
  """Parameters of `model` drawn from N(0, (scale/√fan_in)²) by numpy (no init to compile)."""
  shapes = jax.eval_shape(lambda: model.init(init_kwargs.pop('rngs', jax.random.PRNGKey(0)),
                                             inputs, **init_kwargs))['params']
  rng = np.random.default_rng(seed)
  draw = lambda a: jnp.asarray(rng.normal(size=a.shape) * scale / math.sqrt(
      a.shape[0] if a.ndim == 2 else 1), jnp.float32)
  return jax.tree.map(draw, shapes)


@pytest.fixture(scope='module')
def contractive():
  model = registry.build('contractive_autoencoder', image_shape=SHAPE, latent_dim=5)
  return model, _random_params(model, images(B))


# Autoencoder -----------------------------------------------------------------------------


def test_reconstruction_and_sparsity_penalty_equal_a_loop_over_units(contractive):
  model, params = contractive
  task = tasks.build('autoencoder', sparsity_target=0.2, sparsity_weight=3.0)
  x = images(B)
  # Evaluation: example 5 is padding (mask 0) and must not count in ρ̂.
  batch = task.transform({}, {'input': x, 'mask': jnp.array([1, 1, 1, 1, 1, 0])}, False)
  totals = _totals(jax.jit(task.loss, static_argnums=0)(_bind(model, params), batch))
  logits, h = (np.asarray(a, np.float64) for a in model.apply({'params': params}, x))
  rho, penalty, real_examples = 0.2, 0.0, range(5)
  for j in range(model.latent_dim):
    rho_hat = sum(h[b, j] for b in real_examples) / len(real_examples)
    penalty += rho * math.log(rho / rho_hat) + (1 - rho) * math.log((1 - rho) / (1 - rho_hat))
  p, target = 1 / (1 + np.exp(-logits)), np.asarray(x, np.float64)
  cross_entropy = -(target * np.log(p) + (1 - target) * np.log(1 - p)).reshape(B, -1).sum(1)
  # float32 sums of 12 and 5 terms: the largest relative difference measured is 1.2e-7.
  np.testing.assert_allclose(totals['sparsity_penalty'], 3.0 * penalty, rtol=1e-5)
  np.testing.assert_allclose(totals['reconstruction'], cross_entropy, rtol=1e-5)
  np.testing.assert_allclose(totals['loss'], cross_entropy + 3.0 * penalty, rtol=1e-5)
  squared = tasks.build('autoencoder', reconstruction='squared_error')
  totals = _totals(squared.loss(_bind(model, params), squared.transform({}, {'input': x}, False)))
  np.testing.assert_allclose(totals['loss'], ((p - target) ** 2).reshape(B, -1).sum(1), rtol=1e-5)
  assert 'sparsity_penalty' not in totals and 'contraction_penalty' not in totals


def test_contraction_penalty_equals_the_jacobian_norm_and_its_gradient(contractive):
  model, params = contractive
  # Weights of size ~3/√D, so the sigmoid's slope differs between units and examples.
  params = jax.tree.map(lambda p: 3 * p, params)
  task = tasks.build('autoencoder', contraction_weight=0.5)
  x = images(B)

  def closed_form(params):
    return task.loss(_bind(model, params), {'input': x, 'target': x})['contraction_penalty'][0]

  def brute_force(params):
    encode = lambda x_1: model.apply({'params': params}, x_1[None], method='encode')[0]
    jacobians_BxKxD = jax.vmap(jax.jacrev(encode))(x)
    return 0.5 * jnp.sum(jnp.square(jacobians_BxKxD.reshape(B, -1)), axis=1)

  @jax.jit
  def run(params):
    total = lambda fn: lambda p: jnp.sum(fn(p))
    return (closed_form(params), brute_force(params), jax.grad(total(closed_form))(params),
            jax.grad(total(brute_force))(params))

  penalty, reference, grads, reference_grads = run(params)
  # float32: the largest relative difference measured is 2.2e-7.
  np.testing.assert_allclose(penalty, reference, rtol=1e-5)
  assert np.ptp(np.asarray(reference)) > 0.1 * np.mean(reference)  # not a constant
  # The gradient through h and through W: the largest difference measured is 3e-8.
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


def test_penalties_need_a_model_they_apply_to():
  x = images(B)
  deep = registry.build('autoencoder', image_shape=SHAPE, latent_dim=3, hidden_sizes=(4,))
  linear_code = registry.build('autoencoder', image_shape=SHAPE, latent_dim=3,
                               code_activation='linear')
  for model, option, expected in ((deep, 'contraction_weight', 'hidden_sizes=(4,)'),
                                  (linear_code, 'sparsity_weight', "code_activation='linear'")):
    task = tasks.build('autoencoder', **{option: 1.0})
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)['params']
    message = one_sentence(lambda: jax.eval_shape(
        lambda p: task.loss(_bind(model, p), {'input': x}), params))
    assert 'Autoencoder' in message and expected in message


def test_each_task_refuses_the_other_family_of_model():
  # A VAE under the autoencoder task used to stop with Python's "too many values to unpack
  # (expected 2)", and an autoencoder under the vae task with an AttributeError.
  x = images(B)
  vae = registry.build('vae', image_shape=SHAPE, latent_dim=3)
  autoencoder = registry.build('autoencoder', image_shape=SHAPE, latent_dim=3)
  rngs = {'latent': jax.random.PRNGKey(1)}
  vae_params = jax.eval_shape(lambda: vae.init({'params': jax.random.PRNGKey(0), **rngs}, x))
  autoencoder_params = jax.eval_shape(autoencoder.init, jax.random.PRNGKey(0), x)
  one_sentence(lambda: jax.eval_shape(
      lambda p: tasks.build('autoencoder').loss(_bind(vae, p, rngs), {'input': x}),
      vae_params['params']),
      "task.name='autoencoder' needs a model that returns (logits, code), as the autoencoder "
      "models do, but VAE does not; a VAE trains with task.name='vae'.")
  one_sentence(lambda: jax.eval_shape(
      lambda p: tasks.build('vae').loss(_bind(autoencoder, p, rngs), {'input': x}),
      autoencoder_params['params']),
      "task.name='vae' needs a VAE model (model.name='vae'), but Autoencoder is not one; an "
      "autoencoder trains with task.name='autoencoder'.")


@pytest.mark.parametrize('options, expected', [
    (dict(corruption='salt'), "'salt'"),
    (dict(corruption='masking', noise_level=1.5), 'masking probability'),
    (dict(corruption='gaussian'), 'standard deviation'),
    (dict(noise_level=0.1), 'task.corruption'),
    (dict(sparsity_target=0.0), 'sparsity_target'),
    (dict(sparsity_weight=-1.0), 'sparsity_weight'),
    (dict(contraction_weight=float('inf')), 'contraction_weight'),
    # A zero or NaN scale trained on blank or NaN pixels without a word.
    (dict(input_scale=0.0), 'input_scale must be a finite positive number, got 0.0'),
    (dict(input_scale=float('nan')), 'input_scale must be a finite positive number, got nan'),
    (dict(reconstruction='l1'), 'bernoulli, squared_error'),
])
def test_autoencoder_options_are_checked(options, expected):
  assert expected in one_sentence(lambda: tasks.build('autoencoder', **options))


def test_preprocess_scales_the_pixels_by_input_scale():
  pixels = np.array([[0, 51, 255]], np.uint8)
  for options, expected in (({}, [0.0, 0.2, 1.0]), ({'input_scale': 0.5}, [0.0, 25.5, 127.5])):
    batch = tasks.build('autoencoder', **options).preprocess({'image': pixels})
    assert batch['input'].dtype == np.float32
    np.testing.assert_allclose(batch['input'], [expected], rtol=1e-6)


def test_corruption_comes_from_the_corruption_stream_in_training_only():
  x = jnp.ones((200,) + SHAPE)  # 2400 pixels
  key = jax.random.PRNGKey
  masking = tasks.build('autoencoder', corruption='masking', noise_level=0.3)
  gaussian = tasks.build('autoencoder', corruption='gaussian', noise_level=0.2)

  @jax.jit
  def corrupt(corruption_key, dropout_key):
    rngs = {'corruption': corruption_key, 'dropout': dropout_key}
    batch = {'input': x}
    return (masking.transform(rngs, batch, True), gaussian.transform(rngs, batch, True),
            masking.transform(rngs, batch, False))

  (masked, noisy, evaluated), (same, _, _), (other, _, _) = (
      corrupt(key(0), key(1)), corrupt(key(0), key(2)), corrupt(key(3), key(1)))
  for out in (masked, noisy, evaluated):
    np.testing.assert_array_equal(out['target'], x)  # the clean image stays the target
  np.testing.assert_array_equal(evaluated['input'], x)  # evaluation is not corrupted
  np.testing.assert_array_equal(same['input'], masked['input'])  # not the dropout stream
  assert not np.array_equal(other['input'], masked['input'])
  assert not np.array_equal(masked['input'][0], masked['input'][1])  # a mask per example
  kept = np.asarray(masked['input'])
  assert set(np.unique(kept)) == {0.0, 1.0}
  # Masked fraction ~ 0.3 ± √(0.3·0.7/2400) = 0.0094; measured 0.309.
  assert abs((kept == 0).mean() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / kept.size)
  # Gaussian noise: std 0.2 ± 0.2/√(2·2400) = 0.0029 (measured 0.2013), mean 0 ± 0.2/√2400
  # = 0.0041 (measured −0.0032).
  noise = np.asarray(noisy['input'], np.float64) - 1
  assert abs(noise.std() - 0.2) < 4 * 0.2 / math.sqrt(2 * noise.size)
  assert abs(noise.mean()) < 4 * 0.2 / math.sqrt(noise.size)


def test_a_denoising_autoencoder_reconstructs_the_clean_image_from_the_corrupted_one(contractive):
  """R(x, σ(logits(x̃))): the model reads the corrupted x̃, the loss compares with the clean x."""
  model, params = contractive
  task = tasks.build('autoencoder', corruption='masking', noise_level=0.5)
  x = images(B)
  batch = task.transform({'corruption': jax.random.PRNGKey(0)}, {'input': x}, True)
  corrupted = np.asarray(batch['input'])
  assert not np.array_equal(corrupted, x)
  totals = _totals(task.loss(_bind(model, params), batch))
  logits = np.asarray(model.apply({'params': params}, corrupted)[0], np.float64)
  p, target = 1 / (1 + np.exp(-logits)), np.asarray(x, np.float64)
  cross_entropy = -(target * np.log(p) + (1 - target) * np.log(1 - p)).reshape(B, -1).sum(1)
  np.testing.assert_allclose(totals['reconstruction'], cross_entropy, rtol=1e-5)
  np.testing.assert_allclose(totals['loss'], cross_entropy, rtol=1e-5)


def test_mean_code_is_each_examples_mean_activation_over_code_units(contractive):
  # 'mean_code' per example is (1/K) Σ_j h_j, the quantity the sparsity target ρ aims at;
  # a sum over units reported K = 5 times that.
  model, params = contractive
  task = tasks.build('autoencoder')
  x = images(B)
  totals = _totals(task.loss(_bind(model, params), {'input': x}))
  h = np.asarray(model.apply({'params': params}, x)[1], np.float64)
  assert h.shape == (B, 5)
  np.testing.assert_allclose(totals['mean_code'], h.mean(axis=1), rtol=1e-6)


# VAE ---------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def bernoulli_vae():
  """A VAE with weights of size ~1/√fan_in, the decoder's 5 times larger, so that p(x|z)
  depends strongly on z (logits of size ~10–100) and the posterior differs from q."""
  model = registry.build('vae', image_shape=SHAPE, latent_dim=2, hidden_sizes=(8,))
  rngs = {'params': jax.random.PRNGKey(0), 'latent': jax.random.PRNGKey(1)}
  params = _random_params(model, images(B), rngs=rngs)
  return model, {name: jax.tree.map(lambda p: 5 * p, value) if name.startswith('decoder_layers')
                 else value for name, value in params.items()}


def test_iwae_with_one_sample_is_the_monte_carlo_elbo_with_the_same_eps(bernoulli_vae):
  model, params = bernoulli_vae
  task = tasks.build('vae', iwae_samples=1)
  pixels = jnp.asarray(np.random.default_rng(1).integers(0, 256, size=(B,) + SHAPE), jnp.float32)
  batch = task.transform({}, {'input': pixels}, False)
  np.testing.assert_allclose(batch['input'], pixels / 255, rtol=1e-6)
  rngs = {'latent': jax.random.PRNGKey(5)}
  metrics, out = jax.jit(lambda batch: (
      task.eval_metrics(_bind(model, params, rngs), batch),
      model.apply({'params': params}, batch['input'], rngs=rngs)))(batch)
  totals = _totals(metrics)
  mean, log_var, z, logits = (np.asarray(a, np.float64) for a in out[:4])
  x = np.asarray(batch['input'], np.float64)
  # log σ(l) = −log(1 + e^{−l}) and log(1 − σ(l)) = −log(1 + e^{l}), for saturated logits.
  log_px = -(x * np.logaddexp(0, -logits[0]) + (1 - x) * np.logaddexp(0, logits[0]))
  log_px = log_px.reshape(B, -1).sum(1)
  log_pz = stats.norm.logpdf(z[0]).sum(1)
  log_qz = stats.norm.logpdf(z[0], mean, np.exp(0.5 * log_var)).sum(1)
  kl = np.sum(-0.5 * (1 + log_var - mean ** 2 - np.exp(log_var)), 1)
  # float32 sums of 12 terms of up to ~100: the largest difference measured is 1.7e-5.
  np.testing.assert_allclose(totals['iwae'], log_px + log_pz - log_qz, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(totals['kl'], kl, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(totals['reconstruction'], -log_px, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(totals['elbo'], log_px - kl, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(totals['loss'], kl - log_px, rtol=1e-5, atol=1e-4)
  assert 'elbo_bits_per_dim' not in totals  # a Bernoulli decoder has no density on [0, 1]^D


class _LinearGaussian:
  """p(z) = N(0, I), p(x|z) = N(W z + b, s² I); q(z|x) = N(m, diag v) is the exact posterior,
  N(M⁻¹ Wᵀ (x − b) / s², M⁻¹) with M = I + WᵀW / s², moved by `shift` and widened by `scale`
  (W has orthogonal columns, so M is diagonal and the exact posterior is in the family)."""

  W = np.array([[1.0, 0.5], [-1.0, 0.5], [0.5, 0.0]])  # columns orthogonal
  B, S2 = np.array([0.2, -0.1, 0.4]), 0.3
  POSTERIOR_VAR = 1 / (1 + np.sum(W ** 2, 0) / S2)

  def __init__(self, eps_SxBxK=None, shift=0.0, scale=1.0):
    # The standard normal draws ε, given (numpy: no random-number program to compile).
    self.eps_SxBxK, self.shift, self.scale = eps_SxBxK, shift, scale

  def q(self, x):
    """(mean, variance) of q(z|x)."""
    mean = (x - self.B) @ self.W / self.S2 * self.POSTERIOR_VAR + self.shift
    return mean, self.POSTERIOR_VAR * self.scale + 0 * mean

  def __call__(self, x, num_samples=1):
    mean, var = (a.astype(jnp.float32) for a in self.q(x))
    z = mean + jnp.sqrt(var) * self.eps_SxBxK[:num_samples]
    decoder_mean = z @ self.W.T.astype(np.float32) + self.B.astype(np.float32)
    return autoencoders.VAEOutput(mean, jnp.log(var), z, decoder_mean,
                                  jnp.full(decoder_mean.shape, math.log(self.S2), jnp.float32))

  def log_marginal(self, x):
    """log N(x; b, W Wᵀ + s² I), the exact log-likelihood."""
    return stats.multivariate_normal.logpdf(x, self.B, self.W @ self.W.T + self.S2 * np.eye(3))

  def elbo(self, x):
    """E_q log N(x; W z + b, s² I) − KL(q ‖ N(0, I)) in closed form."""
    mean, var = self.q(x)
    residual = x - mean @ self.W.T - self.B
    expected_sq = np.sum(residual ** 2, 1) + np.sum(var * np.sum(self.W ** 2, 0), 1)
    log_lik = -0.5 * (3 * math.log(2 * math.pi * self.S2) + expected_sq / self.S2)
    return log_lik - 0.5 * np.sum(mean ** 2 + var - 1 - np.log(var), 1)


def test_iwae_bounds_of_a_linear_gaussian_model_rise_from_the_elbo_to_log_p():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(5, 3))
  golden = _LinearGaussian().log_marginal(x)
  draws, ks, k_max = 24, (1, 5, 50), 4000
  eps_NxSxBxK = rng.normal(size=(draws, 50, 5, 2)).astype(np.float32)
  eps_SxBxK = rng.normal(size=(k_max, 5, 2)).astype(np.float32)

  def metrics(model, k, x):
    return {name: total for name, (total, _) in tasks.build('vae', iwae_samples=k).eval_metrics(
        model, {'input': x}).items()}

  @jax.jit
  def run(x, eps_NxSxBxK, eps_SxBxK):
    # q = the exact posterior moved by 0.6 and 3 times as wide: the ELBO falls below log p(x).
    approx = lambda eps: _LinearGaussian(eps, shift=0.6, scale=3.0)
    per_k = [jax.vmap(lambda eps: metrics(approx(eps), k, x))(eps_NxSxBxK) for k in ks]
    out = approx(eps_SxBxK)(x, num_samples=k_max)
    log_px = tasks.autoencoder.log_likelihood(out, x)
    return (metrics(_LinearGaussian(eps_SxBxK), 5, x), per_k, metrics(approx(eps_SxBxK), k_max, x),
            log_px, tasks.autoencoder.log_importance_weights(out, log_px))

  exact_metrics, per_k, large_k, log_px, log_w = jax.tree.map(
      lambda a: np.asarray(a, np.float64), run(jnp.asarray(x, jnp.float32), eps_NxSxBxK, eps_SxBxK))
  # With q the exact posterior every importance weight is p(x): IWAE_K = log p(x) for any K.
  # float32 terms of size ~10: measured difference 1e-7.
  np.testing.assert_allclose(exact_metrics['iwae'], golden, atol=1e-4)
  elbo = _LinearGaussian(shift=0.6, scale=3.0).elbo(x)
  assert np.all(golden - elbo > 1.0)
  # E IWAE_1 = ELBO; E IWAE_K rises with K (Burda et al. 2016, Theorem 1): averages over
  # draws and examples, tolerances 4 SE. Measured: |IWAE_1 − ELBO| = 0.8 SE; the rises are
  # 2.1 and 0.56 nats, 6.1 and 6.0 SE.
  mean, se = lambda a: a.mean(), lambda a: a.mean(1).std(ddof=1) / math.sqrt(draws)
  iwae = [m['iwae'] for m in per_k]
  assert abs(mean(iwae[0]) - elbo.mean()) < 4 * se(iwae[0])
  for low, high in zip(iwae, iwae[1:]):
    assert mean(high) - mean(low) > 4 * math.hypot(se(low), se(high)), (mean(low), mean(high))
  # K = 4000: the ELBO estimate (the mean of K terms log p(x|z_k) minus the analytic KL, SE
  # std/√K; measured at most 2.1 SE) and IWAE within its noise of log p(x), 2.9 nats above the
  # ELBO: SE ≈ std(w/p)/√K, bias ≈ −var(w/p)/(2K) (measured at most 2.1 SE).
  np.testing.assert_array_less(np.abs(large_k['elbo'] - elbo),
                               4 * np.std(log_px, 0) / math.sqrt(k_max))
  w = np.exp(log_w - golden)  # w / p(x), mean 1
  iwae_tolerance = 4 * np.std(w, 0) / math.sqrt(k_max) + np.var(w, 0) / (2 * k_max)
  np.testing.assert_array_less(np.abs(large_k['iwae'] - golden), iwae_tolerance)


def test_training_draws_one_latent_sample_and_evaluation_iwae_samples():
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.uniform(size=(4, 3)), jnp.float32)
  model = _LinearGaussian(rng.normal(size=(5, 4, 2)).astype(np.float32))
  calls = []

  def recording(x, num_samples=1):
    calls.append(num_samples)
    return model(x, num_samples=num_samples)

  task = tasks.build('vae', iwae_samples=5)
  jax.eval_shape(lambda x: (task.loss(recording, {'input': x}),
                            task.eval_metrics(recording, {'input': x})), x)
  assert calls == [1, 5]


def test_dequantised_gaussian_decoder_reports_bits_per_dimension():
  task = tasks.build('vae', dequantize=True, iwae_samples=3)
  rng = np.random.default_rng(4)
  pixels = jnp.asarray(rng.integers(0, 256, size=(6, 3)), jnp.float32)
  model = _LinearGaussian(rng.normal(size=(3, 6, 2)).astype(np.float32))
  key = jax.random.PRNGKey

  @jax.jit
  def run(dequantize_key, latent_key):
    batch = task.transform({'dequantize': dequantize_key, 'latent': latent_key},
                           {'input': pixels}, False)
    return batch['input'], task.eval_metrics(model, batch)

  (y, metrics), (y_same, _), (y_other, _) = (run(key(0), key(1)), run(key(0), key(2)),
                                             run(key(3), key(1)))
  # (pixels + u)/256 from the 'dequantize' stream, in evaluation too.
  np.testing.assert_array_equal(np.floor(np.asarray(y) * 256), pixels)
  np.testing.assert_array_equal(y_same, y)
  assert not np.allclose(y_other, y)
  totals = _totals(metrics)
  for bound in ('elbo', 'iwae'):
    # −log p in nats over D = 3 dimensions → bits per 8-bit dimension: nll/(3 ln 2) + 8.
    np.testing.assert_allclose(totals[f'{bound}_bits_per_dim'],
                               -totals[bound] / (3 * math.log(2)) + 8, rtol=1e-6)
  # Without dequantisation the density is not one on the bins: no bits per dimension.
  reported = jax.eval_shape(lambda: tasks.build('vae', iwae_samples=3).eval_metrics(
      model, {'input': pixels / 255}))
  assert sorted(reported) == ['elbo', 'iwae', 'kl', 'loss', 'reconstruction']


def test_a_bernoulli_decoder_reports_no_bits_per_dimension_on_dequantised_data(bernoulli_vae):
  # Bits per dimension need a density on [0, 1]^D; Bernoulli logits give a probability of
  # soft targets, not a density, so dequantised inputs add no bits per dimension for it.
  model, params = bernoulli_vae
  task = tasks.build('vae', dequantize=True, iwae_samples=2)
  pixels = jnp.asarray(np.random.default_rng(7).integers(0, 256, size=(B,) + SHAPE), jnp.float32)
  rngs = {'dequantize': jax.random.PRNGKey(0), 'latent': jax.random.PRNGKey(1)}
  reported = jax.eval_shape(lambda: task.eval_metrics(
      _bind(model, params, rngs), task.transform(rngs, {'input': pixels}, False)))
  assert sorted(reported) == ['elbo', 'iwae', 'kl', 'loss', 'reconstruction']


@pytest.mark.parametrize('model_name, task_name, options', [
    ('contractive_autoencoder', 'autoencoder',
     dict(corruption='masking', noise_level=0.2, sparsity_weight=1.0, contraction_weight=0.1)),
    ('vae', 'vae', dict(dequantize=True, iwae_samples=4)),
])
def test_the_train_and_eval_steps_trace(model_name, task_name, options):
  # What the train loop proves before its first step, traced without compiling: every random
  # stream is there, the metrics are (total, weight) pairs per example, 'mask' survives.
  model = registry.build(model_name, image_shape=SHAPE, latent_dim=3,
                         **({'decoder': 'gaussian'} if model_name == 'vae' else {}))
  task = tasks.build(task_name, {'features': ('image', 'label')}, **options)
  batch = task.preprocess({'image': np.zeros((4,) + SHAPE, np.uint8),
                           'label': np.zeros(4, np.int32)})
  tx = optax.sgd(0.1)
  state = jax.eval_shape(lambda: init_train_state(model, task, tx, jax.random.PRNGKey(0), batch))
  _, train_metrics = jax.eval_shape(lambda s: step.train_step(
      s, batch, model=model, task=task, tx=tx, learning_rate_fn=lambda _: 0.1), state)
  eval_totals = jax.eval_shape(lambda s: step.eval_step(
      s, {**batch, 'mask': np.ones(4, np.int32)}, 0, model=model, task=task), state)
  expected = {'autoencoder': {'loss', 'reconstruction', 'mean_code', 'sparsity_penalty',
                              'contraction_penalty'},
              'vae': {'loss', 'elbo', 'kl', 'reconstruction'}}[task_name]
  assert set(train_metrics['totals']) == expected
  if task_name == 'vae':
    expected |= {'iwae', 'elbo_bits_per_dim', 'iwae_bits_per_dim'}
  assert set(eval_totals) == expected


def test_vae_options_are_checked():
  for options, expected in ((dict(iwae_samples=0), 'task.iwae_samples'),
                            (dict(iwae_samples=2.5), 'task.iwae_samples'),
                            (dict(dequantize='yes'), 'task.dequantize'),
                            (dict(iwae=3), "'iwae'")):
    assert expected in one_sentence(lambda: tasks.build('vae', **options))
  assert "'pixels'" in one_sentence(lambda: tasks.build('vae', {'features': ('image', 'label')},
                                                         input_key='pixels'))


def test_an_evaluation_batch_of_padding_only_sums_to_zero(contractive):
  # With every example masked out ρ̂ has no example to average: taken as 0 and clipped inside
  # (0, 1), the penalty stays finite and the mask removes it. A NaN (0 / 0) or an infinite KL
  # would survive the mask (NaN · 0) and spoil the split's sums.
  model, params = contractive
  task = tasks.build('autoencoder', sparsity_target=0.2, sparsity_weight=3.0)
  mask, x = jnp.zeros(B, jnp.int32), images(B)
  sums = jax.jit(lambda params: step.sum_metrics(
      task.loss(_bind(model, params), {'input': x, 'mask': mask}), B, mask))(params)
  for name, (total, weight) in sums.items():
    assert (float(total), float(weight)) == (0.0, 0.0), name


def test_bits_per_dimension_of_images_count_every_pixel_of_an_example():
  # A Gaussian decoder on dequantised images [2, 3, 1]: D = 6 dimensions per example, not the
  # last axis's 1. ELBO and IWAE from fixed outputs, in numpy: nll / (D ln 2) + 8 bits.
  rng = np.random.default_rng(9)
  s, b, k, shape = 3, 4, 2, (2, 3, 1)
  f32 = lambda a: np.asarray(a, np.float32).astype(np.float64)
  mean, log_var = f32(rng.normal(size=(b, k))), f32(0.3 * rng.normal(size=(b, k)))
  z = f32(mean + np.exp(0.5 * log_var) * rng.normal(size=(s, b, k)))
  decoder_mean = f32(rng.uniform(size=(s, b) + shape))
  decoder_log_var = f32(rng.uniform(-3, -1, size=(s, b) + shape))
  out = autoencoders.VAEOutput(*(jnp.asarray(a, jnp.float32) for a in (
      mean, log_var, z, decoder_mean, decoder_log_var)))
  task = tasks.build('vae', dequantize=True, iwae_samples=s)
  pixels = jnp.asarray(rng.integers(0, 256, size=(b,) + shape), jnp.float32)

  @jax.jit
  def run(key):
    batch = task.transform({'dequantize': key}, {'input': pixels}, False)
    return batch['input'], task.eval_metrics(lambda x, num_samples: out, batch)

  y, metrics = run(jax.random.PRNGKey(0))
  totals, y = _totals(metrics), np.asarray(y, np.float64)
  log_px = stats.norm.logpdf(y, decoder_mean, np.exp(0.5 * decoder_log_var)).reshape(s, b, -1)
  log_px = log_px.sum(-1)
  kl = 0.5 * np.sum(mean ** 2 + np.exp(log_var) - 1 - log_var, 1)
  log_w = (log_px + stats.norm.logpdf(z).sum(-1)
           - stats.norm.logpdf(z, mean, np.exp(0.5 * log_var)).sum(-1))
  bounds = {'elbo': log_px.mean(0) - kl, 'iwae': np.log(np.mean(np.exp(log_w), 0))}
  for name, bound in bounds.items():
    np.testing.assert_allclose(totals[name], bound, rtol=1e-5)
    np.testing.assert_allclose(totals[f'{name}_bits_per_dim'], -bound / (6 * math.log(2)) + 8,
                               rtol=1e-5)


# Every parallel mode -----------------------------------------------------------------------

_SPARSE_AUTOENCODER_STEPS = '''
import functools, json
import jax, numpy as np, ml_collections
from models import registry
from train import optim, parallel, step, tasks
from train.state import init_train_state

RHO, BETA = 0.05, 3.0


def batches():
  rng = np.random.default_rng(0)
  for _ in range(4):
    images = 0.1 * rng.uniform(size=(64, 4, 3, 1)).astype(np.float32)
    # Device 0 of 8 sees bright images, the others dim ones: its code means are far from theirs,
    # so a mean of per-device KL(rho || rho_hat) differs from the KL of the global mean.
    images[:8] = rng.uniform(0.8, 1.0, size=(8, 4, 3, 1))
    yield {'input': images}


def run(mode, num_devices):
  par = parallel.Parallel(mode, parallel.make_mesh(num_devices), fsdp_min_size=0)
  model = registry.build('sparse_autoencoder', image_shape=(4, 3, 1), latent_dim=8)
  task = tasks.build('autoencoder', sparsity_target=RHO, sparsity_weight=BETA)
  opt = ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.02, schedule='constant'))
  tx, lr = optim.make_optimizer(opt, 4)
  data = list(batches())
  init_fn = lambda rng: init_train_state(model, task, tx, rng, data[0])
  rng = jax.random.PRNGKey(0)
  abstract = par.abstract_state(init_fn, rng)
  state = par.to_run_layout(par.init_state(init_fn, rng))
  initial_params = jax.device_get(par.to_canonical(state).params)
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=task, tx=tx, learning_rate_fn=lr), abstract)
  losses, penalties = [], []
  for batch in data:
    state, metrics = train_step(state, par.shard_batch(batch))
    for name, out in (('loss', losses), ('sparsity_penalty', penalties)):
      total, weight = metrics['totals'][name]
      out.append(float(total) / float(weight))
  return jax.device_get(par.to_canonical(state)), losses, penalties, initial_params, data[0]


def kl_penalty(h):
  rho_hat = h.mean(0)
  return BETA * np.sum(RHO * np.log(RHO / rho_hat) + (1 - RHO) * np.log((1 - RHO) / (1 - rho_hat)))


out = {'devices': jax.device_count()}
reference, ref_losses, ref_penalties, params, batch = run('jit', 1)
# The first step's penalty as a mean of 8 per-device penalties, for the test to compare.
layer = params['encoder_0']
h = 1 / (1 + np.exp(-(batch['input'].reshape(64, -1) @ layer['kernel'] + layer['bias'])))
out['global_penalty'] = float(kl_penalty(h))
out['mean_of_device_penalties'] = float(np.mean([kl_penalty(part) for part in np.split(h, 8)]))
out['first_penalty'] = ref_penalties[0]
for mode in ('jit', 'fsdp', 'shard_map', 'pmap'):
  state, losses, penalties, _, _ = run(mode, 8)
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - b))),
                       state, reference)
  out[mode] = {'max_state_diff': max(jax.tree.leaves(diffs)),
               'max_loss_diff': max(abs(a - b) for a, b in zip(losses, ref_losses)),
               'max_penalty_diff': max(abs(a - b) for a, b in zip(penalties, ref_penalties)),
               'step': int(state.step), 'loss_decreased': losses[-1] < losses[0]}
print(json.dumps(out))
'''


@pytest.fixture(scope='module', autouse=True)
def parallel_run(request):
  """Starts the 8-device child with the module's first test, so that it runs beside the
  in-process tests (on another core) rather than after them; None if no test here needs it."""
  if not any(item.module is request.module and 'parallel_results' in item.fixturenames
             for item in request.session.items):
    yield None
    return
  # The compilations (five, tiny) dominate the child's time.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    yield pool.submit(run_python, _SPARSE_AUTOENCODER_STEPS, devices=8, fast_compile=True)


@pytest.fixture(scope='module')
def parallel_results(parallel_run):
  return parallel_run.result()


@pytest.mark.parametrize('mode', ['jit', 'fsdp', 'shard_map', 'pmap'])
def test_sparse_autoencoder_matches_one_device_in_every_parallel_mode(parallel_results, mode):
  assert parallel_results['devices'] == 8
  r = parallel_results[mode]
  assert r['step'] == 4 and r['loss_decreased'], r
  # Params and optimiser state after 4 steps (measured difference 6e-8), losses of ~8 nats and
  # penalties (measured 2e-6).
  assert r['max_state_diff'] < 2e-5, r
  assert r['max_loss_diff'] < 2e-5 and r['max_penalty_diff'] < 2e-5, r


def test_a_mean_of_per_device_sparsity_penalties_would_differ(parallel_results):
  # The data make the test above able to fail: the global ρ̂'s penalty (the one the task
  # reported, within float error) is far from the mean of the 8 devices' own penalties.
  r = parallel_results
  assert r['first_penalty'] == pytest.approx(r['global_penalty'], rel=1e-5)
  assert abs(r['mean_of_device_penalties'] - r['global_penalty']) > 0.1, r
