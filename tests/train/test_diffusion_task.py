"""The diffusion task's objectives against their expected values for Gaussian data, where the
best predictor is known in closed form, computed here from the papers' formulas (not from
models/generative); the d3pm and sampling paths by shape and range; option errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.generative.time_mlp import TimeMLP
from tests.messages import one_sentence
from train import tasks
from train.tasks import base
from train.tasks import diffusion

N, D = 4096, 2


class Stub:
  """A model for `task.loss`: a function of (x_t, t) and the step's 'diffusion' key."""

  def __init__(self, fn, seed=0):
    self.fn, self.rngs = fn, {'diffusion': jax.random.PRNGKey(seed)}

  def __call__(self, x, t):
    return self.fn(x, t)


def _loss(task, fn, x0):
  batch = task.preprocess({task.input_key: x0})
  total_B, weight_B = task.loss(Stub(fn), batch)['loss']
  values = np.asarray(total_B) / np.asarray(weight_B)
  return values.mean(), values.std() / np.sqrt(len(values))


@pytest.fixture(scope='module')
def gaussian_points():
  return np.random.default_rng(0).normal(size=(N, D)).astype(np.float32)


def test_ddpm_loss_is_the_noise_error_per_dimension(gaussian_points):
  task = tasks.build('diffusion', {'features': ('x',)}, objective='ddpm', input_key='x')
  # x_0 ~ N(0, I): x_t ~ N(0, I) too, and E[ε | x_t] = √(1 − ᾱ_t) x_t, whose error per
  # dimension is 1 − (1 − ᾱ_t) = ᾱ_t; ᾱ_t from Ho et al.'s linear β, t uniform on 1 … 1,000.
  alpha_bars = np.cumprod(1 - np.linspace(1e-4, 0.02, 1000))
  best = lambda x, t: jnp.sqrt(1 - jnp.asarray(alpha_bars, jnp.float32)[t - 1])[:, None] * x
  mean, se = _loss(task, best, gaussian_points)
  assert abs(mean - alpha_bars.mean()) < 4 * se, (mean, alpha_bars.mean(), se)
  # Predicting 0 leaves the whole noise: 1 per dimension.
  mean, se = _loss(task, lambda x, t: jnp.zeros_like(x), gaussian_points)
  assert abs(mean - 1) < 4 * se and alpha_bars.mean() < 0.5


def test_score_sde_loss_at_the_exact_score(gaussian_points):
  task = tasks.build('diffusion', {'features': ('x',)}, objective='score_sde', sde='vp',
                     input_key='x')
  # VP SDE (β from 0.1 to 20): m(t) = exp(−¼ t²(β₁ − β₀) − ½ t β₀), s² = 1 − m², so
  # N(0, I) data stays N(0, I) and its score is −x_t. The network's output o gives the score
  # −o/s, so the exact score is o = s·x_t, and the weighted loss ‖s·score + z‖² per dimension
  # is s²m² + (1 − s²)² = m², averaged over t ~ U[ε, 1].
  m = lambda t: np.exp(-0.25 * t ** 2 * 19.9 - 0.05 * t)
  std = lambda t: jnp.sqrt(1 - jnp.exp(-0.5 * t ** 2 * 19.9 - 0.1 * t))
  t_grid = np.linspace(1e-5, 1, 100_001)
  expected = np.mean(m(t_grid) ** 2)
  mean, se = _loss(task, lambda x, t: std(t)[:, None] * x, gaussian_points)
  assert abs(mean - expected) < 4 * se, (mean, expected, se)
  mean, se = _loss(task, lambda x, t: jnp.zeros_like(x), gaussian_points)
  assert abs(mean - 1) < 4 * se and expected < 0.5


