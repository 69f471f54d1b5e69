"""The reconstruction figure: its reconstructions and cross-entropies equal a NumPy float64
forward pass and a brute-force Bernoulli cross-entropy; a run's test images are the clean
images its task evaluates on; bad inputs stop with one sentence before the checkpoint is read."""

import os

import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import pytest

from experiments import plot_reconstructions
from experiments.configs import digits_mlp
from experiments.configs import fashion_mnist_autoencoder
from experiments.configs import fashion_mnist_vae
from models.generative import autoencoders
from train import checkpoint, loop
from tests.experiments import fake_runs


def _sigmoid(a):
  return 1.0 / (1.0 + np.exp(-a))


def _dense(params, name, h):
  return h @ np.float64(params[name]['kernel']) + np.float64(params[name]['bias'])


def _numpy_logits(params, x_NxHxWxC):
  """Decoder logits in float64: h = σ(W₁x + b₁), l = W₂h + b₂ for the one-layer autoencoders;
  l = W_d μ(x) + b_d, μ(x) = W_μ x + b_μ for the VAE without hidden layers."""
  x = np.asarray(x_NxHxWxC, np.float64).reshape(len(x_NxHxWxC), -1)
  if 'posterior_mean' in params:
    return _dense(params, 'decoder_layers_0', _dense(params, 'posterior_mean', x))
  return _dense(params, 'decoder_0', _sigmoid(_dense(params, 'encoder_0', x)))


def _brute_force_cross_entropy(x_NxHxWxC, logits_NxD):
  """−Σ_i [x_i log p_i + (1 − x_i) log(1 − p_i)], p = σ(l), pixel by pixel."""
  x = np.asarray(x_NxHxWxC, np.float64).reshape(len(x_NxHxWxC), -1)
  totals = np.zeros(len(x))
  for n in range(x.shape[0]):
    for i in range(x.shape[1]):
      p = _sigmoid(logits_NxD[n, i])
      totals[n] -= x[n, i] * np.log(p) + (1 - x[n, i]) * np.log(1 - p)
  return totals


def _random_params(shapes, seed):
  """N(0, 1) parameters drawn in NumPy (larger than the initialiser's, so that the logits are
  spread out, and no program is compiled per operation to draw them)."""
  rng = np.random.default_rng(seed)
  return {name: {'kernel': rng.normal(size=shape).astype(np.float32),
                 'bias': rng.normal(size=shape[-1]).astype(np.float32)}
          for name, shape in shapes.items()}


def _tiny_model(kind):
  """A model on 4×4 images with 3 code units (or latents)."""
  if kind == 'vae':
    module = autoencoders.VAE(latent_dim=3, hidden_sizes=(), image_shape=(4, 4, 1))
    shapes = {'posterior_mean': (16, 3), 'posterior_log_var': (16, 3),
              'decoder_layers_0': (3, 16)}
  else:
    module = autoencoders.DenoisingAutoencoder(latent_dim=3, image_shape=(4, 4, 1))
    shapes = {'encoder_0': (16, 3), 'decoder_0': (3, 16)}
  return module, {'params': _random_params(shapes, seed=len(kind))}


@pytest.mark.parametrize('kind', ['denoising_autoencoder', 'vae'])
def test_reconstructions_and_cross_entropies_are_the_numpy_forward_pass(kind):
  module, variables = _tiny_model(kind)
  images = np.random.default_rng(0).uniform(size=(5, 4, 4, 1)).astype(np.float32)
  data = plot_reconstructions.compute(module, variables, images)

  logits_NxD = _numpy_logits(variables['params'], images)
  assert np.ptp(logits_NxD) > 3  # spread-out logits, not a check of constants
  # float32 against float64 with N(0, 1) weights: measured max errors 8.1e-8 (images) and
  # relative 5.3e-8 (cross-entropies of 13 … 32 nats); tolerances 1e-6 and relative 1e-6.
  np.testing.assert_allclose(data['reconstructions'],
                             _sigmoid(logits_NxD).reshape(images.shape), atol=1e-6)
  assert data['cross_entropy'].dtype == np.float64 and data['cross_entropy'].shape == (5,)
  np.testing.assert_allclose(data['cross_entropy'],
                             _brute_force_cross_entropy(images, logits_NxD), rtol=1e-6)


