"""The generative-metrics command: its features are the classifier's pooled activations (the
input of the ResNet's 'head', checked against the last block's output and the logits), the
cold sampler's flat start, pixel rounding, the ODE's bits per dimension against the Gaussian
density of pixels in [0, 1], the floor's distance against the classifier applied by hand to
pixels, the weights a row records, and one-sentence errors before anything loads."""

import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments import generative_metrics
from experiments.configs import digits_mlp
from models.generative import frechet
from models.generative import likelihood
from models.generative import sde
from models.vision import resnet
from tests.experiments import fake_runs
from tests.experiments.test_plot_vae import _config as vae_config
from tests.messages import one_sentence
from tests.train.test_diffusion_task import ExactEps
from train import checkpoint, loop, tasks


def test_features_are_the_input_of_the_classifier_head():
  module = resnet.ResNet(num_classes=3, stage_sizes=(1, 1), stage_widths=(4, 8), stem_width=4,
                         small_input_stem=True)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 1))
  variables = module.init(jax.random.PRNGKey(1), x)
  features = generative_metrics.layer_input(module, variables, (x,), 'head')
  logits, captured = module.apply(variables, x, capture_intermediates=True)
  last_block = captured['intermediates']['stage2_block1']['__call__'][0]
  # The global average pool of the last block's output, which the head maps to the logits.
  np.testing.assert_allclose(features, last_block.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
  head = variables['params']['head']
  np.testing.assert_allclose(features @ head['kernel'] + head['bias'], logits, rtol=1e-4,
                             atol=1e-5)
  with pytest.raises(ValueError, match="--feature_layer='neck' is not a layer"):
    generative_metrics.layer_input(module, variables, (x,), 'neck')


def test_ode_bits_per_dim_is_the_gaussian_density_of_the_dequantised_pixels():
  # ExactEps is the ε-network of data N(0, c²) in the network's [−1, 1]; at t = ε its VP SDE
  # has p_ε = N(0, v), v = a(ε)² c² + σ(ε)², so y = (x + 1)/2 in [0, 1] has density
  # N(0.5, v/4), written here in y directly, and bits/dim = E_u[−log p(y)]/(D ln 2) + 8.
  task = tasks.build('diffusion', {'features': ('image',), 'shapes': {'image': (2, 2, 1)}},
                     objective='ddpm')
  rng = np.random.default_rng(0)
  pixels = np.clip(np.round(rng.normal(128, 40, size=(512, 2, 2, 1))), 0, 255).astype(np.uint8)
  source = [{'image': image, 'label': np.int32(0)} for image in pixels]
  eps = 1e-3
  mean, se = generative_metrics.ode_bits_per_dim(task, ExactEps(), {}, source, num=512, steps=20,
                                                 seed=0, batch_size=256, eps=eps)
  sde, _ = task.score_model(lambda x, t: x)
  a, sigma = (float(np.asarray(v).reshape(-1)[0]) for v in sde.marginal(np.ones((1, 1)),
                                                                         np.full((1,), eps)))
  variance_y = (a**2 * ExactEps.C**2 + sigma**2) / 4
  y = (pixels[None].astype(np.float64) + rng.uniform(size=(64,) + pixels.shape)) / 256
  nll = np.sum(0.5 * (y - 0.5)**2 / variance_y + 0.5 * np.log(2 * np.pi * variance_y),
               axis=(2, 3, 4)).mean()
  expected = nll / (4 * np.log(2)) + 8
  # Measured: 7.3708 against 7.3711, 0.01 standard errors (SE 0.024 bits/dim: dequantisation,
  # probe and images). Without the D log 2 of [−1, 1] → [0, 1] it would be 1 bit/dim off.
  assert 0.005 < se < 0.05, se
  assert abs(mean - expected) < 4 * se, (mean, expected, se)


def test_ode_bits_per_dim_draws_new_dequantisation_and_probe_keys_in_every_batch(monkeypatch):
  # The keys each batch's dequantisation and probe are drawn with, recorded from inside the jit:
  # one key for every batch would give every batch the same noise.
  keys = {'dequantize': [], 'probe': []}
  record = lambda name, key: jax.debug.callback(lambda k: keys[name].append(np.asarray(k)), key)
  real_dequantize = likelihood.dequantize

  def dequantize(key, pixels):
    record('dequantize', key)
    return real_dequantize(key, pixels)

  def ode_log_likelihood(_, __, x, key, **unused):
    record('probe', key)
    return -jnp.sum(x**2, axis=(1, 2, 3))

  monkeypatch.setattr(likelihood, 'dequantize', dequantize)
  monkeypatch.setattr(sde, 'ode_log_likelihood', ode_log_likelihood)
  task = tasks.build('diffusion', {'features': ('image',), 'shapes': {'image': (2, 2, 1)}},
                     objective='ddpm')
  source = [{'image': np.full((2, 2, 1), 100, np.uint8), 'label': np.int32(0)}] * 3
  generative_metrics.ode_bits_per_dim(task, ExactEps(), {}, source, num=3, steps=2, seed=0,
                                      batch_size=1)
  drawn = [tuple(k.reshape(-1)) for k in keys['dequantize'] + keys['probe']]
  assert len(drawn) == 6 and len(set(drawn)) == 6, drawn


def test_cold_starts_follow_the_degraded_training_images():
  rng = np.random.default_rng(0)
  # "Degraded images" with per-image channel means N(0.2, 0.1²) and N(−0.3, 0.05²) and a
  # correlated spatial pattern.
  levels = rng.normal([0.2, -0.3], [0.1, 0.05], size=(4000, 2))
  pattern = rng.normal(size=(4000, 1, 1, 1)) * np.linspace(-1, 1, 16).reshape(1, 4, 4, 1) * 0.2
  degraded = levels[:, None, None, :] + pattern + rng.normal(size=(4000, 4, 4, 2)) * 0.01
  flat = np.asarray(generative_metrics.cold_start(jax.random.PRNGKey(0), degraded, 2000, 'flat',
                                                  0.002), np.float64)
  assert flat.shape == (2000, 4, 4, 2)
  # Flat up to the per-pixel noise …
  within = flat - flat.mean(axis=(1, 2), keepdims=True)
  assert within.std() == pytest.approx(0.002 * np.sqrt(15 / 16), rel=0.05)
  # … at levels drawn from the Gaussian of the channel means (4 standard errors).
  drawn = flat.mean(axis=(1, 2))
  np.testing.assert_allclose(drawn.mean(0), [0.2, -0.3], atol=4 * 0.1 / np.sqrt(2000))
  np.testing.assert_allclose(drawn.std(0), [0.1, 0.05], rtol=4 / np.sqrt(2 * 2000))
  # The Gaussian start has the degraded images' mean and covariance over all 32 pixels, within
  # 4 standard errors at 2,000 draws of pixels whose variances reach 0.05: 0.02 for the means
  # (measured 0.0029) and 0.006 for the covariances (measured 0.0013).
  gaussian = np.asarray(generative_metrics.cold_start(jax.random.PRNGKey(1), degraded, 2000),
                        np.float64).reshape(2000, -1)
  reference = degraded.reshape(4000, -1)
  np.testing.assert_allclose(gaussian.mean(0), reference.mean(0), atol=0.02)
  np.testing.assert_allclose(np.cov(gaussian.T), np.cov(reference.T), atol=0.006)
  with pytest.raises(ValueError, match="--cold_start='noise'; allowed: gaussian, flat"):
    generative_metrics.cold_start(jax.random.PRNGKey(1), degraded, 2, 'noise')


def test_flat_cold_start_levels_keep_the_correlation_of_the_channel_means():
  # Channel means with c₁ = 2 c₀ + 1 + N(0, 0.01²), c₀ ~ N(0, 0.1²): correlation 0.999 (the
  # fitted Gaussian's full covariance, not only the variance of each channel).
  rng = np.random.default_rng(0)
  first = rng.normal(0, 0.1, 500)
  degraded = np.stack([first, 2 * first + 1 + rng.normal(0, 0.01, 500)], -1)[:, None, None]
  levels = np.asarray(generative_metrics.cold_start(jax.random.PRNGKey(0), degraded, 1000,
                                                    'flat', noise=0.0))[:, 0, 0]
  assert np.corrcoef(levels.T)[0, 1] > 0.99


def test_samples_become_the_nearest_pixels():
  pixels = generative_metrics.to_pixels(np.array([-0.1, 0.0, 0.4999 / 255, 0.5 / 255 + 1e-9,
                                                  127.6 / 255, 1.0, 1.3]))
  np.testing.assert_array_equal(pixels, [0, 0, 0, 1, 128, 255, 255])
  assert pixels.dtype == np.uint8
  # D3PM's binarisation: 128 and above are on.
  np.testing.assert_array_equal(generative_metrics.binary(np.array([0, 127, 128, 255], np.uint8)),
                                [0, 0, 255, 255])


def test_the_time_grids_are_the_solvers():
  assert generative_metrics.TIME_GRIDS == sde.TIME_GRIDS


def test_binarised_pixels_are_255_from_128_on():
  np.testing.assert_array_equal(generative_metrics.binary(np.array([0, 1, 127, 128, 200, 255])),
                                [0, 0, 0, 255, 255, 255])
  assert generative_metrics.binary([128]).dtype == np.uint8


def test_features_of_more_than_a_chunk_are_those_of_every_image_once():
  """1,001 images: chunks of 500, 500 and 1. The head takes the prepared images [N, H, W, C]
  themselves, so the features are each image's prepared pixels, flattened."""

  class Head(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(1, name='head')(x)

  task = types.SimpleNamespace(
      input_key='image', preprocess=lambda batch: {'input': batch['image'] / np.float32(255)},
      transform=lambda rngs, batch, train: batch, model_inputs=lambda batch: (batch['input'],))
  variables = {'params': {'head': {'kernel': np.ones((2, 1), np.float32),
                                   'bias': np.zeros(1, np.float32)}}}
  pixels = np.random.default_rng(0).integers(0, 256, size=(1001, 3, 2, 2), dtype=np.uint8)
  features = generative_metrics.feature_fn(task, Head(), variables, 'head')(pixels)
  assert features.shape == (1001, 12) and features.dtype == np.float64
  np.testing.assert_allclose(features, pixels.reshape(1001, 12) / 255, rtol=1e-6)


def test_vae_samples_are_sigmoids_of_prior_draws_new_in_every_batch_and_seed():
  """A decoder whose logits are the latent z itself: samples are sigmoid(z), z ~ N(0, I), so
  their logits have mean 0 and standard deviation 1; 5 samples in batches of 2, 2 and 1 are
  all different, and another seed draws others."""

  class Decoder(nn.Module):
    latent_dim: int = 32

    def decode(self, z):
      return z.reshape(len(z), 4, 4, 2), None

    def __call__(self, z):
      return self.decode(z)

  config = ml_collections.ConfigDict({'task': {'name': 'vae'}, 'model': {'name': 'vae'}})

  def draw(seed):
    images, seconds = generative_metrics.draw_samples(
        config, None, Decoder(), {}, None, sampler='vae', steps=0, num=5, batch_size=2,
        seed=seed)
    return np.asarray(images, np.float64), seconds

  # The clock read before and after the 3 batches: 10 s for 5 samples.
  clock = iter([1.0, 11.0])
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(generative_metrics, 'time',
                  types.SimpleNamespace(perf_counter=lambda: next(clock)))
    images, seconds = draw(0)
  assert seconds == 2.0
  assert images.shape == (5, 4, 4, 2)
  logits = np.log(images / (1 - images))
  # 160 draws of N(0, 1): mean within 4 standard errors (0.32), std within 0.3.
  assert abs(logits.mean()) < 0.32 and abs(logits.std() - 1) < 0.3, (logits.mean(), logits.std())
  flat = images.reshape(5, -1)
  assert len({row.tobytes() for row in flat}) == 5
  assert not np.any(np.isclose(draw(1)[0].reshape(5, -1), flat).all(axis=1))


def test_cold_samples_restore_the_start_and_map_to_unit_pixels():
  """D(x, t) = (1 − t/T) x ends at D(x_0, T) = 0, so the Gaussian start fitted to the degraded
  training images is x_T = 0, and a restorer that returns a fixed image y makes Algorithm 2
  telescope to x_0 = x_T − D(y, T) + D(y, 0) = y: the samples are (y + 1)/2 in [0, 1]."""
  steps = 3
  task = types.SimpleNamespace(
      objective='cold', process_steps=steps, preprocess=lambda records: {'x0': records['image']},
      model_fn=lambda apply: apply,
      degrade_fn=lambda x0: lambda x, t: x * (1 - jnp.asarray(t, jnp.float32).reshape(
          (-1, 1, 1, 1)) / steps))
  target = np.linspace(-0.9, 0.9, 16, dtype=np.float32).reshape(4, 4, 1)
  module = types.SimpleNamespace(apply=lambda variables, x, t: jnp.broadcast_to(target, x.shape))
  train = [{'image': image} for image in np.random.default_rng(0).uniform(
      -1, 1, size=(6, 4, 4, 1)).astype(np.float32)]
  config = ml_collections.ConfigDict({'task': {'name': 'diffusion'}, 'model': {'name': 'unet'}})
  images, _ = generative_metrics.draw_samples(config, task, module, {}, train, sampler='cold',
                                              steps=0, num=2, batch_size=2, seed=0)
  np.testing.assert_allclose(images, np.broadcast_to((target + 1) / 2, (2, 4, 4, 1)), atol=1e-6)


def test_cold_restoration_errors_are_mean_l1_in_unit_pixels(tmp_path):
  """A restorer that returns x_0 + e whatever it is given: Algorithm 1 returns x_0 + e and
  Algorithm 2 x_0 + e − A_t e (models/generative/cold.py) for the degradation
  D(x, t) = A_t x, A_t = 1 − t/(2T). In [0, 1] pixels, (x + 1)/2, the mean ℓ1 errors are e/2
  and (1 − A_t) e/2: with e = 0.2, T = 4, 0.1 and 0.025 at t = 2, 0.1 and 0.05 at t = 4."""
  steps, error = 4, 0.2
  task = types.SimpleNamespace(
      process_steps=steps, preprocess=lambda records: {'x0': records['image']},
      model_fn=lambda apply: apply,
      degrade_fn=lambda x0: lambda x, t: x * (1 - jnp.asarray(t, jnp.float32)[..., None, None,
                                                                          None] / (2 * steps)))
  images = np.linspace(-0.5, 0.5, 5 * 16, dtype=np.float32).reshape(5, 4, 4, 1)
  module = types.SimpleNamespace(
      apply=lambda variables, x, t: jnp.broadcast_to(variables['target'], x.shape))
  errors = generative_metrics.cold_restorations(
      task, module, {'target': images[:3] + error}, [{'image': image} for image in images],
      num=3, out_dir=str(tmp_path))
  assert errors == pytest.approx({'restore_l1_naive_t2': 0.1, 'restore_l1_improved_t2': 0.025,
                                  'restore_l1_naive_t4': 0.1, 'restore_l1_improved_t4': 0.05},
                                 abs=1e-6)


def test_every_setting_draws_its_own_sample_grid():
  settings = [('ancestral', 100, 'ema', 'gaussian', 'uniform', 0),
              ('ancestral', 100, 'params', 'gaussian', 'uniform', 0),
              ('ancestral', 1000, 'ema', 'gaussian', 'uniform', 0),
              ('ancestral', 100, 'ema', 'gaussian', 'uniform', 1),
              ('ode', 25, 'ema', 'gaussian', 'uniform', 0), ('ode', 25, 'ema', 'gaussian', 'log', 0),
              ('cold', 50, 'params', 'gaussian', 'uniform', 0),
              ('cold', 50, 'params', 'flat', 'uniform', 0), ('data', 0, 'ema', 'gaussian', 'uniform', 0)]
  names = [generative_metrics.grid_name(*setting) for setting in settings]
  assert len(set(names)) == len(settings), names
  # The names of the README's figures stay as they were.
  assert names[0] == 'ancestral_100_ema' and names[4] == 'ode_25_ema' and names[-1] == 'data_0'


@pytest.mark.parametrize('options, error, message', [
    ({'workdir': 'somewhere', 'sampler': 'data'}, ValueError, '--sampler=data takes no --workdir'),
    ({'workdir': None, 'sampler': 'ode'}, ValueError, 'every other sampler needs one'),
    ({'workdir': None, 'sampler': 'data', 'num_samples': 1}, ValueError,
     '--num_samples=1 is too small; give at least 2'),
    ({'workdir': None, 'sampler': 'data', 'weights': 'average'}, ValueError,
     "--weights='average'; allowed: ema, params"),
    ({'workdir': None, 'sampler': 'data', 'seed': -1}, ValueError,
     '--seed=-1 is too small; give at least 0.'),
    ({'workdir': None, 'sampler': 'data', 'likelihood_eps': 0.0}, ValueError,
     '--likelihood_eps=0.0 must lie in'),
    ({'workdir': None, 'sampler': 'data', 'ode_grid': 'log'}, ValueError,
     '--ode_grid=log is the time grid of --sampler=ode, not of --sampler=data'),
    ({'workdir': None, 'sampler': 'data', 'likelihood_grid': 'cosine'}, ValueError,
     "--likelihood_grid='cosine'; allowed: uniform, log"),
    ({'workdir': None, 'sampler': 'data', 'classifier': '/nonexistent/run'}, FileNotFoundError,
     "--classifier='/nonexistent/run' does not exist"),
])
def test_bad_inputs_stop_in_one_sentence(options, error, message):
  arguments = {'classifier': '/nonexistent/run', 'steps': 0, 'num_samples': 8, 'batch_size': 4,
               'seed': 0, **options}
  with pytest.raises(error, match=message.replace('(', r'\(')):
    generative_metrics.measure(**arguments)


def _run(task_name, objective=None, steps=1000, model='unet'):
  """The parts of a run that check_run reads: its config, task and eval split (of 100)."""
  config = ml_collections.ConfigDict({'task': {'name': task_name}, 'model': {'name': model}})
  if objective in ('ddpm', 'score_sde'):  # the real task: check_run reads its SDE for 'pc'
    return config, tasks.build('diffusion', {'features': ('image',)}, objective=objective,
                               num_steps=steps), range(100)
  return config, types.SimpleNamespace(objective=objective, process_steps=steps), range(100)


@pytest.mark.parametrize('run, options, message', [
    (('diffusion', 'ddpm'), {'sampler': 'ancestral', 'steps': 1001},
     "--steps=1001 exceeds the 1000 steps of the run's ddpm process; give 0 (all of them) to "
     '1000.'),
    (('diffusion', 'ddpm'), {'sampler': 'ddim', 'steps': 1001}, '--steps=1001 exceeds the 1000'),
    (('diffusion', 'cold', 50), {'sampler': 'cold', 'steps': 51},
     "--steps=51 does not apply to --sampler=cold, which starts from D(x_0, T) and takes all "
     "T = 50 steps of the run's cold process; give 0 or 50."),
    # Fewer steps started from D(x_0, 25), not from the D(x_0, T) of the module doc.
    (('diffusion', 'cold', 50), {'sampler': 'cold', 'steps': 25},
     '--steps=25 does not apply to --sampler=cold'),
    (('diffusion', 'd3pm'), {'sampler': 'ancestral', 'steps': 100},
     '--steps=100 does not apply to --sampler=ancestral of a d3pm run, which takes every step; '
     'leave it at 0.'),
    (('vae', None, 0, 'vae'), {'sampler': 'vae', 'steps': 10},
     '--steps=10 does not apply to --sampler=vae of a vae run, which decodes prior draws; leave '
     'it at 0.'),
    (('diffusion', 'ddpm'), {'sampler': 'ancestral', 'bits_per_dim_examples': 101},
     '--bits_per_dim_examples=101 exceeds the 100 test images of the run.'),
    (('diffusion', 'cold', 50), {'sampler': 'cold', 'bits_per_dim_examples': 10},
     '--bits_per_dim_examples needs a ddpm or score_sde run.'),
    (('diffusion', 'score_sde'), {'sampler': 'ancestral'},
     '--sampler=ancestral does not sample a score_sde run; allowed: pc, ode.'),
    (('vae', None, 0, 'vae'), {'sampler': 'ode'}, "--sampler=ode does not sample the run in 'w'"),
    # The PC sampler's fewest steps (models/generative/sde.py: min_pc_steps), refused here
    # rather than by pc_sample, as num_steps, once the classifier's features are compiled.
    (('diffusion', 'ddpm'), {'sampler': 'pc', 'steps': 10},
     "--steps=10 is too few for --sampler=pc of the run's ddpm process, whose discrete β(t)·h "
     'must stay below 1; give at least 20.'),
    (('diffusion', 'score_sde'), {'sampler': 'pc', 'steps': 19}, '--steps=19 is too few'),
])
def test_settings_the_run_cannot_take_are_one_sentence(run, options, message):
  settings = {'steps': 0, 'bits_per_dim_examples': 0, **options}
  one_sentence(lambda: generative_metrics.check_run('w', *_run(*run), **settings), message)


@pytest.mark.parametrize('run, options', [
    (('diffusion', 'ddpm'), {'sampler': 'ancestral', 'steps': 1000, 'bits_per_dim_examples': 100}),
    (('diffusion', 'ddpm'), {'sampler': 'pc', 'steps': 2000}),  # a solver's grid, any length
    (('diffusion', 'ddpm'), {'sampler': 'pc', 'steps': 20}),  # the PC sampler's fewest
    (('diffusion', 'score_sde'), {'sampler': 'pc'}),  # 0: its 1,000
    (('diffusion', 'score_sde'), {'sampler': 'ode', 'steps': 5000}),
    (('diffusion', 'cold', 50), {'sampler': 'cold', 'steps': 50}),
    (('diffusion', 'cold', 50), {'sampler': 'cold'}),
    (('diffusion', 'd3pm'), {'sampler': 'ancestral'}),
    (('vae', None, 0, 'vae'), {'sampler': 'vae'}),
])
def test_settings_the_run_takes_pass(run, options):
  settings = {'steps': 0, 'bits_per_dim_examples': 0, **options}
  generative_metrics.check_run('w', *_run(*run), **settings)


def test_a_negative_cold_noise_is_one_sentence():
  one_sentence(lambda: generative_metrics.measure(
      classifier='/nonexistent/run', workdir='w', sampler='cold', steps=0, num_samples=8,
      batch_size=4, seed=0, cold_noise=-0.1), '--cold_noise=-0.1 must be at least 0.')


@pytest.fixture(scope='module')
def classifier_run(tmp_path_factory, data_dir):
  """A tiny ResNet on digits (pixels 0..16, scaled by 1/16 and normalised by the task, no
  parameter average) whose checkpoint holds random parameters."""
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.model = ml_collections.ConfigDict({
      'name': 'resnet20', 'stage_sizes': (1,), 'stage_widths': (4,), 'stem_width': 4,
      'dtype': 'float32'})
  config.task.input_mean, config.task.input_std = (0.3,), (0.4,)
  config.global_batch_size, config.eval_batch_size = 8, 120
  rng = np.random.default_rng(0)

  def draw(path, leaf):  # kernels N(0, 1/fan-in), BatchNorm scales and variances 1
    name = jax.tree_util.keystr(path[-1:], simple=True)
    if name == 'kernel':
      return rng.normal(size=leaf.shape).astype(leaf.dtype) / np.sqrt(np.prod(leaf.shape[:-1]))
    return np.full(leaf.shape, name in ('scale', 'var'), leaf.dtype)

  return fake_runs.save_random_run(config, str(tmp_path_factory.mktemp('classifier')),
                                   draw=draw)


@pytest.fixture(scope='module')
def vae_run(tmp_path_factory, data_dir):
  return fake_runs.save_random_run(vae_config(data_dir), str(tmp_path_factory.mktemp('vae')))


def test_the_floor_is_the_distance_of_the_classifier_features_of_pixels(classifier_run):
  row = generative_metrics.measure(classifier=classifier_run, workdir=None, sampler='data',
                                   steps=0, num_samples=40, batch_size=40, seed=3)
  # The classifier applied by hand to pixels, as its task prepares them: x = (p/16 − 0.3)/0.4.
  config = loop.read_config(classifier_run)
  train, test, _, _, module = loop.build_parts(config, classifier_run)
  variables = checkpoint.eval_variables(checkpoint.restore_arrays(classifier_run))
  order = np.sort(np.random.default_rng(3).permutation(len(train))[:40])

  def features(source, indices):
    pixels = np.stack([source[int(i)]['image'] for i in indices]).astype(np.float32)
    x = (pixels / 16 - 0.3) / 0.4
    return generative_metrics.layer_input(module, variables, (x,), 'head')

  expected = frechet.frechet_distance(
      *frechet.feature_statistics(features(train, order)),
      *frechet.feature_statistics(features(test, range(len(test)))))
  assert row['frechet_distance'] == pytest.approx(expected, rel=1e-4)
  assert os.path.exists(os.path.join(classifier_run, 'samples', 'data_0_seed3_n40.png'))


def test_a_classifier_that_is_not_a_classification_run_is_one_sentence(vae_run):
  # Its task's transform needed a 'dequantize' stream: a KeyError traceback.
  one_sentence(lambda: generative_metrics.measure(
      classifier=vae_run, workdir=None, sampler='data', steps=0, num_samples=8, batch_size=8,
      seed=0), f"--classifier={os.path.abspath(vae_run)!r} is a run of task 'vae' (model "
      "'vae'); give a run of task 'classification'.")


def test_a_run_without_a_parameter_average_records_the_parameters(classifier_run, vae_run):
  row = generative_metrics.measure(classifier=classifier_run, workdir=vae_run, sampler='vae',
                                   steps=0, num_samples=8, batch_size=8, seed=0, weights='ema')
  assert row['weights'] == 'params'
  assert os.path.exists(os.path.join(vae_run, 'samples', 'vae_0_params_n8_batch8.png'))
  assert not os.path.exists(os.path.join(vae_run, 'samples', 'vae_0_ema_n8_batch8.png'))


def test_weights_params_of_a_run_with_an_average_are_its_parameters(tmp_path, monkeypatch):
  # The checkpoint's parameter average was taken whatever --weights asked for.
  config = ml_collections.ConfigDict({'task': {'name': 'diffusion'}, 'model': {'name': 'unet'}})
  monkeypatch.setattr(loop, 'read_config', lambda workdir: config)
  monkeypatch.setattr(loop, 'build_parts', lambda config, workdir: (None,) * 5)
  monkeypatch.setattr(checkpoint, 'restore_arrays', lambda workdir: {
      'step': 7, 'params': {'w': 1.0}, 'ema_params': {'w': 2.0}, 'model_state': None})
  for weights, w in (('ema', 2.0), ('params', 1.0)):
    *_, variables, step, taken = generative_metrics._load(str(tmp_path), 'workdir', weights)
    assert (variables, step, taken) == ({'params': {'w': w}}, 7, weights)


def test_the_pixels_compared_are_the_images_binarised_when_asked_or_for_d3pm(tmp_path,
                                                                            monkeypatch):
  """The pixels measure gives the classifier: the test images (all of them may be drawn) and
  the samples, both binarised (≥ 128 → 255) with --binarize or for a d3pm run."""
  pattern = np.array([[0, 127], [128, 255]], np.uint8)[..., None]
  binarised = np.array([[0, 0], [255, 255]], np.uint8)[..., None]
  source = [{'image': pattern, 'label': np.int32(0)}] * 4
  c_task = types.SimpleNamespace(input_key='image')
  run_task = types.SimpleNamespace(objective='d3pm', meta={})

  def load(workdir, what, weights='ema', task_name=None):
    del workdir, task_name
    if what == 'classifier':
      return None, source * 2, source, c_task, None, None, None, None
    return None, None, None, run_task, None, None, 3, weights

  seen = []

  def features(pixels):
    seen.append(np.asarray(pixels))
    return np.random.default_rng(len(seen)).normal(size=(len(pixels), 2))

  monkeypatch.setattr(generative_metrics, '_load', load)
  monkeypatch.setattr(generative_metrics, 'feature_fn', lambda *args: features)
  monkeypatch.setattr(generative_metrics, 'check_run', lambda *args, **kwargs: None)
  monkeypatch.setattr(generative_metrics, 'draw_samples', lambda *args, num, **kwargs: (
      np.repeat(pattern[None] / 255, num, 0), 0.0))
  monkeypatch.chdir(tmp_path)  # a relative --classifier is recorded as its absolute path
  common = dict(classifier='.', steps=0, num_samples=4, batch_size=4, seed=0)
  for sampler, workdir, binarize, expected in (('data', None, False, pattern),
                                               ('data', None, True, binarised),
                                               ('vae', str(tmp_path), False, binarised)):
    seen.clear()
    row = generative_metrics.measure(workdir=workdir, sampler=sampler, binarize=binarize,
                                     **common)
    assert row['classifier'] == str(tmp_path) and row['binarize'] == (expected is binarised)
    reference, samples = seen
    np.testing.assert_array_equal(reference, np.repeat(expected[None], 4, 0))
    # A d3pm run's samples are binary already; the data's are binarised here.
    np.testing.assert_array_equal(samples, np.repeat((pattern if sampler == 'vae'
                                                      else expected)[None], 4, 0))


def test_floors_of_other_images_keep_their_own_sample_grids(classifier_run):
  # The grey floor's grid was replaced by the binarised floor's (both data_0.png), and the
  # floor at one N by the floor at another.
  def floor(**options):
    generative_metrics.measure(classifier=classifier_run, workdir=None, sampler='data',
                               steps=0, batch_size=8, seed=5, **options)
  samples = os.path.join(classifier_run, 'samples')
  floor(num_samples=20)
  with open(os.path.join(samples, 'data_0_seed5_n20.png'), 'rb') as f:
    grey = f.read()
  floor(num_samples=20, binarize=True)
  floor(num_samples=30)
  names = ['data_0_seed5_n20.png', 'data_0_seed5_n20_binary.png', 'data_0_seed5_n30.png']
  drawn = {}
  for name in names:
    with open(os.path.join(samples, name), 'rb') as f:
      drawn[name] = f.read()
  assert drawn[names[0]] == grey and len(set(drawn.values())) == 3
  # Settings that change the samples of a run name their grids apart too.
  settings = [dict(num_samples=256, batch_size=128), dict(num_samples=64, batch_size=128),
              dict(num_samples=256, batch_size=64)]
  assert len({generative_metrics.grid_name('ancestral', 100, 'ema', 'gaussian', 'uniform', 0,
                                           **setting) for setting in settings}) == 3
  assert generative_metrics.grid_name('cold', 0, 'ema', 'gaussian', 'uniform', 0,
                                      cold_noise=0.01) == 'cold_0_ema_gaussian_noise0.01'


def test_cold_restorations_of_other_weights_or_counts_keep_their_own_figures(tmp_path):
  # Every call drew samples/cold_restore_<t>.png: a row with --weights=params replaced the
  # figure of the parameter average's row, and one of another --batch_size too.
  steps = 4
  task = types.SimpleNamespace(
      process_steps=steps, preprocess=lambda records: {'x0': records['image']},
      model_fn=lambda apply: apply,
      degrade_fn=lambda x0: lambda x, t: x * (1 - jnp.asarray(t, jnp.float32)[..., None, None,
                                                                          None] / (2 * steps)))
  module = types.SimpleNamespace(apply=lambda variables, x, t: x * variables['gain'])
  images = np.linspace(-1, 1, 6 * 16, dtype=np.float32).reshape(6, 4, 4, 1)
  source = [{'image': image} for image in images]
  errors = {}
  for weights, gain, num in (('ema', 1.0, 5), ('params', 1.5, 5), ('ema', 1.0, 6)):
    errors[weights, num] = generative_metrics.cold_restorations(
        task, module, {'gain': gain}, source, num=num, out_dir=str(tmp_path), weights=weights)
  drawn = sorted(os.listdir(tmp_path / 'samples'))
  assert drawn == [f'cold_restore_{t}_{w}_n{n}.png' for t in (2, 4)
                   for w, n in (('ema', 5), ('ema', 6), ('params', 5))]
  assert errors['ema', 5] != errors['params', 5]


def test_a_row_file_that_is_a_folder_is_refused_before_anything_loads(tmp_path, monkeypatch):
  # It was an IsADirectoryError traceback after the samples were drawn and measured.
  (tmp_path / generative_metrics.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(generative_metrics, '_load', lambda *a, **k: pytest.fail('loaded'))
  one_sentence(lambda: generative_metrics.measure(
      classifier=str(tmp_path), workdir=None, sampler='data', steps=0, num_samples=8,
      batch_size=8, seed=0), f"'{tmp_path / generative_metrics.OUTPUT_FILE}', the file the row is "
      'appended to, is a folder.')
