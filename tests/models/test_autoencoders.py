"""Likelihood helpers against formulas written out in float64 numpy/scipy (KL against a
Monte-Carlo estimate), and the autoencoder and VAE modules against a numpy forward pass, the
reparameterisation written out, and the registry."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from models import registry
from models.generative import autoencoders
from models.generative import likelihood
from tests.messages import one_sentence

SHAPE = (4, 3, 1)  # one image: D = 12 pixels


def images(batch=5, seed=0):
  """`batch` images of shape SHAPE with pixels uniform in [0, 1)."""
  return jnp.asarray(np.random.default_rng(seed).uniform(size=(batch,) + SHAPE), jnp.float32)


# Likelihood helpers -------------------------------------------------------------------------


def test_gaussian_log_prob_equals_scipy():
  rng = np.random.default_rng(0)
  x, mean = rng.normal(size=(2, 6, 3))
  log_var = rng.normal(size=(6, 3))
  expected = stats.norm.logpdf(x, loc=mean, scale=np.exp(0.5 * log_var))
  # float32 of values of size ~3: the largest difference measured is 1.2e-7.
  np.testing.assert_allclose(likelihood.gaussian_log_prob(x, mean, log_var), expected,
                             rtol=1e-5, atol=1e-5)


def test_bernoulli_log_prob_equals_the_formula_and_is_finite_for_large_logits():
  rng = np.random.default_rng(1)
  logits = rng.normal(scale=3.0, size=(4, 5))
  x = rng.uniform(size=(4, 5))  # soft targets in [0, 1]
  p = 1 / (1 + np.exp(-logits))
  expected = x * np.log(p) + (1 - x) * np.log(1 - p)
  np.testing.assert_allclose(likelihood.bernoulli_log_prob(jnp.asarray(logits, jnp.float32), x),
                             expected, rtol=1e-5, atol=1e-5)
  # log σ(−100) = −100 − log(1 + e^{−100}): a naive log(sigmoid) would give −inf.
  far = likelihood.bernoulli_log_prob(jnp.array([-100.0, 100.0]), jnp.array([1.0, 0.0]))
  np.testing.assert_allclose(far, [-100.0, -100.0], rtol=1e-6)
  # Targets broadcast against the logits: one image x [5] for a batch of 4 logits.
  np.testing.assert_allclose(
      likelihood.bernoulli_log_prob(jnp.asarray(logits, jnp.float32), x[0]),
      x[0] * np.log(p) + (1 - x[0]) * np.log(1 - p), rtol=1e-5, atol=1e-5)


def test_kl_to_standard_normal_equals_a_monte_carlo_estimate():
  rng = np.random.default_rng(2)
  mean = np.array([[0.5, -1.0, 0.0], [2.0, 0.3, -0.7]])
  log_var = np.array([[0.0, -1.0, 0.8], [-2.0, 0.5, 0.1]])
  n = 20000
  z = mean + np.exp(0.5 * log_var) * rng.normal(size=(n,) + mean.shape)
  log_q = stats.norm.logpdf(z, mean, np.exp(0.5 * log_var)).sum(-1)
  log_p = stats.norm.logpdf(z).sum(-1)
  samples = log_q - log_p
  estimate, standard_error = samples.mean(0), samples.std(0) / math.sqrt(n)
  analytic = np.asarray(likelihood.kl_diag_gaussian_to_standard(
      jnp.asarray(mean, jnp.float32), jnp.asarray(log_var, jnp.float32)))
  # Measured |analytic − estimate| / SE: 0.60 and 0.59 (SE 0.009 and 0.010).
  assert np.all(np.abs(analytic - estimate) < 4 * standard_error), (analytic, estimate,
                                                                    standard_error)
  assert float(likelihood.kl_diag_gaussian_to_standard(jnp.zeros(3), jnp.zeros(3))) == 0.0


def test_bits_per_dim_golden_values():
  d = 12
  # A uniform density on [0, 1]^D has nll 0: 8 bits per 8-bit dimension.
  assert likelihood.bits_per_dim(0.0, d) == pytest.approx(8.0)
  assert likelihood.bits_per_dim(d * math.log(2) * 1.5, d) == pytest.approx(9.5)
  assert likelihood.bits_per_dim(d * math.log(2), d, levels=2) == pytest.approx(2.0)
  assert likelihood.bits_per_dim(3 * math.log(2), 1) == pytest.approx(11.0)  # D = 1 is valid
  assert 'dimensions' in one_sentence(lambda: likelihood.bits_per_dim(1.0, 0))
  # One level per dimension holds no information (log₂ 1 = 0 bits): refused.
  assert 'at least 2 levels' in one_sentence(lambda: likelihood.bits_per_dim(1.0, d, levels=1))


def test_dequantize_stays_in_the_pixels_bin_and_is_uniform():
  pixels = jnp.asarray(np.random.default_rng(3).integers(0, 256, size=(50, 40)), jnp.float32)
  y = jax.jit(likelihood.dequantize)(jax.random.PRNGKey(0), pixels)
  np.testing.assert_array_equal(np.floor(np.asarray(y) * 256), pixels)
  u = np.asarray(y) * 256 - np.asarray(pixels)
  # u ~ U[0, 1): mean 1/2, SE √(1/12 / 2000) = 0.0065; measured |mean − 1/2| = 0.0049.
  assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / u.size)
  other = likelihood.dequantize(jax.random.PRNGKey(1), pixels)
  assert not np.allclose(other, y)


def test_log_mean_exp_is_stable():
  a = np.random.default_rng(4).normal(size=(7, 3))
  np.testing.assert_allclose(likelihood.log_mean_exp(jnp.asarray(a, jnp.float32)),
                             np.log(np.exp(a).mean(0)), rtol=1e-5, atol=1e-6)
  shifted = likelihood.log_mean_exp(jnp.asarray(a - 1000.0, jnp.float32))
  np.testing.assert_allclose(shifted, np.log(np.exp(a).mean(0)) - 1000.0, rtol=1e-6)
  # Along another axis the mean divides by that axis's length (3), not the first one's (7).
  np.testing.assert_allclose(likelihood.log_mean_exp(jnp.asarray(a, jnp.float32), axis=1),
                             np.log(np.exp(a).mean(1)), rtol=1e-5, atol=1e-6)


# Autoencoder ------------------------------------------------------------------------------


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def test_autoencoder_equals_a_numpy_forward_pass():
  model = autoencoders.Autoencoder(latent_dim=3, hidden_sizes=(5,), image_shape=SHAPE)
  x = images()
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x)
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), variables['params'])
  assert sorted(params) == ['decoder_0', 'decoder_1', 'encoder_0', 'encoder_1']
  assert params['encoder_0']['kernel'].shape == (12, 5)
  assert params['decoder_1']['kernel'].shape == (5, 12)
  flat = np.asarray(x, np.float64).reshape(5, 12)
  dense = lambda name, v: v @ params[name]['kernel'] + params[name]['bias']
  h = _sigmoid(dense('encoder_1', np.maximum(dense('encoder_0', flat), 0)))
  logits = dense('decoder_1', np.maximum(dense('decoder_0', h), 0)).reshape((5,) + SHAPE)
  out_logits, out_h, decoded = jax.jit(lambda v, x: model.apply(v, x) + (
      model.apply(v, model.apply(v, x, method='encode'), method='decode'),))(variables, x)
  # float32 against float64: the largest difference measured is 1.2e-7.
  np.testing.assert_allclose(out_h, h, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out_logits, logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(decoded, out_logits, atol=1e-6)


def test_presets_and_their_defaults():
  for name in ('autoencoder', 'denoising_autoencoder', 'sparse_autoencoder',
               'contractive_autoencoder'):
    model = registry.build(name, image_shape=SHAPE, latent_dim=3)
    assert isinstance(model, autoencoders.Autoencoder) and model.code_activation == 'sigmoid'
  assert registry.build('contractive_autoencoder').has_one_sigmoid_layer_encoder
  assert not registry.build('autoencoder').has_one_sigmoid_layer_encoder
  assert registry.build('sparse_autoencoder').latent_dim == 196


def test_bad_options_and_inputs_are_one_sentence():
  x = images()
  message = one_sentence(lambda: autoencoders.Autoencoder(image_shape=(28, 28, 1)).init(
      jax.random.PRNGKey(0), x))
  assert 'image_shape=(4, 3, 1)' in message
  assert 'latent_dim' in one_sentence(lambda: autoencoders.Autoencoder(
      latent_dim=0, image_shape=SHAPE).init(jax.random.PRNGKey(0), x))
  message = one_sentence(lambda: registry.build('vae', decoder='poisson', image_shape=SHAPE).init(
      {'params': jax.random.PRNGKey(0), 'latent': jax.random.PRNGKey(1)}, x))
  assert "'poisson'" in message and 'bernoulli, gaussian' in message
  assert 'num_samples' in one_sentence(lambda: registry.build('vae', image_shape=SHAPE).init(
      {'params': jax.random.PRNGKey(0), 'latent': jax.random.PRNGKey(1)}, x, num_samples=0))


# VAE --------------------------------------------------------------------------------------

_RNGS = {'params': jax.random.PRNGKey(0), 'latent': jax.random.PRNGKey(1)}


def _vae(**options):
  return registry.build('vae', image_shape=SHAPE, latent_dim=2, hidden_sizes=(6,), **options)


@pytest.fixture(scope='module')
def gaussian_vae():
  """Parameters N(0, 1/fan_in) drawn by numpy (no init program to compile); log σ_x² = 0."""
  model = _vae(decoder='gaussian')
  rng = np.random.default_rng(0)
  draw = lambda a: jnp.asarray(rng.normal(size=a.shape) / math.sqrt(a.shape[0]) if a.ndim == 2
                               else np.zeros(a.shape), jnp.float32)
  return model, jax.tree.map(draw, jax.eval_shape(model.init, _RNGS, images()))


def test_vae_parameters_by_registry_build():
  shapes = lambda model: jax.tree.map(jnp.shape, jax.eval_shape(model.init, _RNGS, images()))
  assert shapes(_vae(decoder='gaussian'))['params'] == {
      'encoder_layers_0': {'kernel': (12, 6), 'bias': (6,)},
      'posterior_mean': {'kernel': (6, 2), 'bias': (2,)},
      'posterior_log_var': {'kernel': (6, 2), 'bias': (2,)},
      'decoder_layers_0': {'kernel': (2, 6), 'bias': (6,)},
      'decoder_layers_1': {'kernel': (6, 12), 'bias': (12,)},
      'decoder_log_var': SHAPE}
  assert _vae().rng_streams == ('latent',)
  assert shapes(_vae(decoder='gaussian', decoder_scale='global'))['params']['decoder_log_var'] == ()
  assert 'decoder_log_var' not in shapes(_vae())['params']


def test_vae_samples_are_the_reparameterisation_of_the_latent_stream(gaussian_vae):
  model, variables = gaussian_vae
  x = images()
  key = jax.random.PRNGKey(7)
  apply = jax.jit(lambda key: model.apply(variables, x, num_samples=4000, rngs={'latent': key}))
  out = apply(key)
  assert out.z.shape == (4000, 5, 2) and out.decoder_mean.shape == (4000, 5) + SHAPE
  # The same key gives the same ε, another key another.
  np.testing.assert_array_equal(apply(key).z, out.z)
  assert not np.allclose(apply(jax.random.PRNGKey(8)).z, out.z)
  # z ~ N(μ, σ²): the sample mean within 4 SE of μ and the variance within 4 SE of σ²
  # (SE of a variance estimate √(2/n)·σ²). Measured: at most 1.7 and 1.9 SE.
  mean, var = np.asarray(out.posterior_mean), np.exp(np.asarray(out.posterior_log_var))
  z = np.asarray(out.z, np.float64)
  assert np.all(np.abs(z.mean(0) - mean) < 4 * np.sqrt(var / 4000))
  assert np.all(np.abs(z.var(0) - var) < 4 * np.sqrt(2 / 4000) * var)
  # The Gaussian decoder's mean is a sigmoid, its log-variance the (zero-initialised) parameter.
  assert np.all((out.decoder_mean > 0) & (out.decoder_mean < 1))
  np.testing.assert_array_equal(out.decoder_log_var, 0.0)


def test_vae_sample_from_the_prior_and_decode(gaussian_vae):
  model, variables = gaussian_vae
  key = jax.random.PRNGKey(3)

  @jax.jit
  def run():
    means = model.apply(variables, 6, key, method='sample')
    draws = model.apply(variables, 6, key, method='sample', mean=False)
    z = jax.random.normal(jax.random.split(key)[0], (6, 2))
    return means, draws, model.apply(variables, z, method='decode')

  means, draws, (decoded_mean, decoded_log_var) = run()
  assert means.shape == (6,) + SHAPE and np.all((means > 0) & (means < 1))
  np.testing.assert_allclose(means, decoded_mean, atol=1e-6)
  # A draw is the mean plus N(0, σ² = e⁰) noise: not the mean, not clipped.
  assert np.all(decoded_log_var == 0) and not np.allclose(draws, means)
  assert draws.min() < 0 or draws.max() > 1


def test_vae_equals_a_numpy_forward_pass_and_draws_with_the_decoder_variance():
  model = _vae(decoder='gaussian')
  rng = np.random.default_rng(1)
  variables = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape) / 2, jnp.float32),
                           jax.eval_shape(model.init, _RNGS, images()))
  variables['params']['decoder_log_var'] = jnp.full(SHAPE, np.log(0.25), jnp.float32)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  dense = lambda name, v: v @ p[name]['kernel'] + p[name]['bias']
  x = images()
  h = np.maximum(dense('encoder_layers_0', np.asarray(x, np.float64).reshape(5, 12)), 0)
  out = jax.jit(lambda v: model.apply(v, x, num_samples=3, rngs={'latent': _RNGS['latent']}))(
      variables)
  # float32 against float64 on values of size ~1: differences of 1e-7.
  np.testing.assert_allclose(out.posterior_mean, dense('posterior_mean', h), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.posterior_log_var, dense('posterior_log_var', h), rtol=1e-5,
                             atol=1e-5)
  z = np.asarray(out.z, np.float64)
  mean = 1 / (1 + np.exp(-dense('decoder_layers_1', np.maximum(dense('decoder_layers_0', z), 0))))
  np.testing.assert_allclose(out.decoder_mean, mean.reshape((3, 5) + SHAPE), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.decoder_log_var, np.log(0.25), rtol=1e-6)
  # x ~ N(mean, σ² = 0.25): with one key, the draws minus the means (the same z) are the noise,
  # whose variance is within 4 SE (√(2/n)·σ²) of 0.25 in every pixel; a σ used as the
  # variance would give 0.0625.
  n, key = 4000, jax.random.PRNGKey(3)
  means, draws = jax.jit(lambda v: [model.apply(v, n, key, method='sample', mean=m)
                                    for m in (True, False)])(variables)
  noise_var = np.asarray(draws - means, np.float64).var(0)
  assert np.all(np.abs(noise_var - 0.25) < 4 * np.sqrt(2 / n) * 0.25), noise_var


def test_bfloat16_compute_keeps_float32_parameters_and_distributions():
  model = _vae(dtype='bfloat16', decoder='gaussian')
  variables = jax.eval_shape(model.init, _RNGS, images())
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables))
  out = jax.eval_shape(lambda v: model.apply(v, images(), rngs={'latent': _RNGS['latent']}),
                       variables)
  assert out.posterior_mean.dtype == jnp.float32 and out.decoder_mean.dtype == jnp.float32
  ae = registry.build('autoencoder', dtype='bfloat16', image_shape=SHAPE, latent_dim=3)
  logits, _ = jax.eval_shape(lambda: ae.apply(ae.init(_RNGS['params'], images()), images()))
  assert logits.dtype == jnp.bfloat16


def test_sigmoid_encoder_jacobian_norm_equals_the_autodiff_jacobian():
  # ‖∂h/∂x‖²_F of h = σ(W x + b), from the Jacobian jax.jacobian takes of the encoder itself.
  model = autoencoders.ContractiveAutoencoder(latent_dim=3, image_shape=SHAPE)
  x = images(batch=2)
  variables = model.init(jax.random.PRNGKey(0), x)
  encode = lambda x1: model.apply(variables, x1[None], method='encode')[0]
  jacobians = [np.asarray(jax.jacobian(encode)(x[i]), np.float64) for i in range(2)]
  expected = [np.sum(j**2) for j in jacobians]  # [K, *SHAPE] each
  h = model.apply(variables, x, method='encode')
  kernel = variables['params']['encoder_0']['kernel']
  got = autoencoders.sigmoid_encoder_jacobian_sq_norm(h, kernel)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_a_named_code_activation_is_applied_to_the_code():
  model = autoencoders.Autoencoder(latent_dim=3, hidden_sizes=(), code_activation='tanh',
                                   image_shape=SHAPE)
  x = images()
  variables = model.init(jax.random.PRNGKey(0), x)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params']['encoder_0'])
  expected = np.tanh(np.asarray(x, np.float64).reshape(5, 12) @ p['kernel'] + p['bias'])
  np.testing.assert_allclose(model.apply(variables, x, method='encode'), expected, atol=1e-6)


def test_bernoulli_vae_draws_pixels_with_the_decoded_probabilities():
  # One key gives the same z to both calls, so each binary draw is Bernoulli(mean). With the
  # last decoder bias at +3 on half the pixels and −3 on the others, the pixels' frequencies
  # of 1 over n draws are within 4 SE of the mean probabilities (a draw with 1 − p would be
  # far off).
  model = _vae()
  variables = jax.tree.map(lambda a: jnp.full(a.shape, 0.1, jnp.float32),
                           jax.eval_shape(model.init, _RNGS, images()))
  variables['params']['decoder_layers_1']['bias'] = jnp.asarray(
      np.where(np.arange(12) % 2, 3.0, -3.0), jnp.float32)
  n, key = 4000, jax.random.PRNGKey(3)
  probs, draws = jax.jit(lambda v: [model.apply(v, n, key, method='sample', mean=m)
                                    for m in (True, False)])(variables)
  draws, probs = np.asarray(draws, np.float64), np.asarray(probs, np.float64)
  assert set(np.unique(draws)) <= {0.0, 1.0}
  se = np.sqrt(probs.mean(0) * (1 - probs.mean(0)) / n)
  assert np.all(np.abs(draws.mean(0) - probs.mean(0)) < 4 * se + 1e-3)
  assert np.all(np.abs(probs.mean(0) - 0.5) > 0.3)  # the pixels are far from even odds


def test_decoders_mirror_the_encoders_hidden_widths():
  # Encoder 12 → 5 → 3 → K = 2, decoder 2 → 3 → 5 → 12 (the hidden widths reversed).
  x = images()
  shapes = lambda model, rngs: jax.tree.map(jnp.shape, jax.eval_shape(model.init, rngs, x))['params']
  model = autoencoders.Autoencoder(latent_dim=2, hidden_sizes=(5, 3), image_shape=SHAPE)
  kernels = {name: p['kernel'] for name, p in shapes(model, jax.random.PRNGKey(0)).items()}
  assert kernels == {'encoder_0': (12, 5), 'encoder_1': (5, 3), 'encoder_2': (3, 2),
                     'decoder_0': (2, 3), 'decoder_1': (3, 5), 'decoder_2': (5, 12)}
  vae = autoencoders.VAE(latent_dim=2, hidden_sizes=(5, 3), image_shape=SHAPE)
  kernels = {name: p['kernel'] for name, p in shapes(vae, _RNGS).items()}
  assert kernels == {'encoder_layers_0': (12, 5), 'encoder_layers_1': (5, 3),
                     'posterior_mean': (3, 2), 'posterior_log_var': (3, 2),
                     'decoder_layers_0': (2, 3), 'decoder_layers_1': (3, 5),
                     'decoder_layers_2': (5, 12)}


@pytest.mark.parametrize('name', ['autoencoder', 'vae'])
def test_decoding_codes_of_another_width_than_latent_dim_is_one_sentence(name):
  # Flax used to stop on the decoder's first kernel (ScopeParamShapeError).
  model = registry.build(name, image_shape=SHAPE, latent_dim=2, hidden_sizes=(6,))
  variables = jax.eval_shape(model.init, _RNGS, images())
  owner = 'VAE' if name == 'vae' else 'Autoencoder'
  with pytest.raises(ValueError, match=rf'{owner} decodes codes \[\.\.\., latent_dim\] = '
                                       r'\[\.\.\., 2\], got shape \(3, 5\)\.'):
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((3, 5)), method=model.decode), variables)
  out = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((3, 2)), method=model.decode), variables)
  assert jax.tree.leaves(out)[0].shape == (3,) + SHAPE


def test_vae_sample_of_a_negative_count_is_one_sentence():
  # It used to stop in MLIR ('invalid tensor dimension size').
  model = _vae()
  variables = jax.eval_shape(model.init, _RNGS, images())
  with pytest.raises(ValueError, match=r'VAE sample num must be an integer >= 0, got -1\.'):
    jax.eval_shape(lambda v: model.apply(v, -1, jax.random.PRNGKey(0), method=model.sample),
                   variables)
