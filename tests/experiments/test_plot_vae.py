"""The VAE figure: its reconstructions, prior samples, latent map and decoder grid equal a
NumPy forward pass of the same parameters; a run's test images are prepared as its task
prepares them; bad inputs stop with one sentence before the checkpoint is read."""

import os

import jax
import ml_collections
import numpy as np
import pytest

from experiments import plot_vae
from experiments.configs import digits_mlp
from experiments.configs import fashion_mnist_vae
from models.generative import autoencoders
from train import checkpoint, loop
from tests.experiments import fake_runs


def _numpy_encoder_mean(params, x_NxD):
  """μ(x) in float64: ReLU hidden layers, then the linear 'posterior_mean' layer."""
  h = np.asarray(x_NxD, np.float64).reshape(len(x_NxD), -1)
  i = 0
  while f'encoder_layers_{i}' in params:
    layer = params[f'encoder_layers_{i}']
    h = np.maximum(h @ np.float64(layer['kernel']) + np.float64(layer['bias']), 0.0)
    i += 1
  return h @ np.float64(params['posterior_mean']['kernel']) + np.float64(
      params['posterior_mean']['bias'])


def _numpy_decoder_mean(params, z_NxK, image_shape):
  """E[x|z] in float64: ReLU hidden layers, then 1/(1 + e^−a) of the last layer (Bernoulli
  and Gaussian decoders alike)."""
  h = np.asarray(z_NxK, np.float64)
  num_layers = sum(name.startswith('decoder_layers_') for name in params)
  for i in range(num_layers):
    layer = params[f'decoder_layers_{i}']
    h = h @ np.float64(layer['kernel']) + np.float64(layer['bias'])
    if i < num_layers - 1:
      h = np.maximum(h, 0.0)
  return (1.0 / (1.0 + np.exp(-h))).reshape((len(h),) + tuple(image_shape))


def _module_and_variables(decoder, latent_dim):
  """A VAE on 4×4 images with 5 hidden units and N(0, 1) parameters, drawn in NumPy (its
  initialiser's are smaller, and running it would compile a program per operation)."""
  module = autoencoders.VAE(latent_dim=latent_dim, hidden_sizes=(5,), decoder=decoder,
                            image_shape=(4, 4, 1))
  rng = np.random.default_rng(latent_dim)
  shapes = {'encoder_layers_0': (16, 5), 'posterior_mean': (5, latent_dim),
            'posterior_log_var': (5, latent_dim), 'decoder_layers_0': (latent_dim, 5),
            'decoder_layers_1': (5, 16)}
  params = {name: {'kernel': rng.normal(size=shape).astype(np.float32),
                   'bias': rng.normal(size=shape[-1]).astype(np.float32)}
            for name, shape in shapes.items()}
  if decoder == 'gaussian':
    params['decoder_log_var'] = np.zeros((4, 4, 1), np.float32)
  return module, {'params': params}


@pytest.mark.parametrize('decoder', ['bernoulli', 'gaussian'])
def test_the_figure_of_a_2d_vae_is_its_numpy_forward_pass(decoder):
  module, variables = _module_and_variables(decoder, 2)
  params = variables['params']
  rng = np.random.default_rng(0)
  images = rng.uniform(size=(7, 4, 4, 1)).astype(np.float32)
  labels = rng.integers(0, 10, size=7)
  key = jax.random.PRNGKey(3)
  data = plot_vae.compute(module, variables, images, labels, key, num=3)

  # float32 against float64 (N(0, 1) weights): measured max errors 8e-8 (reconstructions),
  # 5e-7 (μ), 4e-7 (grid images), 1.3e-7 (prior samples); tolerance 1e-5.
  np.testing.assert_array_equal(data['inputs'], images[:3])
  np.testing.assert_allclose(data['reconstructions'], _numpy_decoder_mean(
      params, _numpy_encoder_mean(params, images[:3]), (4, 4, 1)), atol=1e-5)
  np.testing.assert_allclose(data['map_means'], _numpy_encoder_mean(params, images), atol=1e-5)
  np.testing.assert_array_equal(data['map_labels'], labels)
  assert np.ptp(data['map_means'], axis=0).min() > 0.1  # the check above is not of constants

  # The grid: z₁ = −3 + 6j/14 along a row, z₂ = 3 − 6i/14 down a column.
  i, j = np.mgrid[0:15, 0:15]
  np.testing.assert_allclose(data['grid_z'][..., 0], -3 + 6 * j / 14, atol=1e-6)  # error 7e-8
  np.testing.assert_allclose(data['grid_z'][..., 1], 3 - 6 * i / 14, atol=1e-6)
  expected = _numpy_decoder_mean(params, data['grid_z'].reshape(-1, 2), (4, 4, 1))
  np.testing.assert_allclose(data['grid_images'], expected.reshape(15, 15, 4, 4, 1), atol=1e-5)

  # Prior samples are decoder means (in [0, 1], not draws of p(x|z)) of z from VAE.sample's
  # first key: z ~ N(0, I) from jax.random.split(key)[0].
  z = np.asarray(jax.random.normal(jax.random.split(key)[0], (16, 2)))
  np.testing.assert_allclose(data['prior_samples'],
                             _numpy_decoder_mean(params, z, (4, 4, 1)), atol=1e-5)
  assert data['latent_dim'] == 2