def test_cold_loss_of_the_identity_restorer_counts_the_masked_pixels():
  steps, h, w = 10, 4, 5
  task = tasks.build('diffusion', {'features': ('image',)}, objective='cold',
                     degradation='mask', num_steps=steps)
  # Constant images of 255 are 1 after scaling; the mask writes 0, so the identity restorer
  # errs by 1 on each masked pixel: ⌈tN/T⌉ / N of them at step t ~ U{1 … T}.
  images = np.full((N, h, w, 1), 255, np.uint8)
  batch = task.preprocess({'image': images})
  total_B, _ = task.loss(Stub(lambda x, t: x), batch)['loss']
  expected = np.mean([np.ceil(t * h * w / steps) / (h * w) for t in range(1, steps + 1)])
  values = np.asarray(total_B)
  assert abs(values.mean() - expected) < 4 * values.std() / np.sqrt(N), (values.mean(), expected)
  assert set(np.round(values * h * w).astype(int)) <= {int(np.ceil(t * h * w / steps))
                                                     for t in range(1, steps + 1)}


def test_d3pm_binarises_images_and_its_loss_prefers_the_right_predictor():
  task = tasks.build('diffusion', {'features': ('image',)}, objective='d3pm', num_steps=20)
  images = np.zeros((64, 4, 4, 1), np.uint8)
  images[:, :2] = 200  # top half on, bottom half off
  batch = task.preprocess({'image': images})
  assert batch['x0'].dtype == np.int32 and set(np.unique(batch['x0'])) == {0, 1}
  truth = jnp.asarray(batch['x0'][0, ..., 0])
  right = lambda x, t: 10.0 * jax.nn.one_hot(jnp.broadcast_to(truth, x.shape[:3]), 3)
  wrong = lambda x, t: 10.0 * jax.nn.one_hot(jnp.broadcast_to(1 - truth, x.shape[:3]), 3)
  # The network sees the absorbing process's three categories as one-hot channels.
  seen = []
  _loss(task, lambda x, t: seen.append(x.shape) or right(x, t), images)
  assert seen == [(64, 4, 4, 3)]
  right_loss, _ = _loss(task, right, images)
  wrong_loss, _ = _loss(task, wrong, images)
  # Measured 0.65 nats per position for the inverted predictor, against almost 0: only masked
  # positions depend on the prediction, and λ = 0.01 weighs its cross-entropy of about 10.
  assert right_loss < 0.01 and wrong_loss > 0.3, (right_loss, wrong_loss)


def test_uniform_d3pm_has_the_two_categories_of_binary_pixels():
  # The uniform transition has no mask: binarised pixels take K = 2 categories, so the
  # network sees two one-hot channels and gives two logits. With a third category the uniform
  # noise would turn pixels into a value no image holds.
  task = tasks.build('diffusion', {'features': ('image',)}, objective='d3pm', num_steps=20,
                     transition='uniform')
  images = np.zeros((64, 4, 4, 1), np.uint8)
  images[:, :2] = 200
  truth = jnp.asarray(task.preprocess({'image': images})['x0'][0, ..., 0])
  seen = []
  right = lambda x, t: seen.append(x.shape) or 10.0 * jax.nn.one_hot(
      jnp.broadcast_to(truth, x.shape[:3]), 2)
  wrong = lambda x, t: 10.0 * jax.nn.one_hot(jnp.broadcast_to(1 - truth, x.shape[:3]), 2)
  right_loss, _ = _loss(task, right, images)
  assert seen == [(64, 4, 4, 2)]
  wrong_loss, _ = _loss(task, wrong, images)
  # Measured 1.1e-5 and 0.56 nats per position.
  assert right_loss < 0.01 and wrong_loss > 0.3, (right_loss, wrong_loss)