def test_a_gaussian_vae_has_no_cross_entropy_and_is_refused_in_one_sentence():
  module = autoencoders.VAE(latent_dim=2, hidden_sizes=(), decoder='gaussian',
                            image_shape=(4, 4, 1))
  with pytest.raises(ValueError) as info:
    plot_reconstructions.compute(module, {}, np.zeros((1, 4, 4, 1), np.float32))
  assert str(info.value) == ("The model is a VAE with decoder='gaussian', which has no Bernoulli "
                             "cross-entropy; only decoder='bernoulli' VAEs are allowed.")


def test_the_figure_is_written_with_one_row_per_run(tmp_path, monkeypatch):
  rng = np.random.default_rng(2)
  data = {'inputs': rng.uniform(size=(6, 4, 4, 1)).astype(np.float32),
          'reconstructions': rng.uniform(size=(2, 6, 4, 4, 1)).astype(np.float32),
          'cross_entropy': rng.uniform(size=(2, 6)), 'labels': ['a', 'b'], 'steps': [1, 2],
          'title': 'tiny'}
  path = str(tmp_path / 'sub' / 'figure.png')
  drawn = []
  mosaic = plot_reconstructions.plot_vae.mosaic
  monkeypatch.setattr(plot_reconstructions.plot_vae, 'mosaic',
                      lambda rows, **kw: drawn.append(rows) or mosaic(rows, **kw))
  plot_reconstructions.plot(data, path)
  # The images drawn: the inputs, then each run's reconstructions, in the runs' order.
  assert len(drawn) == 1 and drawn[0].shape == (3, 6, 4, 4, 1)
  for row, expected in zip(drawn[0], [data['inputs'], *data['reconstructions']]):
    np.testing.assert_array_equal(row, expected)
  image = plt.imread(path)
  # Three rows of 4×4 images, six columns: the figure is wider than high.
  assert image.shape[1] > image.shape[0] > 100
  assert np.std(image[..., :3]) > 0.1  # not blank


def _config(data_dir, model_name, **model_options):
  """A tiny digits run of `model_name` (8×8 images, 3 code units)."""
  if model_name == 'mlp':
    config = digits_mlp.get_config()
  elif model_name == 'vae':
    config = fashion_mnist_vae.get_config()
    config.model.hidden_sizes, config.task.iwae_samples = (), 2
    config.model.decoder, config.task.dequantize = 'bernoulli', False
  else:
    config = fashion_mnist_autoencoder.get_config()
    config.model.name = model_name
    config.task.input_scale = 1 / 16  # digits' pixel values are 0..16
  config.data.name, config.data.data_dir = 'digits', data_dir
  if model_name != 'mlp':
    config.model.latent_dim, config.model.image_shape = 3, (8, 8, 1)
    config.global_batch_size, config.eval_batch_size = 8, 8
  config.model.update(model_options)
  return ml_collections.ConfigDict(config.to_dict())


def _fake_run(workdir, config):
  """A run whose checkpoint of step 2 holds N(0, 1) parameters (nothing is trained)."""
  return fake_runs.save_random_run(config, workdir)


