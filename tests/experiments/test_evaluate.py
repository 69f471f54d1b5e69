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


def test_a_set_value_is_everything_after_the_first_equals_sign_of_a_known_key():
  # A folder such as /runs/lr=0.1 is a value of its own; only the first '=' ends the key.
  config = ml_collections.ConfigDict({'data': {'data_dir': '', 'window': 8}, 'note': ''})
  applied = evaluate.apply_overrides(config, ['data.data_dir=/runs/lr=0.1', "note='a=b'",
                                              'data.window=16'])
  assert applied == {'data.data_dir': '/runs/lr=0.1', 'note': 'a=b', 'data.window': 16}
  assert (config.data.data_dir, config.note, config.data.window) == ('/runs/lr=0.1', 'a=b', 16)
  with pytest.raises(ValueError, match="--set='data.widow=16': data has no key 'widow'"):
    evaluate.apply_overrides(config, ['data.widow=16'])  # not a new key under a typo


def test_the_model_that_fits_is_evaluated_and_appended(mlp_run):
  record = evaluate.run(mlp_run, overrides=['eval_batch_size=60'])
  assert record['overrides'] == {'eval_batch_size': 60}
  with open(os.path.join(mlp_run, evaluate.OUTPUT_FILE), encoding='utf-8') as f:
    assert [json.loads(line) for line in f] == [json.loads(json.dumps(record))]
  os.remove(os.path.join(mlp_run, evaluate.OUTPUT_FILE))
  assert record['step'] == 2 and np.isfinite(record['metrics']['loss'])


def _by_hand(workdir, params):
  """(mean −log softmax(logits)[label], accuracy) of the MLP applied by hand, in float64, to the
  360 test images (pixels / 16, flattened) with `params`."""
  import data  # pylint: disable=g-import-not-at-top
  from train import loop  # pylint: disable=g-import-not-at-top
  source = data.load('digits', 'test', data_dir=loop.read_config(workdir).data.data_dir)
  x = np.stack([np.asarray(source[i]['image'], np.float64).reshape(-1) / 16
                for i in range(len(source))])
  labels = np.array([int(source[i]['label']) for i in range(len(source))])
  assert len(labels) == 360
  dense = lambda name, h: h @ params[name]['kernel'] + params[name]['bias']
  logits = dense('Dense_1', np.maximum(dense('Dense_0', x), 0))
  top = logits.max(axis=1)
  nll = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top - logits[np.arange(360), labels]
  return nll.mean(), np.mean(logits.argmax(axis=1) == labels)


@pytest.mark.parametrize('batch_size', [60, 100])  # 100: the last batch is padded
def test_the_metrics_are_those_of_the_checkpoint_on_every_test_image_once(mlp_run, batch_size):
  from train import checkpoint  # pylint: disable=g-import-not-at-top
  record = evaluate.evaluate(mlp_run, batch_size=batch_size)
  loss, accuracy = _by_hand(mlp_run, checkpoint.restore_arrays(mlp_run)['params'])
  assert record['metrics']['loss'] == pytest.approx(loss, rel=1e-5)
  assert record['metrics']['accuracy'] == pytest.approx(accuracy, abs=1e-6)
  assert record['weights'] == 'params'


def test_the_batch_size_asked_for_is_the_one_evaluated_with(mlp_run, monkeypatch):
  # The metrics do not depend on it (above), so the evaluation is replaced by a record of it.
  from train import loop  # pylint: disable=g-import-not-at-top
  used = []
  monkeypatch.setattr(loop.Run, 'evaluate',
                      lambda self, step, state: used.append(self.config.eval_batch_size) or {})
  evaluate.evaluate(mlp_run, batch_size=7)
  evaluate.evaluate(mlp_run)
  assert used == [7, 120]


@pytest.mark.parametrize('options, message', [
    ({'window': 0}, '--window must be a positive integer, got 0.'),
    ({'batch_size': 0}, '--batch_size must be a positive integer, got 0.'),
    ({'window': 16}, "--window applies to token windows; the run in '{}' reads 'digits' without "
                     'them.'),
])
def test_bad_window_or_batch_size_is_one_sentence(mlp_run, options, message):
  with pytest.raises(ValueError) as info:
    evaluate.evaluate(mlp_run, **options)
  assert_one_sentence(str(info.value), message.format(mlp_run))


def test_the_average_is_evaluated_unless_ema_decay_is_set_to_0(mlp_run, tmp_path, data_dir):
  # --set=ema_decay=0 was recorded as an override while the average was evaluated all the same,
  # and a decay other than the run's named an average the checkpoints do not hold.
  from train import checkpoint  # pylint: disable=g-import-not-at-top
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.model = ml_collections.ConfigDict({'name': 'mlp', 'features': (10, 10),
                                            'dtype': 'float32'})
  config.eval_batch_size, config.ema_decay = 120, 0.9
  workdir = fake_runs.save_random_run(config, str(tmp_path / 'ema_run'))
  saved = checkpoint.restore_arrays(workdir)
  average, params = (_by_hand(workdir, saved[name]) for name in ('ema_params', 'params'))
  assert average[0] != pytest.approx(params[0], rel=1e-3)
  for overrides, weights, (loss, _) in (([], 'ema', average), (['ema_decay=0.9'], 'ema', average),
                                        (['ema_decay=0'], 'params', params)):
    record = evaluate.evaluate(workdir, overrides=overrides)
    assert record['weights'] == weights
    assert record['metrics']['loss'] == pytest.approx(loss, rel=1e-5)
  assert _refusal(workdir, 'ema_decay=0.5') == (
      '--set=ema_decay=0.5: the checkpoints hold the parameters and their average of decay 0.9; '
      'only --set=ema_decay=0 (evaluate the parameters) changes the weights evaluated.')
  assert _refusal(mlp_run, 'ema_decay=0.9') == (
      '--set=ema_decay=0.9: the checkpoints hold the parameters and no average; only '
      '--set=ema_decay=0 (evaluate the parameters) changes the weights evaluated.')


def test_a_record_file_that_is_a_folder_is_refused_before_the_evaluation(tmp_path, monkeypatch):
  # It was an IsADirectoryError traceback after the whole evaluation.
  (tmp_path / evaluate.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(evaluate, 'evaluate', lambda *a, **k: pytest.fail('evaluated'))
  with pytest.raises(SystemExit) as info:
    evaluate.run(str(tmp_path))
  assert info.value.code == (f"error: '{tmp_path / evaluate.OUTPUT_FILE}', the file the record "
                             'is appended to, is a folder.')


def test_a_record_file_that_cannot_be_written_is_refused_before_the_evaluation(tmp_path,
                                                                               monkeypatch):
  # It was a PermissionError traceback after the whole evaluation. As root os.access allows
  # everything, so the refusal of writes to the record is simulated.
  record = tmp_path / evaluate.OUTPUT_FILE
  record.write_text('{"step": 1}\n')
  access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) != str(record) and access(p, mode))
  monkeypatch.setattr(evaluate, 'evaluate', lambda *a, **k: pytest.fail('evaluated'))
  with pytest.raises(SystemExit) as info:
    evaluate.run(str(tmp_path))
  assert info.value.code == (f"error: '{record}', the file the record is appended to, cannot be "
                             f'written: permission denied on the file {record}.')
  assert record.read_text() == '{"step": 1}\n'