def test_a_vae_with_more_latents_has_no_map_and_the_figure_is_written(tmp_path):
  module, variables = _module_and_variables('gaussian', 3)
  images = np.random.default_rng(1).uniform(size=(5, 4, 4, 1)).astype(np.float32)
  data = plot_vae.compute(module, variables, images, np.arange(5), jax.random.PRNGKey(0), num=4)
  assert set(data) == {'inputs', 'reconstructions', 'prior_samples', 'latent_dim'}
  assert data['reconstructions'].shape == (4, 4, 4, 1) and data['latent_dim'] == 3
  path = str(tmp_path / 'k3.png')
  plot_vae.plot(data, path)
  assert os.path.getsize(path) > 5000


def _config(data_dir, model_name='vae'):
  config = fashion_mnist_vae.get_config()
  config.data.name, config.data.data_dir = 'digits', data_dir
  config.model.hidden_sizes, config.model.latent_dim = (6,), 2
  config.model.image_shape = (8, 8, 1)
  config.task.iwae_samples = 2
  config.global_batch_size, config.eval_batch_size = 8, 8
  if model_name != 'vae':
    config = digits_mlp.get_config()
    config.data.data_dir = data_dir
  return ml_collections.ConfigDict(config.to_dict())


@pytest.fixture(scope='module')
def vae_run(tmp_path_factory, data_dir):
  """A tiny 2-D VAE run on digits whose checkpoint of step 2 holds random parameters and an
  independent random parameter average."""
  config = _config(data_dir)
  config.ema_decay = 0.99
  return fake_runs.save_random_run(config, str(tmp_path_factory.mktemp('digits_vae')))


def test_the_figure_of_a_run_uses_its_test_images_dequantised_and_its_checkpoint(vae_run,
                                                                                 monkeypatch):
  import data as data_lib  # pylint: disable=g-import-not-at-top
  data = plot_vae.figure_data(vae_run, 5, seed=0)
  test = data_lib.load('digits', 'test', data_dir=loop.read_config(vae_run).data.data_dir)
  pixels = np.stack([np.asarray(test[k]['image']) for k in range(len(test))])
  labels = np.array([int(test[k]['label']) for k in range(len(test))])
  # Dequantised as the run's task does: x = (pixel + u)/256, u ~ U[0, 1), so ⌊256 x⌋ = pixel.
  np.testing.assert_array_equal(np.floor(256 * data['inputs'].astype(np.float64)), pixels[:5])
  assert np.std(256 * data['inputs'] - pixels[:5]) > 0.2  # U[0, 1) has σ = 0.29, not 0
  # The parameter average the run kept, which evaluation uses, not the parameters.
  params = checkpoint.restore_arrays(vae_run)['ema_params']
  mean_5x2 = _numpy_encoder_mean(params, data['inputs'])
  # float32 against float64 with N(0, 1) weights: measured max errors 1.1e-7 (images) and
  # 2.3e-7 (μ, |μ| up to 2.5); tolerance 1e-5.
  np.testing.assert_allclose(data['reconstructions'],
                             _numpy_decoder_mean(params, mean_5x2, (8, 8, 1)), atol=1e-5)
  assert data['map_means'].shape == (360, 2)  # the whole test split, fewer than 5,000
  np.testing.assert_allclose(data['map_means'][:5], mean_5x2, atol=1e-5)
  np.testing.assert_array_equal(data['map_labels'], labels)
  assert list(data['class_names']) == [str(d) for d in range(10)]
  assert 'K = 2' in data['title'] and 'step 2' in data['title']

  # The command draws these numbers into <workdir>/vae.png.
  monkeypatch.setattr(plot_vae, 'figure_data', lambda *args: data)
  output = plot_vae.run(vae_run, 5, 0)
  assert output == os.path.join(vae_run, plot_vae.OUTPUT_FILE) and os.path.getsize(output) > 5000


