"""The attention figure: greedy decoding of a checkpointed seq2seq run, its weights and the PNG."""

import os
import subprocess
import sys
import types

import ml_collections
import numpy as np
import pytest

from experiments import plot_attention
from experiments.configs import dates_seq2seq_attention
from train import loop
from train.tasks import seq2seq
from tests.experiments import fake_runs
from tests.messages import assert_one_sentence
from tests.subprocess_util import REPO_ROOT


def _run(tmp_path_factory, data_dir, attention, ema_decay=0.0):
  """A tiny dates run with a checkpoint of step 2 holding random parameters (and, with an
  `ema_decay`, an independent random parameter average)."""
  config = dates_seq2seq_attention.get_config()
  config.data.data_dir = data_dir
  config.ema_decay = ema_decay
  config.model.features, config.model.embed_dim, config.model.attention_features = 8, 4, 8
  config.model.attention = attention
  config.model.bidirectional_encoder = attention != 'dot'
  config.global_batch_size, config.eval_batch_size = 4, 4
  workdir = str(tmp_path_factory.mktemp(f'dates_{attention}'))
  return fake_runs.save_random_run(ml_collections.ConfigDict(config.to_dict()), workdir)


@pytest.fixture(scope='module')
def attention_run(tmp_path_factory, data_dir):
  return _run(tmp_path_factory, data_dir, 'additive', ema_decay=0.99)


def test_figure_shows_the_greedy_decoding_and_weights_over_the_valid_source(attention_run,
                                                                            tmp_path):
  from data import pipeline  # pylint: disable=g-import-not-at-top
  from train import checkpoint
  config = loop.read_config(attention_run)
  _, eval_source, _, task, module = loop.build_parts(config, attention_run)
  state = checkpoint.restore_arrays(attention_run)
  # The run kept a parameter average, which evaluation (and so the figure) uses.
  variables = {'params': state['ema_params']}
  batch = task.preprocess(pipeline.read_batch(eval_source, np.array([0, 3])))
  decoded, weights = plot_attention.decode_with_attention(task, module, variables, batch)
  # The decoded tokens are the task's greedy decoding; each row of weights is a distribution
  # over the source characters, none on the padding.
  np.testing.assert_array_equal(decoded, task.greedy_decode(
      module, variables, (batch['source'], batch['source_length'])))
  # The weights are those of the decoded sequence itself: fed back after BOS (greedy decoding
  # runs all N steps), it is its own argmax at every step, and that pass's weights are drawn.
  bos = np.full((len(decoded), 1), seq2seq.BOS_ID, np.int32)
  logits, state = module.apply(variables, np.concatenate([bos, decoded[:, :-1]], 1),
                               batch['source'], batch['source_length'], mutable=['intermediates'])
  np.testing.assert_array_equal(np.argmax(logits, -1), decoded)
  np.testing.assert_allclose(weights, state['intermediates']['attention'][0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  for row, length in enumerate(batch['source_length']):
    assert np.all(weights[row, :, length:] == 0)

  output = str(tmp_path / 'attention.png')
  lines = plot_attention.plot(attention_run, [0, 3], output)
  assert os.path.getsize(output) > 1000
  sources = [''.join(map(chr, batch['source'][k, :batch['source_length'][k]])) for k in range(2)]
  assert lines == [f'{s} → {seq2seq.decode_text(d)}' for s, d in zip(sources, decoded)]


def test_indices_outside_the_split_and_models_without_attention_are_one_sentence(
    attention_run, tmp_path_factory, data_dir, tmp_path):
  with pytest.raises(ValueError, match=r'^--indices \[2000\] are outside the eval split, which '
                                       r'has 2000 examples\.$'):
    plot_attention.plot(attention_run, [0, 2000], str(tmp_path / 'a.png'))
  with pytest.raises(ValueError, match=r'^--indices \[-1\] are outside the eval split'):
    plot_attention.plot(attention_run, [0, -1], str(tmp_path / 'a.png'))
  plain = _run(tmp_path_factory, data_dir, 'none')
  with pytest.raises(ValueError, match='has no attention to plot'):
    plot_attention.plot(plain, [0], str(tmp_path / 'b.png'))


@pytest.mark.parametrize('indices', ['', '-1,2', 'first'])
def test_indices_that_name_no_example_are_refused_before_the_run_is_read(tmp_path, indices):
  # An empty list passed the split's range check and failed in the figure (an empty index
  # array, a division by zero columns).
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.plot_attention', f'--workdir={tmp_path}',
       f'--indices={indices}'], cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
      capture_output=True, text=True, timeout=120)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  # Refused before the work directory (which holds no run) is read.
  assert_one_sentence(result.stderr.strip().splitlines()[-1],
                      f'--indices={indices} must be integers of at least 0')


def test_an_output_that_is_a_folder_is_refused_before_the_run_is_read(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.plot_attention', f'--workdir={tmp_path}',
       f'--output={tmp_path}'], cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr == f'error: --output={tmp_path} is a folder; give the file to write in it.\n'