def test_every_run_reconstructs_the_same_clean_test_images_from_its_checkpoint(tmp_path,
                                                                               data_dir):
  import data as data_lib  # pylint: disable=g-import-not-at-top
  # The denoising run's task masks 30% of the pixels of training batches; the figure must not.
  denoising = _fake_run(str(tmp_path / 'dae'), _config(data_dir, 'denoising_autoencoder'))
  vae_config = _config(data_dir, 'vae')
  vae_config.ema_decay = 0.99  # its checkpoint holds an independent random parameter average
  vae = _fake_run(str(tmp_path / 'vae'), vae_config)
  data = plot_reconstructions.run([denoising, vae], 4, 0, str(tmp_path / 'figure.png'))
  assert os.path.getsize(tmp_path / 'figure.png') > 5000

  test = data_lib.load('digits', 'test', data_dir=data_dir)
  pixels = np.stack([np.asarray(test[k]['image'], np.float64) for k in range(len(test))])
  # Each input is a whole clean test image pixels/16 (a masked one would match none), and the
  # four are different images.
  matches = [np.flatnonzero(np.all(pixels / 16 == x, axis=(1, 2, 3))) for x in data['inputs']]
  assert all(len(m) >= 1 for m in matches), matches
  chosen = np.array([m[0] for m in matches])
  assert len(set(chosen)) == 4
  assert data['labels'] == ['denoising_autoencoder', 'vae'] and data['steps'] == [2, 2]

  # Each run's rows from its own checkpoint (the parameter average, when the run kept one, as
  # evaluation uses) and its own task's inputs: the VAE task's x is pixels/255 (no
  # dequantisation in this config), the same images.
  for r, (workdir, x, params) in enumerate([(denoising, pixels[chosen] / 16, 'params'),
                                            (vae, pixels[chosen] / 255, 'ema_params')]):
    logits_NxD = _numpy_logits(checkpoint.restore_arrays(workdir)[params], x)
    # float32 against float64, N(0, 1) weights on 64 pixels: measured max errors 8.9e-8
    # (images) and relative 1.6e-8 (cross-entropies of 56 … 68 nats); tolerances 1e-6 and
    # relative 1e-6.
    np.testing.assert_allclose(data['reconstructions'][r],
                               _sigmoid(logits_NxD).reshape(x.shape), atol=1e-6)
    np.testing.assert_allclose(data['cross_entropy'][r],
                               _brute_force_cross_entropy(x, logits_NxD), rtol=1e-6)


def test_32_images_are_32_different_test_images_chosen_by_the_seed(tmp_path, data_dir,
                                                                     monkeypatch):
  # The figure's images are the last batch read. 32 of the 360 test images drawn with
  # replacement repeat one for most seeds (seeds 0 and 1 among them).
  from data import pipeline  # pylint: disable=g-import-not-at-top
  workdir = _fake_run(str(tmp_path / 'dae'), _config(data_dir, 'denoising_autoencoder'))
  reads, read_batch = [], pipeline.read_batch
  monkeypatch.setattr(pipeline, 'read_batch', lambda source, indices: reads.append(
      (len(source), np.asarray(indices))) or read_batch(source, indices))
  drawn = []
  for seed in (0, 1):
    data = plot_reconstructions.figure_data([workdir], 32, seed)
    assert reads[-1][0] == 360 and len(data['inputs']) == 32
    drawn.append(reads[-1][1])
  for indices in drawn:
    assert len(set(indices.tolist())) == 32 and 0 <= indices.min() <= indices.max() < 360
  assert set(drawn[0].tolist()) != set(drawn[1].tolist())


def _error(workdirs, monkeypatch, num=8, build=False, seed=0) -> str:
  def unreachable(*args, **kwargs):
    raise AssertionError('the run was loaded before the error')
  monkeypatch.setattr(checkpoint, 'restore_arrays', unreachable)
  if not build:
    monkeypatch.setattr(loop, 'build_parts', unreachable)
  with pytest.raises(SystemExit) as info:
    plot_reconstructions.run([str(w) for w in workdirs], num, seed, '/nonexistent/never.png')
  message = info.value.code
  assert isinstance(message, str), message  # sys.exit(str): status 1
  assert message.startswith('error: ') and '\n' not in message and message.endswith('.'), message
  return message


def test_a_missing_work_directory_is_one_sentence(tmp_path, monkeypatch):
  assert _error([tmp_path, tmp_path / 'nowhere'], monkeypatch) == (
      f"error: The work directory '{tmp_path / 'nowhere'}' does not exist.")


@pytest.mark.parametrize('workdirs', [[], ['']])
def test_no_work_directories_is_one_sentence(workdirs, monkeypatch):
  assert _error(workdirs, monkeypatch) == (
      f"error: --workdirs={','.join(workdirs)!r} must name one or more work directories of "
      'trained autoencoder runs, separated by commas.')


@pytest.mark.parametrize('num', [0, 33])
def test_a_bad_num_is_one_sentence(tmp_path, monkeypatch, num):
  assert _error([tmp_path], monkeypatch, num=num) == (
      f'error: --num={num} is not allowed; reconstruct from 1 to 32 images.')


@pytest.mark.parametrize('num', [1, 32])
def test_one_and_32_images_are_allowed(tmp_path, num):
  assert plot_reconstructions._check_workdirs([str(tmp_path)], num) == [str(tmp_path)]


