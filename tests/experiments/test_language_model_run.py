"""A language model trained end to end through the entry point's library, resumed, and sampled.

A tiny causal-conv LM on a synthetic 'tiny_shakespeare' (the real builder, reading
a small input.txt written by the test): the tokenizer is trained on the train split
and kept in the work directory, the eval hook writes samples, and
`experiments.sample` restores the run's parameters without its data pipeline.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from data import tokenizers
from experiments.configs import shakespeare_char_conv
from tests.messages import assert_one_sentence
from tests.subprocess_util import REPO_ROOT
from train import loop

_TEXT = ''.join(f'{name}:\nWhat say you, {other}? I say the {thing} is {quality}.\n\n'
                for name, other, thing, quality in [
                    ('ROMEO', 'Juliet', 'night', 'young'), ('JULIET', 'Romeo', 'moon', 'fair'),
                    ('MERCUTIO', 'Tybalt', 'sword', 'sharp'), ('TYBALT', 'Benvolio', 'day', 'hot')]
                ) * 40


@pytest.fixture
def config(tmp_path):
  source = tmp_path / 'shakespeare'
  source.mkdir()
  (source / 'input.txt').write_text(_TEXT, encoding='utf-8')
  c = shakespeare_char_conv.get_config()
  c.data.data_dir = str(tmp_path / 'data')
  c.data.options = {'source_dir': str(source)}
  c.data.window = 32
  c.model.channels = 16
  c.model.dilations = (1, 2, 4)
  c.model.num_stacks = 1
  c.task.sample_length = 12
  c.task.num_samples = 2
  c.global_batch_size = 8
  c.eval_batch_size = 8
  c.num_train_steps = 40
  c.optimizer.warmup_steps = 5
  c.optimizer.learning_rate = 1e-2
  c.log_every_steps = 10
  c.eval_every_steps = 20
  c.checkpoint_every_steps = 20
  return c


def _records(workdir, split):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


def test_language_model_trains_evaluates_samples_and_resumes(config, tmp_path):
  workdir = str(tmp_path / 'run')
  final = loop.train_and_evaluate(config, workdir)
  # Every validation character is scored once; bits per char = loss / ln 2 for characters.
  assert final['bits_per_char'] == pytest.approx(final['loss'] / math.log(2), rel=1e-6)
  assert final['perplexity'] == pytest.approx(math.exp(final['loss']), rel=1e-6)
  vocab = len(set(_TEXT[:int(len(_TEXT) * 0.9)]))
  assert final['loss'] < math.log(vocab) - 0.5  # learnt something beyond a uniform guess
  evals = _records(workdir, 'eval')
  assert [r['step'] for r in evals if 'loss' in r] == [20, 40]
  samples = sorted(os.listdir(os.path.join(workdir, 'samples')))
  assert samples == ['sample_20.txt', 'sample_40.txt']
  with open(os.path.join(workdir, 'samples', 'sample_40.txt'), encoding='utf-8') as f:
    pieces = f.read().split('\n----\n')
  assert len(pieces) == 2 and all(p.startswith('ROMEO:') and len(p) == 6 + 12 for p in pieces)
  tokenizer_file = os.path.join(workdir, 'tokenizer.json')
  before = os.stat(tokenizer_file).st_mtime_ns

  # Resuming to 60 steps reloads the tokenizer rather than training a new one.
  config.num_train_steps = 60
  loop.train_and_evaluate(config, workdir)
  assert os.stat(tokenizer_file).st_mtime_ns == before
  assert [r['step'] for r in _records(workdir, 'eval') if 'loss' in r] == [20, 40, 60]

  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}
  command = [sys.executable, '-m', 'experiments.sample', f'--workdir={workdir}', '--prompt=JULIET:',
             '--num_tokens=20', '--temperature=0', '--num_samples=2']
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  samples = result.stdout.removesuffix('\n').split('\n----\n')
  # Greedy decoding: both samples are the same continuation of the prompt, by 20 characters.
  assert len(samples) == 2 and samples[0] == samples[1] and samples[0].startswith('JULIET:')
  assert len(samples[0]) == len('JULIET:') + 20
  with open(os.path.join(workdir, 'samples', 'sample_step60_seed0.txt'), encoding='utf-8') as f:
    assert f.read() == result.stdout  # what was printed is what was written
  # Sampling again with the same step and seed keeps the first file and writes a second. At
  # temperature 1, --top_k=1 keeps only the most probable token, and --top_p=1e-6 too: both are
  # greedy, the first 5 characters of the greedy continuation above.
  again = subprocess.run(command[:-3] + ['--num_tokens=5', '--top_k=1'], capture_output=True,
                         text=True, cwd=REPO_ROOT, env=env, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  with open(os.path.join(workdir, 'samples', 'sample_step60_seed0.txt'), encoding='utf-8') as f:
    assert f.read() == result.stdout
  with open(os.path.join(workdir, 'samples', 'sample_step60_seed0_2.txt'), encoding='utf-8') as f:
    assert f.read() == again.stdout == samples[0][:len('JULIET:') + 5] + '\n'
  nucleus = subprocess.run(command[:-3] + ['--num_tokens=5', '--top_p=1e-6'], capture_output=True,
                           text=True, cwd=REPO_ROOT, env=env, timeout=300)
  assert nucleus.returncode == 0, nucleus.stderr[-2000:]
  assert nucleus.stdout == again.stdout

  bad = subprocess.run(command[:-3] + ['--prompt=JULIET@'], capture_output=True, text=True,
                       cwd=REPO_ROOT, env=env, timeout=300)
  assert bad.returncode == 1
  assert bad.stderr.strip().splitlines()[-1].startswith("error: --prompt='JULIET@' cannot be encoded")

  # A samples folder that cannot be written is refused before sampling; nothing is touched.
  samples_folder = os.path.join(workdir, 'samples')
  os.rename(samples_folder, samples_folder + '_kept')
  with open(samples_folder, 'w', encoding='utf-8') as f:
    f.write('kept')
  assert _sample_error(*command[3:]) == (
      f"error: The samples cannot be written to '{samples_folder}': {samples_folder} is a file, "
      'not a folder (or give --output).')
  with open(samples_folder, encoding='utf-8') as f:
    assert f.read() == 'kept'
  os.remove(samples_folder)
  os.rename(samples_folder + '_kept', samples_folder)

  # A tokenizer.json of another vocabulary is one sentence, not a shape error while the sampler
  # is traced (the run's own file is put back afterwards).
  os.rename(tokenizer_file, tokenizer_file + '.kept')
  tokenizers.CharTokenizer.from_corpus(_TEXT + '#$%').save(tokenizer_file)
  wrong = tokenizers.load(tokenizer_file).vocab_size
  message = _sample_error(*command[3:])
  os.replace(tokenizer_file + '.kept', tokenizer_file)
  assert message.startswith(
      f"error: The checkpoint of '{workdir}' does not fit its model with the {wrong} tokens of "
      f"'{tokenizer_file}': params/"), message
  assert f'{vocab}' in message.split(' in the checkpoint but ')[0], message
  assert f'{wrong}' in message.split(' in the checkpoint but ')[1], message


def test_evaluate_reproduces_the_run_and_applies_config_changes(config, tmp_path):
  from experiments import evaluate  # pylint: disable=g-import-not-at-top
  config.num_train_steps = 10
  config.eval_every_steps = config.checkpoint_every_steps = 10
  config.task.sample_length = 0
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  final = _records(workdir, 'eval')[-1]
  again = evaluate.evaluate(workdir)
  assert again['step'] == 10 and again['window'] == 32 and 'overrides' not in again
  # The same checkpoint over the same windows: the run's own final evaluation.
  assert again['metrics']['loss'] == pytest.approx(final['loss'], rel=1e-5)
  # Metrics are weighted sums over the whole split, so the batch size changes nothing, while
  # other windows change the characters scored.
  rebatched = evaluate.evaluate(workdir, overrides=['eval_batch_size=3'])
  assert rebatched['overrides'] == {'eval_batch_size': 3}
  assert rebatched['metrics']['loss'] == pytest.approx(final['loss'], rel=1e-5)
  shorter = evaluate.evaluate(workdir, overrides=['data.window=16'])
  assert shorter['window'] == 16 and shorter['metrics']['loss'] != pytest.approx(final['loss'])
  # --window=16 is the same change as --set=data.window=16.
  windowed = evaluate.evaluate(workdir, window=16)
  assert windowed['window'] == 16 and 'overrides' not in windowed
  assert windowed['metrics'] == pytest.approx(shorter['metrics'], rel=1e-6)
  for overrides, part in ((['data.windw=16'], "data has no key 'windw'"),
                          (['window'], "'window' must have the form"),
                          (['eval_batch_size=[3]'], 'wrong type')):
    with pytest.raises(ValueError, match=part):
      evaluate.evaluate(workdir, overrides=overrides)
  # A model of other parameter shapes than the checkpoint's: one sentence, nothing appended.
  with pytest.raises(ValueError) as info:
    evaluate.evaluate(workdir, overrides=['model.channels=8'])
  assert_one_sentence(str(info.value), f"The checkpoint of '{workdir}' does not fit the model "
                      "under --set=model.channels=8: params/CausalConv1D_0/Conv_0/bias is float32 "
                      '(32,) in the checkpoint but float32 (16,) in the model.')  # filter and gate: 2 × 16


def _sample_error(*flags) -> str:
  result = subprocess.run([sys.executable, '-m', 'experiments.sample', *flags], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=300,
                          env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 1, result.stderr[-2000:]
  return result.stderr.strip().splitlines()[-1]


def test_sampling_refuses_a_masked_language_model_and_a_folder_as_output(tmp_path):
  from experiments.configs import shakespeare_bpe_bert  # pylint: disable=g-import-not-at-top
  (tmp_path / 'config.json').write_text(shakespeare_bpe_bert.get_config().to_json())
  (tmp_path / 'tokenizer.json').write_text('{}')  # never read: the task is refused first
  assert _sample_error(f'--workdir={tmp_path}') == (
      f"error: The run in '{tmp_path}' trains task 'masked_language_model', not "
      "'language_model'; only a causal language model continues a prompt.")
  assert _sample_error(f'--workdir={tmp_path}', f'--output={tmp_path}') == (
      f'error: --output={tmp_path} is a folder; give the file to write in it.')


def test_sampling_refuses_a_work_directory_that_is_a_file(tmp_path):
  not_a_run = tmp_path / 'notes.txt'
  not_a_run.write_text('not a run')
  assert _sample_error(f'--workdir={not_a_run}') == (
      f"error: '{not_a_run}' is a file, not the work directory of a run.")
  assert not_a_run.read_text() == 'not a run'


def test_sampling_refuses_a_run_of_token_records_for_what_it_is(tmp_path):
  # It used to say the run was "not a language model run", of a language_model run.
  from experiments.configs import recall_gpt  # pylint: disable=g-import-not-at-top
  (tmp_path / 'config.json').write_text(recall_gpt.get_config().to_json())
  assert _sample_error(f'--workdir={tmp_path}') == (
      f"error: The run in '{tmp_path}' reads the token records of data set 'associative_recall' "
      "(data.tokenizer='dataset'), which have no text tokenizer to encode a prompt; only a run "
      "with data.tokenizer 'char' or 'byte_bpe' continues text.")


@pytest.mark.parametrize('seed', [-1, 2**32, 2**64])
def test_sampling_refuses_a_seed_outside_32_bits(seed, tmp_path):
  # Seed 2**32 drew what seed 0 draws (a key keeps the low 32 bits), -1 what 2**32 - 1 draws,
  # and 2**64 was an OverflowError traceback.
  import jax  # pylint: disable=g-import-not-at-top
  assert (jax.random.PRNGKey(2**32) == jax.random.PRNGKey(0)).all()
  (tmp_path / 'config.json').write_text(shakespeare_char_conv.get_config().to_json())
  tokenizers.CharTokenizer(list('\n :ABMOR')).save(str(tmp_path / 'tokenizer.json'))
  # The script in its own process: its flags would clash with other scripts' in this one.
  assert _sample_error(f'--workdir={tmp_path}', '--prompt=ROMEO:', '--num_tokens=4',
                       f'--seed={seed}') == (
      f'error: --seed must lie in [0, 2**32), the seeds of distinct samples, got {seed}.')


@pytest.mark.parametrize('flag, message', [
    ('--temperature=-1', '--temperature must be a finite number >= 0 (0 is greedy), got -1.0.'),
    ('--temperature=nan', '--temperature must be a finite number >= 0 (0 is greedy), got nan.'),
    ('--top_k=-2', '--top_k must be >= 0 (0 keeps every token), got -2.'),
    ('--top_p=0', '--top_p must lie in (0, 1] (1 keeps every token), got 0.0.'),
])
def test_sampling_flags_are_checked_before_the_run_is_read(flag, message, tmp_path):
  # They were checked only once the checkpoint had been restored, and named without `--`. The
  # work directory here holds nothing: the flag is what is refused.
  assert _sample_error(f'--workdir={tmp_path}', flag) == f'error: {message}'