def _error(workdir, monkeypatch, num=8) -> str:
  def unreachable(*args, **kwargs):
    raise AssertionError('the run was loaded before the error')
  monkeypatch.setattr(checkpoint, 'restore_arrays', unreachable)
  monkeypatch.setattr(loop, 'build_parts', unreachable)
  with pytest.raises(SystemExit) as info:
    plot_vae.run(str(workdir), num, 0)
  message = info.value.code
  assert isinstance(message, str), message  # sys.exit(str): status 1
  assert message.startswith('error: ') and '\n' not in message and message.endswith('.'), message
  return message


def test_a_missing_work_directory_is_one_sentence(tmp_path, monkeypatch):
  assert _error(tmp_path / 'nowhere', monkeypatch) == (
      f"error: The work directory '{tmp_path / 'nowhere'}' does not exist.")


def test_a_run_of_another_model_is_one_sentence(tmp_path, data_dir, monkeypatch):
  (tmp_path / 'config.json').write_text(_config(data_dir, model_name='mlp').to_json())
  assert _error(tmp_path, monkeypatch) == (
      f"error: The run in '{tmp_path}' trained model 'mlp', not 'vae'.")


@pytest.mark.parametrize('num', [0, 33])
def test_a_bad_num_is_one_sentence(tmp_path, monkeypatch, num):
  assert _error(tmp_path, monkeypatch, num=num) == (
      f'error: --num={num} is not allowed; reconstruct from 1 to 32 images.')


@pytest.mark.parametrize('num', [1, 32])
def test_one_and_32_images_are_allowed(tmp_path, monkeypatch, num):
  # Past the check of --num: the next one, of the work directory, refuses.
  assert _error(tmp_path / 'nowhere', monkeypatch, num=num) == (
      f"error: The work directory '{tmp_path / 'nowhere'}' does not exist.")


def test_the_mosaic_puts_image_r_c_at_its_cell_with_white_lines_between():
  images = np.random.default_rng(0).uniform(-0.5, 1.5, size=(2, 3, 4, 5, 1)).astype(np.float32)
  canvas = plot_vae.mosaic(images)
  assert canvas.shape == (2 * 5 - 1, 3 * 6 - 1)  # one pixel between cells, none around
  white = np.ones(canvas.shape, bool)
  for r in range(2):
    for c in range(3):
      cell = canvas[5 * r:5 * r + 4, 6 * c:6 * c + 5]
      np.testing.assert_array_equal(cell, np.clip(images[r, c, ..., 0], 0, 1))
      white[5 * r:5 * r + 4, 6 * c:6 * c + 5] = False
  assert np.all(canvas[white] == 1)
  colour = plot_vae.mosaic(images[..., [0, 0, 0]], pad=2)
  assert colour.shape == (2 * 6 - 2, 3 * 7 - 2, 3)
  np.testing.assert_array_equal(colour[6:10, 7:12, 1], np.clip(images[1, 1, ..., 0], 0, 1))


@pytest.mark.parametrize('name', ['folder', 'figure.pngg'])
def test_an_output_that_cannot_be_written_is_refused_before_the_run_is_read(tmp_path,
                                                                            monkeypatch, name):
  (tmp_path / 'folder').mkdir()
  monkeypatch.setattr(plot_vae, 'figure_data', lambda *a: pytest.fail('the run was read'))
  with pytest.raises(SystemExit) as info:
    plot_vae.run(str(tmp_path), 8, 0, str(tmp_path / name))
  assert info.value.code.startswith(f'error: --output={tmp_path / name} ')


def test_a_default_output_that_is_a_folder_is_refused_before_the_run_is_read(tmp_path,
                                                                             monkeypatch):
  # Only a given --output was checked: a folder at <workdir>/vae.png was found by savefig,
  # an IsADirectoryError traceback after the whole figure was computed.
  (tmp_path / plot_vae.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(plot_vae, 'figure_data', lambda *a: pytest.fail('the run was read'))
  with pytest.raises(SystemExit) as info:
    plot_vae.run(str(tmp_path), 8, 0)
  assert info.value.code == (f'error: --output={tmp_path / plot_vae.OUTPUT_FILE} is a folder; '
                             'give the file to write in it.')
