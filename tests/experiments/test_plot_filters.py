"""The filters figure: the first convolution found by interception is the stem's, its maps are
that kernel's correlation with the prepared image, and the PNG is written."""

import os
import types

from absl import app
import numpy as np
import pytest

from experiments import plot_filters
from models.vision import resnet
from tests.experiments.test_recompute_batch_stats import (  # pylint: disable=unused-import
    augmented_ema_run)
from tests.messages import assert_one_sentence
from train import checkpoint


def test_first_conv_is_the_stem_and_its_maps_are_the_correlation():
  import jax  # pylint: disable=g-import-not-at-top
  module = resnet.ResNet(num_classes=3, stage_sizes=(1,), stage_widths=(4,), stem_width=4,
                         small_input_stem=True)
  x = np.random.default_rng(0).normal(size=(2, 6, 6, 1)).astype(np.float32)
  variables = module.init(jax.random.PRNGKey(0), x)
  kernel, maps = plot_filters.first_conv(module, variables, (x,))
  stem = np.asarray(variables['params']['stem_conv']['kernel'])
  np.testing.assert_array_equal(kernel, stem)
  # 'SAME' 3×3 cross-correlation of image 0, by a loop over output pixels.
  padded = np.pad(x[0, :, :, 0], 1)
  expected = np.array([[[np.sum(padded[i:i + 3, j:j + 3] * stem[:, :, 0, k]) for k in range(4)]
                        for j in range(6)] for i in range(6)])
  np.testing.assert_allclose(maps, expected, rtol=1e-5, atol=1e-5)


def test_writes_the_figure_of_a_run(augmented_ema_run, data_dir, tmp_path, monkeypatch):
  # Test image 8 (label 3; image 0 is a 1 and training image 8 an 8), as the digits task
  # prepares it for evaluation: the raw 0..16 pixels times input_scale = 1/16, read here from
  # the data set, not flipped as the run's training augmentation flips every image.
  import data  # pylint: disable=g-import-not-at-top
  record = data.load('digits', 'test', data_dir=data_dir)[8]
  expected = np.asarray(record['image'], np.float32)[None] / 16
  label = int(record['label'])
  assert label == 3 and expected.max() == 1

  seen, found, figures = [], [], []
  first_conv = plot_filters.first_conv

  def recording(module, variables, inputs):
    seen.append([np.asarray(x) for x in inputs])
    found.append(first_conv(module, variables, inputs))
    return found[-1]

  close = plot_filters.plt.close
  monkeypatch.setattr(plot_filters, 'first_conv', recording)
  monkeypatch.setattr(plot_filters.plt, 'close', lambda fig: (figures.append(fig), close(fig)))
  output = str(tmp_path / 'filters.png')
  what = plot_filters.plot(augmented_ema_run, 8, output)
  assert len(seen) == 1 and len(seen[0]) == 1
  np.testing.assert_array_equal(seen[0][0], expected)
  titles = [ax.get_title() for ax in figures[0].axes]
  assert f'input (test image 8, label {label})' in titles
  assert os.path.getsize(output) > 1000 and '4 kernels of 3×3' in what
  # The panels show the input, then each kernel's input channel 0, then each kernel's map.
  kernel, maps = found[0]
  # The kernels of the parameter average the run kept (evaluation's), not of the parameters.
  saved = checkpoint.restore_arrays(augmented_ema_run)
  np.testing.assert_array_equal(kernel, saved['ema_params']['stem_conv']['kernel'])
  assert not np.allclose(kernel, saved['params']['stem_conv']['kernel'], rtol=0.1)
  shown = [np.asarray(ax.images[0].get_array()) for ax in figures[0].axes if ax.images]
  assert len(shown) == 1 + 4 + 4
  np.testing.assert_array_equal(shown[0], expected[0, :, :, 0])
  for k in range(4):
    np.testing.assert_array_equal(shown[1 + k], kernel[:, :, 0, k])
    np.testing.assert_array_equal(shown[5 + k], maps[:, :, k])
  assert 'step 3' in what and saved['step'] == 3


@pytest.mark.parametrize('index', [360, -1])
def test_an_index_outside_the_eval_split_is_one_sentence(augmented_ema_run, tmp_path, index):
  with pytest.raises(ValueError, match=rf'^--index={index} is outside the eval split, which has '
                                       r'360 examples\.$'):
    plot_filters.plot(augmented_ema_run, index, str(tmp_path / 'f.png'))


def test_a_run_that_is_not_an_image_classifier_is_one_sentence(tmp_path):
  from experiments.configs import fashion_mnist_autoencoder  # pylint: disable=g-import-not-at-top
  config = fashion_mnist_autoencoder.get_config()
  config.data.name, config.data.data_dir = 'digits', str(tmp_path / 'data')
  (tmp_path / 'config.json').write_text(config.to_json())
  with pytest.raises(ValueError) as info:
    plot_filters.plot(str(tmp_path), 0, str(tmp_path / 'f.png'))
  assert_one_sentence(str(info.value), f"The run in '{tmp_path}' (model 'denoising_autoencoder', task "
                      "'autoencoder', inputs (8, 8, 1)) is not a classifier of images [H, W, C]")
  assert not os.path.exists(tmp_path / 'f.png')


def test_a_classifier_of_sequences_is_one_sentence(tmp_path):
  from experiments.configs import mnist1d_cnn  # pylint: disable=g-import-not-at-top
  config = mnist1d_cnn.get_config()
  config.data.data_dir = str(tmp_path / 'data')
  (tmp_path / 'config.json').write_text(config.to_json())
  with pytest.raises(ValueError) as info:
    plot_filters.plot(str(tmp_path), 0, str(tmp_path / 'f.png'))
  assert_one_sentence(str(info.value), "(model 'cnn1d', task 'classification', inputs (40,)) is "
                      'not a classifier of images [H, W, C]')


@pytest.mark.parametrize('name, message', [
    ('folder', 'is a folder; give the file to write in it.'),
    ('filters.txt', 'must end in a figure format: '),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_run_is_read(
    tmp_path, monkeypatch, name, message):
  # A folder made matplotlib write <folder>.png while the script named the folder, and .txt
  # failed in savefig once the run was read and drawn.
  (tmp_path / 'folder').mkdir()
  monkeypatch.setattr(plot_filters, '_WORKDIR', types.SimpleNamespace(value=str(tmp_path)))
  monkeypatch.setattr(plot_filters, '_OUTPUT', types.SimpleNamespace(value=str(tmp_path / name)))
  monkeypatch.setattr(plot_filters, 'plot', lambda *a: pytest.fail('the run was read'))
  with pytest.raises(app.UsageError) as info:
    plot_filters.main(['plot_filters'])
  assert_one_sentence(str(info.value), f'--output={tmp_path / name} {message}')