def test_d3pm_hybrid_weight_scales_the_x0_cross_entropy():
  # L_λ = L_{t−1} + λ·(−log p̃(x_0 | x_t)) with the same t and x_t for every λ: with logits
  # that ignore x_t the second term is the mean over pixels of −log softmax(z)[x_0].
  images = np.where(np.random.default_rng(0).uniform(size=(8, 4, 4, 1)) < 0.3, 255,
                    0).astype(np.uint8)
  z = np.array([1.0, -0.5, 0.3])
  constant = lambda x, t: jnp.broadcast_to(jnp.asarray(z, jnp.float32), x.shape[:3] + (3,))
  weighted = {weight: tasks.build('diffusion', {'features': ('image',)}, objective='d3pm',
                                  num_steps=20, hybrid_weight=weight) for weight in (0.0, 0.5)}
  batch = weighted[0.0].preprocess({'image': images})
  losses = jax.jit(lambda batch: {weight: task.loss(Stub(constant), batch)['loss'][0]
                                  for weight, task in weighted.items()})(batch)
  losses = {weight: np.asarray(total_B, np.float64) for weight, total_B in losses.items()}
  log_p = z - np.log(np.exp(z).sum())
  cross_entropy_B = -log_p[(images[..., 0] >= 128).astype(int)].reshape(8, -1).mean(1)
  np.testing.assert_allclose(losses[0.5] - losses[0.0], 0.5 * cross_entropy_B, rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize('shape', [(4, 4, 3), (16,)])
def test_d3pm_refuses_examples_other_than_one_channel_images(shape):
  # One category per pixel: the loss and the samples read channel 0 only, so the other channels
  # of RGB images were never modelled (inverting them left the loss as it was), and of
  # sequences [L] only the first element.
  task = tasks.build('diffusion', {'features': ('image',)}, objective='d3pm', num_steps=20)
  one_sentence(lambda: task.preprocess({'image': np.zeros((8,) + shape, np.uint8)}),
               "task.objective='d3pm' needs one-channel images [H, W, 1]; 'image' holds "
               f'examples of shape {shape}.')


class FlatExamples:
  """A 'module' applying an MLP of examples [B, D] to examples of any shape [B, …]."""

  def __init__(self, model):
    self.model = model

  def apply(self, variables, x, t_B):
    return self.model.apply(variables, x.reshape(x.shape[0], -1), t_B).reshape(x.shape)


@pytest.mark.parametrize('objective', ['ddpm', 'score_sde'])
@pytest.mark.parametrize('shape', [(2,), (2, 2, 1)])
def test_samples_of_an_untrained_network_have_the_data_shape(objective, shape):
  meta = {'features': ('x',), 'shapes': {'x': shape}}
  task = tasks.build('diffusion', meta, objective=objective, input_key='x')
  model = TimeMLP(hidden=(8,), embed_dim=4)
  flat = int(np.prod(shape))
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, flat)), jnp.ones((1,)))
  # VP's reverse-diffusion predictor needs β(t)·dt < 1, so more than 20 steps.
  steps = 4 if objective == 'ddpm' else 25
  x = np.asarray(task.sample(FlatExamples(model), variables, jax.random.PRNGKey(1), 5,
                             steps=steps))
  assert x.shape == (5, *shape) and np.all(np.isfinite(x))
  # Images come back in [0, 1]; the points of real-valued data in their own scale, here
  # beyond [0, 1] (an untrained network's samples are far from the data).
  if len(shape) == 3:
    assert np.all((0 <= x) & (x <= 1))
  else:
    assert np.any((x < 0) | (x > 1))
  # The grid of samples after each evaluation is drawn for images only.
  with_samples = tasks.build('diffusion', meta, objective=objective, input_key='x', num_samples=4)
  assert len(with_samples.eval_hooks()) == (len(shape) == 3)


class ExactEps:
  """A 'module' whose apply is the best ε-predictor of the 1,000-step linear DDPM for data
  N(0, c² I): E[ε | x_t] = √(1 − ᾱ_t) x / (ᾱ_t c² + 1 − ᾱ_t) (Ho et al. 2020, eq. 4), at
  fractional steps by interpolating log ᾱ."""
  C = 0.3

  def __init__(self):
    self.log_alpha_bars = np.concatenate([[0.0], np.cumsum(np.log(1 - np.linspace(1e-4, 0.02,
                                                                                   1000)))])

  def apply(self, variables, x, t_B):
    del variables
    alpha_bar = jnp.exp(jnp.interp(jnp.asarray(t_B, jnp.float32), jnp.arange(1001.0),
                                   jnp.asarray(self.log_alpha_bars, jnp.float32)))
    alpha_bar = alpha_bar.reshape((-1,) + (1,) * (x.ndim - 1))  # against x [B, …]
    return jnp.sqrt(1 - alpha_bar) * x / (alpha_bar * self.C**2 + 1 - alpha_bar)