def test_each_row_is_labelled_with_the_token_decoded_there(attention_run, tmp_path,
                                                           monkeypatch):
  # The rows were labelled with the decoded text and 'EOS': a padding or BOS token decoded
  # mid-sequence shifted every later label by a row, and a decoding without EOS got an 'EOS'
  # label below its last row.
  eos, pad, bos = seq2seq.EOS_ID, seq2seq.PAD_ID, seq2seq.BOS_ID
  decode = plot_attention.decode_with_attention

  given = []

  def crafted(task, module, variables, batch):
    decoded, weights = decode(task, module, variables, batch)
    decoded = np.full_like(decoded, ord('-'))  # no EOS
    decoded[0, :5] = [ord('A'), pad, bos, ord('B'), eos]
    given.append((weights, np.asarray(batch['source_length'])))
    return decoded, weights
  figures = []
  monkeypatch.setattr(plot_attention, 'decode_with_attention', crafted)
  monkeypatch.setattr(plot_attention.plt, 'close', figures.append)
  plot_attention.plot(attention_run, [0, 3], str(tmp_path / 'attention.png'))
  axes = [ax for ax in figures[0].axes if ax.images]
  num_steps = loop.read_config(attention_run).task.max_target_length + 1
  expected = [['A', 'PAD', 'BOS', 'B', 'EOS'], ['-'] * num_steps]
  [(weights, source_lengths)] = given
  assert source_lengths[0] != source_lengths[1]
  for k, (ax, labels) in enumerate(zip(axes, expected, strict=True)):
    assert ax.images[0].get_array().shape[0] == len(labels)
    # Example k's weights of its labelled rows over its own source characters.
    np.testing.assert_array_equal(ax.images[0].get_array(),
                                  weights[k, :len(labels), :source_lengths[k]])
    assert [t.get_text() for t in ax.get_yticklabels()] == labels
    assert list(ax.get_yticks()) == list(range(len(labels)))


def test_a_model_that_records_no_weights_is_refused_before_the_checkpoint_is_read(
    tmp_path_factory, data_dir, tmp_path, monkeypatch):
  # A Transformer encoder–decoder was decoded, then refused with the advice to set
  # config.model.attention='dot' or 'additive', options of the recurrent model only.
  from experiments.configs import dates_transformer  # pylint: disable=g-import-not-at-top
  from train import checkpoint  # pylint: disable=g-import-not-at-top
  config = dates_transformer.get_config()
  config.data.data_dir = data_dir
  config.model.update({'num_layers': 1, 'features': 8, 'num_heads': 2, 'mlp_dim': 16})
  config.global_batch_size, config.eval_batch_size, config.optimizer.warmup_steps = 4, 4, 0
  workdir = fake_runs.save_random_run(ml_collections.ConfigDict(config.to_dict()),
                                      str(tmp_path_factory.mktemp('dates_transformer')))
  plain = _run(tmp_path_factory, data_dir, 'none')
  monkeypatch.setattr(checkpoint, 'restore_arrays', lambda *a: pytest.fail('read'))
  with pytest.raises(ValueError) as info:
    plot_attention.plot(workdir, [0], str(tmp_path / 'a.png'))
  assert_one_sentence(str(info.value), (
      f"The model TransformerSeq2Seq of the run in {workdir!r} has no attention to plot: this "
      "script draws the weights that model 'seq2seq' with config.model.attention='dot' or "
      "'additive' records; a TransformerSeq2Seq records none."))
  with pytest.raises(ValueError) as info:
    plot_attention.plot(plain, [0], str(tmp_path / 'b.png'))
  assert_one_sentence(str(info.value), (
      f"The model Seq2Seq of the run in {plain!r} has no attention to plot "
      "(config.model.attention='none'); train one with config.model.attention='dot' or "
      "'additive'."))


def test_row_labels_show_printable_characters_and_name_the_special_tokens():
  eos, pad, bos = seq2seq.EOS_ID, seq2seq.PAD_ID, seq2seq.BOS_ID
  # Printable ASCII is 32 (space) … 126 ('~'); 127 (DEL) and other control ids are not.
  assert plot_attention.row_labels([ord(' '), ord('~'), 127, 31, pad, bos, ord('x')]) == [
      ' ', '~', '?', '?', 'PAD', 'BOS', 'x']
  assert plot_attention.row_labels([ord('a'), eos, ord('b')]) == ['a', 'EOS']  # to the first EOS


def test_the_command_accepts_example_0_and_writes_into_the_work_directory(tmp_path, monkeypatch):
  # Index 0, the first example of the split (and of the default --indices), is allowed.
  calls = []
  monkeypatch.setattr(plot_attention, 'FLAGS', types.SimpleNamespace(
      workdir=str(tmp_path), indices=['0', '2'], output=None))
  monkeypatch.setattr(plot_attention, 'plot', lambda *args: calls.append(args) or [])
  plot_attention.main(['plot_attention'])
  assert calls == [(str(tmp_path), [0, 2], str(tmp_path / 'attention.png'))]
