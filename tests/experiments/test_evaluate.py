"""experiments.evaluate on a digits MLP run whose checkpoint holds drawn parameters: a `--set`
that changes the model's parameters from the checkpoint's is refused in one sentence naming the
first leaf that differs, and nothing is appended to evaluations.jsonl."""

import json
import os

import ml_collections
import numpy as np
import pytest

from experiments import evaluate
from experiments.configs import digits_mlp
from tests.experiments import fake_runs
from tests.messages import assert_one_sentence


@pytest.fixture(scope='module')
def mlp_run(tmp_path_factory, data_dir):
  """A run of an MLP with layers of 10 and 10 units on the 64 digit pixels.

  The hidden layer is as wide as the output, so that an override dropping the output layer
  still gives the 10 logits of the data's 10 classes (the model is refused otherwise)."""
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.model = ml_collections.ConfigDict({'name': 'mlp', 'features': (10, 10),
                                            'dtype': 'float32'})
  config.eval_batch_size = 120
  return fake_runs.save_random_run(config, str(tmp_path_factory.mktemp('mlp_run')))


def _refusal(workdir, override) -> str:
  with pytest.raises(SystemExit) as info:
    evaluate.run(workdir, overrides=[override])
  message = info.value.code
  assert isinstance(message, str) and message.startswith('error: '), message
  assert not os.path.exists(os.path.join(workdir, evaluate.OUTPUT_FILE))
  return message.removeprefix('error: ')


@pytest.mark.parametrize('features, difference', [
    # Dropping the output layer: the checkpoint's Dense_1 is left over.
    ('(10,)', 'the model has no params/Dense_1/bias (float32 (10,) in the checkpoint)'),
    # A third layer: the model's Dense_2 is not in the checkpoint.
    ('(10, 10, 10)', 'the checkpoint has no params/Dense_2/bias (float32 (10,) in the model)'),
    # Another width: Dense_0's kernel is 64 × 10 in the checkpoint.
    ('(8, 10)', 'params/Dense_0/bias is float32 (10,) in the checkpoint but float32 (8,) in '
                'the model'),
])
def test_a_model_that_does_not_fit_the_checkpoint_is_refused(mlp_run, features, difference):
  assert_one_sentence(_refusal(mlp_run, f'model.features={features}'),
                      f"The checkpoint of '{mlp_run}' does not fit the model under "
                      f'--set=model.features={features}: {difference}.')


def test_the_model_that_fits_is_evaluated_and_appended(mlp_run):
  record = evaluate.run(mlp_run, overrides=['eval_batch_size=60'])
  with open(os.path.join(mlp_run, evaluate.OUTPUT_FILE), encoding='utf-8') as f:
    assert [json.loads(line) for line in f] == [json.loads(json.dumps(record))]
  os.remove(os.path.join(mlp_run, evaluate.OUTPUT_FILE))
  assert record['step'] == 2 and np.isfinite(record['metrics']['loss'])


@pytest.mark.parametrize('batch_size', [60, 100])  # 100: the last batch is padded
def test_the_metrics_are_those_of_the_checkpoint_on_every_test_image_once(mlp_run, batch_size):
  # The MLP applied by hand, in float64, to the 360 test images (pixels / 16, flattened) with
  # the checkpoint's parameters: mean −log softmax(logits)[label] and accuracy.
  import data  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top
  record = evaluate.evaluate(mlp_run, batch_size=batch_size)
  params = checkpoint.restore_arrays(mlp_run)['params']
  source = data.load('digits', 'test', data_dir=loop.read_config(mlp_run).data.data_dir)
  x = np.stack([np.asarray(source[i]['image'], np.float64).reshape(-1) / 16
                for i in range(len(source))])
  labels = np.array([int(source[i]['label']) for i in range(len(source))])
  assert len(labels) == 360
  dense = lambda name, h: h @ params[name]['kernel'] + params[name]['bias']
  logits = dense('Dense_1', np.maximum(dense('Dense_0', x), 0))
  top = logits.max(axis=1)
  nll = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top - logits[np.arange(360), labels]
  assert record['metrics']['loss'] == pytest.approx(nll.mean(), rel=1e-5)
  assert record['metrics']['accuracy'] == pytest.approx(np.mean(logits.argmax(axis=1) == labels),
                                                        abs=1e-6)


def test_a_record_file_that_is_a_folder_is_refused_before_the_evaluation(tmp_path, monkeypatch):
  # It was an IsADirectoryError traceback after the whole evaluation.
  (tmp_path / evaluate.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(evaluate, 'evaluate', lambda *a, **k: pytest.fail('evaluated'))
  with pytest.raises(SystemExit) as info:
    evaluate.run(str(tmp_path))
  assert info.value.code == (f"error: '{tmp_path / evaluate.OUTPUT_FILE}', the file the record "
                             'is appended to, is a folder.')