# DDIM's own discretisation error is larger: std 0.184, 0.280 and 0.299 at 10, 50 and 200 steps.
@pytest.mark.parametrize('sampler, steps, options', [
    ('ancestral', 100, {}), ('ddim', 200, {}), ('pc', 100, {}), ('ode', 25, {}),
    ('ode', 25, {'ode_grid': 'log'})])
def test_every_ddpm_sampler_draws_the_data_with_the_exact_eps(sampler, steps, options):
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2,)}}, objective='ddpm',
                     input_key='x')
  x = jax.jit(lambda key: task.sample(ExactEps(), {}, key, 2048, steps, sampler=sampler,
                                      **options))(jax.random.PRNGKey(3))
  # Points in the data's own scale: zero mean, std c (4 standard errors: 0.027 and 4.4 %;
  # measured ≤ 0.0063 and ≤ 3.4 %, ancestral the largest). A sampler that skips the noise or
  # mistimes the network's steps draws another std; samples mapped to [0, 1] as images are,
  # std c / 2.
  x = np.asarray(x, np.float64)
  assert np.all(np.abs(x.mean(0)) < 4 * ExactEps.C / np.sqrt(2048)), x.mean(0)
  assert abs(x.std() / ExactEps.C - 1) < 4 / np.sqrt(2 * x.size), x.std()


def test_image_samples_come_back_mapped_from_minus_one_one_to_zero_one():
  """Images are trained in [−1, 1] and returned as (x + 1) / 2: for data N(0, c²) drawn with the
  exact ε, mean 1/2 and std c/2 (a clip of x to [0, 1] instead would give mean 0.12)."""
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2, 1, 1)}},
                     objective='ddpm', input_key='x')
  x = jax.jit(lambda key: task.sample(ExactEps(), {}, key, 2048, 25, sampler='ode'))(
      jax.random.PRNGKey(4))
  x = np.asarray(x, np.float64)
  assert x.shape == (2048, 2, 1, 1)
  half_c = ExactEps.C / 2
  assert abs(x.mean() - 0.5) < 4 * half_c / np.sqrt(x.size), x.mean()
  assert abs(x.std() / half_c - 1) < 4 / np.sqrt(2 * x.size), x.std()


def test_preprocess_maps_pixels_to_minus_one_one_and_binarises_at_128_for_d3pm():
  pixels = np.array([0, 51, 127, 128, 255], np.uint8).reshape(1, 5, 1, 1)
  ddpm = tasks.build('diffusion', {'features': ('image',)}, objective='ddpm')
  x0 = ddpm.preprocess({'image': pixels})['x0']
  assert x0.dtype == np.float32
  np.testing.assert_allclose(x0.ravel(), [-1.0, -0.6, 127 / 127.5 - 1, 128 / 127.5 - 1, 1.0],
                             rtol=1e-6, atol=1e-7)
  d3pm = tasks.build('diffusion', {'features': ('image',)}, objective='d3pm', num_steps=20)
  np.testing.assert_array_equal(d3pm.preprocess({'image': pixels})['x0'].ravel(), [0, 0, 0, 1, 1])
  # Real-valued data (the 2-D mixtures' points) are used as they are.
  points = np.array([[-3.5, 2.25]], np.float64)
  np.testing.assert_array_equal(ddpm.preprocess({'image': points})['x0'], points)


def test_a_sampler_of_another_objective_is_refused():
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2,)}}, objective='d3pm',
                     input_key='x')
  with pytest.raises(ValueError, match="sampler='ode' does not sample task.objective='d3pm'; "
                                       'allowed: ancestral'):
    task.sample(ExactEps(), {}, jax.random.PRNGKey(0), 2, sampler='ode')
  with pytest.raises(ValueError, match="objective='d3pm' has no score model"):
    task.score_model(lambda x, t: x)
  ddpm = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2,)}}, objective='ddpm',
                     input_key='x')
  with pytest.raises(ValueError, match="ode_grid='log' is the time grid of sampler='ode', not "
                                       "of sampler='ancestral'"):
    ddpm.sample(ExactEps(), {}, jax.random.PRNGKey(0), 2, sampler='ancestral', ode_grid='log')