def test_a_negative_seed_is_one_sentence_naming_the_flag(tmp_path, monkeypatch):
  # It was NumPy's 'error: expected non-negative integer', after every run was built.
  assert _error([tmp_path], monkeypatch, seed=-1) == (
      "error: --seed=-1 must be an integer of at least 0 (it seeds NumPy's choice of the test "
      'images).')


def test_a_run_of_another_model_is_one_sentence(tmp_path, data_dir, monkeypatch):
  (tmp_path / 'config.json').write_text(_config(data_dir, 'mlp').to_json())
  assert _error([tmp_path], monkeypatch) == (
      f"error: The run in '{tmp_path}' trained model 'mlp', not an autoencoder; allowed: "
      'autoencoder, denoising_autoencoder, sparse_autoencoder, contractive_autoencoder, vae.')


def _fake_run_directory(path, config):
  os.makedirs(path)
  (path / 'config.json').write_text(config.to_json())
  return path


@pytest.mark.parametrize('field, value, evaluated', [('name', 'mnist', 'mnist/test'),
                                                      ('eval_split', 'train', 'digits/train')])
def test_runs_on_other_images_are_one_sentence(tmp_path, data_dir, monkeypatch, field, value,
                                               evaluated):
  first = _fake_run_directory(tmp_path / 'a', _config(data_dir, 'sparse_autoencoder'))
  config = _config(data_dir, 'contractive_autoencoder')
  config.data[field] = value
  second = _fake_run_directory(tmp_path / 'b', config)
  assert _error([first, second], monkeypatch) == (
      f"error: All runs must reconstruct the same test images, but '{first}' evaluates on "
      f"digits/test and '{second}' on {evaluated}.")


def test_runs_of_other_image_shapes_and_a_gaussian_vae_are_one_sentence(tmp_path, data_dir,
                                                                        monkeypatch):
  first = _fake_run_directory(tmp_path / 'a', _config(data_dir, 'sparse_autoencoder'))
  second = _fake_run_directory(tmp_path / 'b', _config(data_dir, 'autoencoder',
                                                       image_shape=(4, 4, 1)))
  assert _error([first, second], monkeypatch, build=True) == (
      f"error: All runs must have the same image shape, but '{first}' has (8, 8, 1) and "
      f"'{second}' has (4, 4, 1).")
  gaussian = _fake_run_directory(tmp_path / 'c', _config(data_dir, 'vae', decoder='gaussian'))
  assert _error([first, gaussian], monkeypatch, build=True) == (
      f"error: The model of the run in '{gaussian}' is a VAE with decoder='gaussian', which has "
      "no Bernoulli cross-entropy; only decoder='bernoulli' VAEs are allowed.")


def test_a_run_without_a_checkpoint_is_refused_before_any_run_is_computed(tmp_path, data_dir,
                                                                          monkeypatch):
  trained = _fake_run(str(tmp_path / 'dae'), _config(data_dir, 'denoising_autoencoder'))
  untrained = tmp_path / 'untrained'
  untrained.mkdir()
  (untrained / 'config.json').write_text(_config(data_dir, 'autoencoder').to_json())
  computed = []
  monkeypatch.setattr(plot_reconstructions, 'compute', lambda *a: computed.append(a))
  with pytest.raises(SystemExit) as info:
    plot_reconstructions.run([trained, str(untrained)], 4, 0, str(tmp_path / 'figure.png'))
  assert info.value.code == (f"error: No checkpoint in {str(untrained / 'checkpoints')!r}: "
                             'the run has saved none.')
  assert not computed and not os.path.exists(tmp_path / 'figure.png')


@pytest.mark.parametrize('name', ['folder', 'figure.pngg'])
def test_an_output_that_cannot_be_written_is_refused_before_any_run_is_read(tmp_path,
                                                                            monkeypatch, name):
  (tmp_path / 'folder').mkdir()
  monkeypatch.setattr(loop, 'read_config', lambda *a: pytest.fail('a run was read'))
  with pytest.raises(SystemExit) as info:
    plot_reconstructions.run([str(tmp_path)], 4, 0, str(tmp_path / name))
  assert info.value.code.startswith(f'error: --output={tmp_path / name} ')
