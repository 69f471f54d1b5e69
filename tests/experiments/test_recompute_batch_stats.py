"""The batch-statistics script on a tiny ResNet run on digits: it writes the eval metrics
before and after and changes nothing else in the work directory; bad inputs stop it with one
sentence before anything is compiled."""

import hashlib
import json
import math
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from experiments import recompute_batch_stats as script
from experiments.configs import digits_mlp
from train import checkpoint
from tests.experiments import fake_runs


def _config(data_dir, model):
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.model = ml_collections.ConfigDict(model)
  config.num_train_steps = 3
  config.optimizer.warmup_steps = 1
  config.global_batch_size = 32
  config.eval_batch_size = 120  # the 360 test images in 3 batches
  for name in ('log_every_steps', 'eval_every_steps', 'checkpoint_every_steps'):
    config[name] = 3
  return config


_TINY_RESNET = {'name': 'resnet20', 'stage_sizes': (1, 1), 'stage_widths': (4, 8),
                'stem_width': 4, 'dtype': 'float32'}  # 6 BatchNorm layers, 8×8×1 digits


def _files(workdir) -> dict:
  """{relative path: sha256} of every file under `workdir`."""
  digests = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digests[os.path.relpath(path, workdir)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def _record_what_recompute_is_given(monkeypatch, batch_stats) -> tuple[list, list]:
  """Wraps `batch_stats.recompute_batch_stats`; returns the lists it fills as the script runs:
  (model inputs, mask) of every batch fed, and the variables of every call."""
  fed, given = [], []
  recompute = batch_stats.recompute_batch_stats

  def recording(module, variables, batches, *, model_inputs, **kwargs):
    given.append(variables)
    def recorded():
      for batch in batches():
        fed.append((np.asarray(model_inputs(batch)[0]), np.asarray(batch['mask'])))
        yield batch
    return recompute(module, variables, recorded, model_inputs=model_inputs, **kwargs)

  monkeypatch.setattr(batch_stats, 'recompute_batch_stats', recording)
  return fed, given


def _random_kernels(seed: int):
  """A `draw` for fake_runs.save_random_run: kernels N(0, 1/fan-in), scales and variances 1,
  everything else 0."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path[-1:], simple=True)
    if name == 'kernel':
      return rng.normal(size=leaf.shape).astype(leaf.dtype) / np.sqrt(np.prod(leaf.shape[:-1]))
    return np.full(leaf.shape, name in ('scale', 'var'), leaf.dtype)

  return draw


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory, data_dir):
  """The work directory of a tiny ResNet run whose checkpoint of step 3, written by the run's
  own Checkpointer, holds random parameters and the initial statistics (μ = 0, σ² = 1): drawn
  in NumPy, as compiling the random initialisation and a train step would take most of this
  test's time."""
  return fake_runs.save_random_run(_config(data_dir, _TINY_RESNET),
                                   str(tmp_path_factory.mktemp('resnet_run')), step=3,
                                   draw=_random_kernels(seed=0))


def test_writes_before_and_after_and_leaves_the_run_as_it_was(trained_run, capsys):
  before_files = _files(trained_run)
  assert any(path.startswith('checkpoints' + os.sep) for path in before_files)
  record = script.run(trained_run, examples=300, batch_size=64)

  after_files = _files(trained_run)
  assert set(after_files) == set(before_files) | {script.OUTPUT_FILE}
  assert {p: after_files[p] for p in before_files} == before_files  # checkpoints byte-identical
  with open(os.path.join(trained_run, script.OUTPUT_FILE), encoding='utf-8') as f:
    [written] = [json.loads(line) for line in f]
  assert written == json.loads(json.dumps(record))
  assert written['options'] == {'examples': 300, 'max_passes': None, 'batch_size': 64}
  for when in ('before', 'after'):
    assert set(written[when]) == {'accuracy', 'loss'}
    assert all(math.isfinite(v) for v in written[when].values())
  assert written['checkpoint_step'] == 3 and written['train_examples'] == 300
  assert written['batch_norm_layers'] == 6 and written['passes'] <= 6 and written['converged']
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith('before: accuracy=') and out[1].startswith('after: accuracy=')

  # Before: the checkpoint's variables as saved; after: its statistics replaced by those of
  # the first 300 training images (pixels × 1/16) as one batch. Both evaluated here over the
  # 360 test images in one apply: mean −log softmax(logits)[label] and accuracy.
  import data  # pylint: disable=g-import-not-at-top
  from train import batch_stats, loop  # pylint: disable=g-import-not-at-top

  def prepared(split, count):
    source = data.load('digits', split, data_dir=loop.read_config(trained_run).data.data_dir)
    records = [source[i] for i in range(count)]
    return (np.stack([np.asarray(r['image'], np.float32) for r in records]) / 16,
            np.array([int(r['label']) for r in records]))

  model = loop.build_parts(loop.read_config(trained_run), trained_run)[-1]
  variables = checkpoint.eval_variables(checkpoint.restore_arrays(trained_run))
  train_images, _ = prepared('train', 300)
  test_images, test_labels = prepared('test', 360)
  population, _ = batch_stats.recompute_batch_stats(model, variables, lambda: [train_images])

  def metrics(stats):
    logits = np.asarray(model.apply({**variables, 'batch_stats': stats}, test_images,
                                    train=False), np.float64)
    nll = (np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1))
           + logits.max(-1) - logits[np.arange(360), test_labels])
    return {'accuracy': np.mean(np.argmax(logits, -1) == test_labels), 'loss': np.mean(nll)}

  expected = {'before': metrics(variables['batch_stats']), 'after': metrics(population)}
  # The initial statistics (μ = 0, σ² = 1) are far from the population ones.
  assert abs(expected['after']['loss'] - expected['before']['loss']) > 0.05
  for when in ('before', 'after'):
    assert written[when]['accuracy'] == pytest.approx(expected[when]['accuracy'], abs=1e-6)
    assert written[when]['loss'] == pytest.approx(expected[when]['loss'], rel=1e-6)