def test_image_grid_places_each_image():
  images = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3, 1) / 30
  grid = diffusion.image_grid(images, columns=3)
  assert grid.shape == (2 * 2 + 1, 3 * 3 + 2, 1)
  np.testing.assert_array_equal(grid[3:5, 4:7], images[4])
  np.testing.assert_array_equal(grid[2], 1.0)  # the separating row


@pytest.mark.parametrize('options, part', [
    ({'objective': 'ddim'}, "task.objective='ddim'; allowed: ddpm, score_sde, cold, d3pm"),
    ({'objective': 'score_sde', 'sde': 'vpp'}, "task.sde='vpp'; allowed: vp, subvp, ve"),
    ({'objective': 'cold', 'degradation': 'noise'}, "degradation='noise'"),
    ({'num_steps': -1}, 'num_steps must be a non-negative integer'),
    ({'num_steps': 10, 'sample_steps': 11}, 'sample_steps=11 exceeds the 10 steps'),
    ({'input_key': 'pixels'}, "input_key='pixels' is not a feature"),
    ({'objective': 'score_sde', 'sample_steps': 19}, 'sample_steps=19 is too few for the vp'),
    ({'objective': 'score_sde', 'sde': 'subvp', 'sample_steps': 19}, 'at least 20'),
    # Once refused only when the first loss was traced, as sigma and hybrid_weight.
    ({'objective': 'cold', 'blur_sigma': 0.0},
     'task.blur_sigma=0.0 must be a positive number (the standard deviation in pixels'),
    ({'objective': 'cold', 'blur_sigma': -1.0}, 'task.blur_sigma=-1.0 must be a positive'),
    ({'objective': 'd3pm', 'hybrid_weight': -0.5},
     'task.hybrid_weight=-0.5 must be a non-negative number'),
])
def test_bad_options_are_refused_in_one_sentence(options, part):
  one_sentence(lambda: tasks.build('diffusion', {'features': ('image',)}, **options), part)


@pytest.mark.parametrize('options', [
    {'objective': 'cold', 'degradation': 'mask', 'blur_sigma': 0.0},  # no blur to take it
    {'objective': 'd3pm', 'hybrid_weight': 0.0}])
def test_options_the_objective_takes_or_ignores_pass(options):
  tasks.build('diffusion', {'features': ('image',)}, **options)


@pytest.mark.parametrize('objective, channels, needed', [
    ('ddpm', 3, '(8, 4, 4, 1)'), ('score_sde', 3, '(8, 4, 4, 1)'), ('cold', 2, '(8, 4, 4, 1)'),
    ('d3pm', 2, '(8, 4, 4, 3)')])
def test_a_model_whose_output_does_not_match_the_data_is_refused(objective, channels, needed):
  # Three channels against one would broadcast into a loss three times too large.
  task = tasks.build('diffusion', {'features': ('image',)}, objective=objective, num_steps=20)
  batch = task.preprocess({'image': np.zeros((8, 4, 4, 1), np.uint8)})
  wrong = Stub(lambda x, t: jnp.zeros(x.shape[:3] + (channels,)))
  with pytest.raises(ValueError, match=rf'shape \(8, 4, 4, {channels}\) where '
                                       rf'task.objective=.{objective}. needs {re.escape(needed)}: '
                                       r'set its output channels \(model.out_channels'):
    task.loss(wrong, batch)



@pytest.mark.parametrize('sde', ['vp', 'subvp'])
def test_the_fewest_pc_steps_that_work_are_accepted(sde):
  # 20 steps keep β(T)·h = 20 · 0.999 / 20 below 1 (models/test_sde.py samples them).
  task = tasks.build('diffusion', {'features': ('image',)}, objective='score_sde', sde=sde,
                     sample_steps=20)
  assert task.sample_steps == 20


class RecordingEps:
  """A 'module' predicting ε = 0 that records the timesteps of each call it is run with."""

  def __init__(self):
    self.calls = []

  def apply(self, variables, x, t_B):
    del variables
    jax.debug.callback(lambda t: self.calls.append(np.asarray(t)), t_B, ordered=True)
    return jnp.zeros_like(x)


@pytest.mark.parametrize('sampler, steps, calls', [
    ('ancestral', 4, 4), ('ddim', 4, 4), ('pc', 3, 6), ('ode', 2, 8), ('ancestral', 0, 10)])
def test_samplers_take_the_steps_they_are_given(sampler, steps, calls):
  # T = 10, so 4 respaced steps keep the timesteps round(1 + (k − 1)·9/3) = 1, 4, 7, 10 and run
  # them from 10 down; 0 steps means all T. The PC sampler calls the network once in its
  # corrector and once in its predictor per step, RK4 four times per step. A task that dropped
  # `steps` (sampling all 1,000 or 10 steps) draws the same Gaussian data with the exact ε, so
  # the sampler tests above would pass; the number of calls tells.
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2,)}}, objective='ddpm',
                     input_key='x', num_steps=10)
  module = RecordingEps()
  jax.block_until_ready(task.sample(module, {}, jax.random.PRNGKey(0), 3, steps,
                                    sampler=sampler))
  jax.effects_barrier()
  assert len(module.calls) == calls, [c[0] for c in module.calls]
  assert all(c.shape == (3,) and np.all(c == c[0]) for c in module.calls)
  if sampler in ('ancestral', 'ddim'):
    expected = [10, 7, 4, 1] if steps else list(range(10, 0, -1))
    np.testing.assert_array_equal([c[0] for c in module.calls], expected)


def test_the_sample_grid_after_evaluation_takes_sample_steps():
  # task.sample_steps = 4 of T = 10: the grid's sampler runs the 4 respaced timesteps; a hook
  # that left the option out would run all 10.
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2, 2, 1)}},
                     objective='ddpm', input_key='x', num_steps=10, num_samples=2, sample_steps=4)
  module = RecordingEps()
  (hook,) = task.eval_hooks()
  grid = hook(base.HookContext(module, {}, jax.random.PRNGKey(0), 0))['samples']
  jax.effects_barrier()
  assert grid.shape == (2, 5, 1)  # two 2 × 2 images side by side, one pixel between
  np.testing.assert_array_equal([c[0] for c in module.calls], [10, 7, 4, 1])


@pytest.mark.parametrize('objective, num_steps', [('ddpm', 10), ('ddpm', 0), ('cold', 0),
                                                  ('d3pm', 20)])
def test_sample_steps_equal_to_the_process_steps_are_accepted(objective, num_steps):
  # Sampling with every step of the process (T itself, 1,000 by default for ddpm, 50 for
  # cold) is allowed; only more than T is refused, so a check with >= refused T.
  steps = num_steps or diffusion.DEFAULT_STEPS[objective]
  task = tasks.build('diffusion', {'features': ('image',)}, objective=objective,
                     num_steps=num_steps, sample_steps=steps)
  assert task.sample_steps == steps == task.process_steps


def test_ddim_starts_from_the_noise_of_the_given_key():
  # DDIM is deterministic given x_T, so x_T must come from `key`: the same key gives the
  # same samples, another key others (an x_T from a fixed key gave one sample set only).
  task = tasks.build('diffusion', {'features': ('x',), 'shapes': {'x': (2,)}}, objective='ddpm',
                     input_key='x', num_steps=10)
  draw = jax.jit(lambda key: task.sample(ExactEps(), {}, key, 4, sampler='ddim'))
  first, again, other = (np.asarray(draw(jax.random.PRNGKey(seed))) for seed in (5, 5, 6))
  np.testing.assert_array_equal(first, again)
  assert np.abs(first - other).min() > 1e-3, (first, other)


def test_the_loss_of_images_is_per_pixel_of_every_axis():
  # Predicting 0 leaves the whole noise: ‖ε‖² / D = 1 on average, D = H·W·C = 16 for images
  # [4, 4, 1], not the channels alone (a loss of 16).
  task = tasks.build('diffusion', {'features': ('image',)}, objective='ddpm', num_steps=10)
  images = np.random.default_rng(1).integers(0, 256, size=(64, 4, 4, 1)).astype(np.uint8)
  zero = Stub(lambda x, t: jnp.zeros_like(x))
  total_B, weight_B = jax.jit(lambda batch: task.loss(zero, batch)['loss'])(
      task.preprocess({'image': images}))
  values = np.asarray(total_B) / np.asarray(weight_B)
  assert abs(values.mean() - 1) < 4 * values.std() / np.sqrt(64), values.mean()