def test_each_call_appends_its_record_with_its_options(trained_run, tmp_path):
  # A copy of the run, holding the single record an earlier version wrote, which stays as it is.
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained_run, workdir, ignore=shutil.ignore_patterns('batch_stats_recomputed*'))
  old = os.path.join(workdir, 'batch_stats_recomputed.json')
  with open(old, 'w', encoding='utf-8') as f:
    f.write('{"train_examples": 1}\n')
  first = script.run(workdir, examples=100, max_passes=1)
  second = script.run(workdir, examples=200, batch_size=50)
  with open(os.path.join(workdir, 'batch_stats_recomputed.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  assert records == json.loads(json.dumps([first, second]))
  assert [(r['options'], r['batch_size'], r['train_examples'], r['passes']) for r in records] == [
      ({'examples': 100, 'max_passes': 1, 'batch_size': None}, 120, 100, 1),
      ({'examples': 200, 'max_passes': None, 'batch_size': 50}, 50, 200, records[1]['passes'])]
  with open(old, encoding='utf-8') as f:
    assert f.read() == '{"train_examples": 1}\n'


def test_the_statistics_come_from_the_first_training_examples_as_evaluated(trained_run,
                                                                            monkeypatch):
  # What the recomputation is fed, against the run's first 300 training examples read here
  # (not the eval split, not the training transform).
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import batch_stats, loop  # pylint: disable=g-import-not-at-top
  fed, _ = _record_what_recompute_is_given(monkeypatch, batch_stats)
  record = script.recompute(trained_run, examples=300, batch_size=64)
  first_pass = []
  for inputs, mask in fed:
    first_pass.append(inputs[mask > 0])
    if sum(map(len, first_pass)) >= 300:
      break
  train_source, _, _, task, _ = loop.build_parts(loop.read_config(trained_run), trained_run)
  batch = task.preprocess(pipeline.read_batch(train_source, np.arange(300)))
  expected = np.asarray(task.model_inputs(task.transform({}, batch, False))[0])
  np.testing.assert_array_equal(np.concatenate(first_pass)[:300], expected)
  assert record['train_examples'] == 300


def _error(workdir, monkeypatch, **kwargs) -> str:
  def unreachable(*args, **kwargs):
    raise AssertionError('the checkpoint was read (and its digest compiled) before the error')
  monkeypatch.setattr(checkpoint, 'restore_arrays', unreachable)
  with pytest.raises(SystemExit) as info:
    script.run(str(workdir), **kwargs)
  message = info.value.code
  assert isinstance(message, str), message  # sys.exit(str): status 1
  assert message.startswith('error: ') and '\n' not in message and message.endswith('.'), message
  return message


def test_a_missing_work_directory_is_one_sentence(tmp_path, monkeypatch):
  message = _error(tmp_path / 'nowhere', monkeypatch)
  assert 'nowhere' in message and 'does not exist' in message


def test_a_run_without_checkpoint_is_one_sentence(tmp_path, data_dir, monkeypatch):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'config.json').write_text(_config(data_dir, _TINY_RESNET).to_json())
  assert 'no checkpoint' in _error(workdir, monkeypatch)


def test_a_checkpoint_folder_without_a_step_is_one_sentence(tmp_path, data_dir, monkeypatch):
  # Only numbered folders are checkpoints (a save interrupted leaves others).
  workdir = tmp_path / 'w'
  (workdir / 'checkpoints' / '3.orbax-checkpoint-tmp').mkdir(parents=True)
  (workdir / 'config.json').write_text(_config(data_dir, _TINY_RESNET).to_json())
  assert 'no checkpoint' in _error(workdir, monkeypatch)


def test_every_example_of_the_training_split_is_allowed(trained_run, monkeypatch):
  # --examples=1437, the whole split, passes the checks and goes on to read the checkpoint.
  class Reached(Exception):
    pass

  def reached(*args, **kwargs):
    raise Reached()
  monkeypatch.setattr(checkpoint, 'restore_arrays', reached)
  with pytest.raises(Reached):
    script.recompute(trained_run, examples=1437)


def test_the_record_reports_what_the_recomputation_did(trained_run, monkeypatch):
  # With all examples (--examples not given), the record's counts are the recomputation's own;
  # statistics returned unchanged leave the metrics as they were.
  from train import batch_stats  # pylint: disable=g-import-not-at-top
  info = {'examples': 1437, 'passes': 2, 'converged': False, 'changes': [0.5, 0.25],
          'layers': ['a', 'b', 'c']}
  monkeypatch.setattr(batch_stats, 'recompute_batch_stats',
                      lambda module, variables, *a, **k: (variables['batch_stats'], info))
  record = script.recompute(trained_run, max_passes=2)
  assert record['options'] == {'examples': None, 'max_passes': 2, 'batch_size': None}
  assert (record['train_examples'], record['passes'], record['converged'],
          record['largest_change_per_pass'], record['batch_norm_layers']) == (
              1437, 2, False, [0.5, 0.25], 3)
  assert record['after'] == record['before']


def test_a_model_without_batch_norm_is_one_sentence(tmp_path, data_dir, monkeypatch):
  workdir = tmp_path / 'w'
  (workdir / 'checkpoints' / '3').mkdir(parents=True)
  mlp = {'name': 'mlp', 'features': (16, 10), 'dtype': 'float32'}
  (workdir / 'config.json').write_text(_config(data_dir, mlp).to_json())
  message = _error(workdir, monkeypatch)
  assert "'mlp'" in message and 'no BatchNorm layer' in message


def test_a_non_positive_option_is_one_sentence(trained_run, monkeypatch):
  assert '--examples must be a positive integer, got 0.' in _error(trained_run, monkeypatch,
                                                                    examples=0)



def test_more_examples_than_the_training_split_is_one_sentence(trained_run, monkeypatch):
  # The 1,437 training images of digits: 1,438 used to be accepted and all 1,437 used, the
  # record keeping the 1,438 asked for.
  before = _files(trained_run)
  assert _error(trained_run, monkeypatch, examples=1438) == (
      "error: --examples=1438 exceeds the 1437 examples of the run's training split 'train'; "
      'give at most 1437.')
  assert _files(trained_run) == before

@pytest.fixture(scope='module')
def augmented_ema_run(tmp_path_factory, data_dir):
  """The tiny ResNet run with a train-time flip of every image and a parameter EMA, whose
  checkpoint holds independent random draws for the parameters and their average."""
  config = _config(data_dir, _TINY_RESNET)
  config.task.augment = [('vertical_flip', {'p': 1.0})]
  config.ema_decay = 0.99
  return fake_runs.save_random_run(config, str(tmp_path_factory.mktemp('augmented_ema_run')),
                                   step=3, draw=_random_kernels(seed=1))


def test_statistics_use_unaugmented_inputs_and_the_parameter_average(augmented_ema_run,
                                                                     monkeypatch):
  # The images are fed as evaluated (not flipped, as training flips every one) through the
  # network evaluation uses: the parameter average the checkpoint holds, not the parameters.
  from train import batch_stats  # pylint: disable=g-import-not-at-top
  fed, given = _record_what_recompute_is_given(monkeypatch, batch_stats)
  script.recompute(augmented_ema_run, examples=64, batch_size=64, max_passes=1)
  import data  # pylint: disable=g-import-not-at-top
  from train import loop  # pylint: disable=g-import-not-at-top
  source = data.load('digits', 'train',
                     data_dir=loop.read_config(augmented_ema_run).data.data_dir)
  images = np.stack([np.asarray(source[i]['image'], np.float32) for i in range(64)]) / 16
  inputs, mask = fed[0]
  assert mask.sum() == 64
  np.testing.assert_allclose(inputs[mask > 0], images, rtol=1e-6)
  saved = checkpoint.restore_arrays(augmented_ema_run)
  assert saved['ema_params'] is not None
  kernel = lambda params: np.asarray(params['head']['kernel'])
  np.testing.assert_allclose(kernel(given[0]['params']), kernel(saved['ema_params']), rtol=1e-6)
  assert not np.allclose(kernel(saved['ema_params']), kernel(saved['params']), rtol=0.1)


def test_a_record_file_that_is_a_folder_is_refused_before_the_recomputation(tmp_path,
                                                                          monkeypatch):
  # It was an IsADirectoryError traceback after both evaluations and the recomputation.
  (tmp_path / script.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(script, 'recompute', lambda *a, **k: pytest.fail('recomputed'))
  with pytest.raises(SystemExit) as info:
    script.run(str(tmp_path))
  assert info.value.code == (f"error: '{tmp_path / script.OUTPUT_FILE}', the file the record "
                             'is appended to, is a folder.')