def test_default_process_steps_and_no_sample_grid_for_cold():
  # num_steps = 0 means T = 1,000 for ddpm and d3pm, 50 for cold (the class docstring).
  for objective, steps in (('ddpm', 1000), ('cold', 50), ('d3pm', 1000)):
    assert tasks.build('diffusion', {'features': ('image',)},
                       objective=objective).process_steps == steps
  # cold restores degraded images and has no sampler: no grid after evaluation, even with
  # num_samples set on image data (ddpm, with the same options, draws one).
  meta = {'features': ('image',), 'shapes': {'image': (4, 4, 1)}}
  assert tasks.build('diffusion', meta, objective='cold', num_samples=4).eval_hooks() == []
  assert len(tasks.build('diffusion', meta, objective='ddpm', num_samples=4).eval_hooks()) == 1


def test_ddpm_noises_with_the_beta_schedule_it_is_given():
  # x_0 = 0 gives x_t = √(1 − ᾱ_t) ε, so with ᾱ_t = Π_{s≤t} (1 − β_s) of β linear from
  # beta_start to beta_end, x_t / √(1 − ᾱ_t) is ε exactly and the loss 0.
  alpha_bars = jnp.asarray(np.cumprod(1 - np.linspace(0.05, 0.5, 10)), jnp.float32)
  task = tasks.build('diffusion', {'features': ('x',)}, objective='ddpm', input_key='x',
                     num_steps=10, beta_start=0.05, beta_end=0.5)
  exact = Stub(lambda x, t: x / jnp.sqrt(1 - alpha_bars[t - 1])[:, None])
  total_B, _ = jax.jit(lambda batch: task.loss(exact, batch)['loss'])(
      task.preprocess({'x': np.zeros((64, 2), np.float32)}))
  assert np.max(np.asarray(total_B)) < 1e-6


def test_cold_blurs_with_blur_sigma():
  # T = 1: D(x_0, 1) is one blur by the taps g_k ∝ exp(−k²/(2σ²)), k = −2 … 2 for σ = 0.5. On
  # −1 everywhere but a 1 at the centre of 7 × 7 it changes x_0 by 2 (g ⊗ g − δ), so the
  # identity restorer's mean |error| is 2 · 2 (1 − g_0²) / 49.
  task = tasks.build('diffusion', {'features': ('image',)}, objective='cold', num_steps=1,
                     blur_sigma=0.5)
  images = np.zeros((2, 7, 7, 1), np.uint8)
  images[:, 3, 3] = 255
  total_B, _ = jax.jit(lambda batch: task.loss(Stub(lambda x, t: x), batch)['loss'])(
      task.preprocess({'image': images}))
  taps = np.exp(-np.arange(-2, 3) ** 2 / (2 * 0.5 ** 2))
  g0 = 1 / taps.sum()
  np.testing.assert_allclose(total_B, 4 * (1 - g0 ** 2) / 49, rtol=1e-5)


class AllOn:
  """A d3pm 'module' whose logits of x_0 are sure that every pixel is on (category 1)."""

  def apply(self, variables, x, t_B):
    del variables, t_B
    return 10.0 * jax.nn.one_hot(jnp.ones(x.shape[:3], jnp.int32), 3)


def test_d3pm_samples_are_the_binarised_pixel_values():
  # Samples come back as the categories themselves, here 1 (an on pixel) everywhere.
  task = tasks.build('diffusion', {'features': ('image',), 'shapes': {'image': (2, 2, 1)}},
                     objective='d3pm', num_steps=5)
  x = jax.jit(lambda key: task.sample(AllOn(), {}, key, 3))(jax.random.PRNGKey(0))
  np.testing.assert_array_equal(x, np.ones((3, 2, 2, 1), np.float32))
