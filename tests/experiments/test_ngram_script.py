"""experiments/ngram.py turns its flags into the models it fits, refusing bad ones by name, and
appends each run's table and samples under a heading naming its settings."""

import os
import subprocess
import sys

from absl import app
import numpy as np
import pytest

from data import text
from data import tokenizers
from experiments import ngram
from models import ngram as ngram_models
from tests.messages import assert_one_sentence
from tests.messages import one_sentence
from tests.subprocess_util import REPO_ROOT


def test_every_order_gets_every_smoothing():
  specs = ngram.model_specs(['1', '3'], ['kneser_ney', 'add_k'], ['1', '0.01'], 'estimate')
  assert [(order, label) for order, label, _ in specs] == [
      (1, 'Kneser–Ney, D estimated'), (1, 'add-k, k = 1'), (1, 'add-k, k = 0.01'),
      (3, 'Kneser–Ney, D estimated'), (3, 'add-k, k = 1'), (3, 'add-k, k = 0.01')]
  assert specs[0][2] == {'smoothing': 'kneser_ney', 'discount': None}
  assert specs[2][2] == {'smoothing': 'add_k', 'add_k': 0.01}


def test_the_heading_names_the_constants_only_of_the_smoothings_run():
  settings = dict(window=8, orders=['2'], add_ks=['1'], kn_discount='0.75', prompt='A',
                  sample_length=3, seed=0)
  assert ngram.settings_heading(smoothings=['kneser_ney'], **settings) == (
      "## `--window=8 --orders=2 --smoothing=kneser_ney --kn_discount=0.75 --prompt='A' "
      '--sample_length=3 --seed=0`')


@pytest.mark.parametrize('add_k, discount', [('0', '0'), ('0', '1')])
def test_the_ends_of_the_smoothing_ranges_are_accepted(add_k, discount):
  # k = 0 counts without smoothing, and D in [0, 1] includes both ends.
  specs = ngram.model_specs(['2'], ['kneser_ney', 'add_k'], [add_k], discount)
  assert [options for _, _, options in specs] == [
      {'smoothing': 'kneser_ney', 'discount': float(discount)},
      {'smoothing': 'add_k', 'add_k': 0.0}]


@pytest.mark.parametrize('orders, smoothing, add_k, discount, parts', [
    (['0', '2'], ['add_k'], ['1'], '0.75', ['--orders=0,2 must be positive integers.']),
    (['two'], ['add_k'], ['1'], '0.75', ['--orders=two must be positive integers.']),
    ([], ['add_k'], ['1'], '0.75', ['--orders= must be positive integers.']),
    (['2'], ['witten_bell'], ['1'], '0.75', ["'witten_bell'", 'kneser_ney']),
    (['2'], [], ['1'], '0.75', ['--smoothing= names no smoothing', 'kneser_ney, add_k']),
    (['2'], ['add_k'], [], '0.75', ['--add_k= must be finite numbers of at least 0']),
    (['2'], ['add_k'], ['1', 'nan'], '0.75', ['--add_k=1,nan must be finite numbers']),
    (['2'], ['add_k'], ['-0.5'], '0.75', ['--add_k=-0.5 must be finite numbers']),
    (['2'], ['add_k'], ['inf'], '0.75', ['--add_k=inf must be finite numbers']),
    (['2'], ['add_k'], ['k'], '0.75', ['--add_k=k must be finite numbers']),
    (['2'], ['kneser_ney'], ['1'], '1.5', ["--kn_discount=1.5 must be a number in [0, 1]",
                                          "or 'estimate'"]),
    (['2'], ['kneser_ney'], ['1'], 'nan', ['--kn_discount=nan must be a number in [0, 1]']),
    (['2'], ['kneser_ney'], ['1'], '-0.1', ['--kn_discount=-0.1 must be a number in [0, 1]']),
])
def test_bad_flags_are_refused_before_the_data_is_read(orders, smoothing, add_k, discount, parts):
  # No orders or smoothings wrote a results.md of a header and no rows over an earlier one;
  # the bad constants were refused by the model after the data was read and earlier models
  # fitted, and a NaN k not at all.
  one_sentence(lambda: ngram.model_specs(orders, smoothing, add_k, discount), *parts,
               error=app.UsageError)


def test_orders_too_high_for_the_vocabulary_and_prompts_it_cannot_encode_are_one_sentence():
  # 65 characters: 65^10 < 2^62 <= 65^11. Both were tracebacks, the order's after the
  # lower orders had been fitted.
  ngram.check_orders([1, 10], 65)
  one_sentence(lambda: ngram.check_orders([2, 11, 12], 65),
               '--orders has 11, too high for the 65 tokens', 'at most 10.', error=app.UsageError)
  tokenizer = tokenizers.CharTokenizer.from_corpus('ROMEO: ')
  assert ngram.encode_prompt(tokenizer, 'ROMEO:').tolist() == tokenizer.encode('ROMEO:')
  one_sentence(lambda: ngram.encode_prompt(tokenizer, 'ROMEO!'),
               "--prompt='ROMEO!' cannot be encoded: character '!' at position 5 is not in the "
               'vocabulary of 6 characters.', error=app.UsageError)


@pytest.mark.parametrize('flag, message', [
    ('--orders=', '--orders= must be positive integers.'),
    ('--smoothing=', '--smoothing= names no smoothing'),
    ('--add_k=nan', '--add_k=nan must be finite numbers of at least 0'),
    ('--kn_discount=2', '--kn_discount=2 must be a number in [0, 1]'),
])
def test_a_refused_run_keeps_the_earlier_results(tmp_path, flag, message):
  for name in ('results.md', 'samples.txt'):
    (tmp_path / name).write_text(f'an earlier {name}\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.ngram', f'--workdir={tmp_path}',
       f'--data_dir={tmp_path / "data"}', flag],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert_one_sentence(result.stderr.strip().splitlines()[-1], message)
  for name in ('results.md', 'samples.txt'):
    assert (tmp_path / name).read_text() == f'an earlier {name}\n'
  assert not (tmp_path / 'data').exists()  # refused before the data was read


def _two_speakers(tmp_path):
  """A folder holding an input.txt of 29 characters (29^12 < 2^62 <= 29^13)."""
  source = tmp_path / 'source'
  source.mkdir()
  (source / 'input.txt').write_text(''.join(
      f'{a}:\nWhat say you, {b}? I say the night is young.\n\n'
      for a, b in [('ROMEO', 'Juliet'), ('JULIET', 'Romeo')]) * 40, encoding='utf-8')
  return source


@pytest.mark.parametrize('flag, message', [
    ('--prompt=ROMEO@', "--prompt='ROMEO@' cannot be encoded: character '@' at position 5"),
    ('--orders=2,13', '--orders has 13, too high for the 29 tokens of the vocabulary'),
])
def test_what_the_vocabulary_refuses_stops_before_any_model_is_fitted(tmp_path, flag, message):
  # 29 characters (29^12 < 2^62 <= 29^13): read from a tiny corpus, the only flags the data
  # must be read for. The order was refused by the model after order 2 was fitted, and both
  # were tracebacks.
  source = _two_speakers(tmp_path)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'results.md').write_text('an earlier table\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.ngram', f'--workdir={workdir}',
       f'--tiny_shakespeare_dir={source}', f'--data_dir={tmp_path / "data"}', flag],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert_one_sentence(result.stderr.strip().splitlines()[-1], message)
  assert '| n |' not in result.stdout  # no model fitted
  assert (workdir / 'results.md').read_text() == 'an earlier table\n'


def test_a_rerun_with_other_settings_appends_its_table_and_samples_under_its_own_heading(
    tmp_path):
  # Each run wrote results.md and samples.txt over the earlier run's.
  source = _two_speakers(tmp_path)
  # A tail unlike the rest, so that the validation and test splits hold different text.
  with open(source / 'input.txt', 'a', encoding='utf-8') as f:
    f.write('young. ' * 32)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  earlier_table = '| n | smoothing |\n|---|---|\n| 1 | earlier |'  # its last line left unended
  (workdir / 'results.md').write_text(earlier_table, encoding='utf-8')
  (workdir / 'samples.txt').write_text('an earlier sample\n', encoding='utf-8')

  def run(*flags):
    """(the data line and the table printed, results.md, samples.txt) after the run."""
    result = subprocess.run(
        [sys.executable, '-m', 'experiments.ngram', f'--workdir={workdir}',
         f'--tiny_shakespeare_dir={source}', f'--data_dir={tmp_path / "data"}', *flags],
        cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    table = ''.join(f'{line}\n' for line in lines if line.startswith('|'))
    return (lines[0], table, (workdir / 'results.md').read_text(encoding='utf-8'),
            (workdir / 'samples.txt').read_text(encoding='utf-8'))

  about, table, results, samples = run('--orders=1,2', '--add_k=1', '--sample_length=20')
  heading = ("## `--window=256 --orders=1,2 --smoothing=kneser_ney,add_k --add_k=1 "
             "--kn_discount=0.75 --prompt='ROMEO:' --sample_length=20 --seed=0`")
  assert about.startswith('Tiny Shakespeare: ') and table.count('\n') == 2 + 4
  assert results == f'{earlier_table}\n\n{heading}\n\n{about}.\n\n{table}'
  assert samples.startswith(f'an earlier sample\n\n{heading}\n\n### n = 1, Kneser–Ney, '
                            'D = 0.75\n\nROMEO:')
  # The unigram add-1 row worked out from input.txt: fitted on the first 90 % of the characters
  # (train), scored on the next 5 % (validation) with every character but the first a target,
  # p(c) = (count(c) + 1) / (N + V); perplexity e^(nats/target), bits/char nats/target/ln 2.
  corpus = (source / 'input.txt').read_text(encoding='utf-8')
  train = corpus[:int(0.9 * len(corpus))]
  rest = corpus[len(train):]
  validation = rest[:int(0.5 * len(rest))]
  vocab = sorted(set(train))
  p = {c: (train.count(c) + 1) / (len(train) + len(vocab)) for c in vocab}
  nats_per_char = -np.mean([np.log(p[c]) for c in validation[1:]])
  row = next(line for line in table.splitlines() if line.startswith('| 1 | add-k, k = 1 |'))
  perplexity, bits = (float(v) for v in row.split('|')[3:5])
  assert perplexity == pytest.approx(np.exp(nats_per_char), abs=1e-3)
  assert bits == pytest.approx(nats_per_char / np.log(2), abs=1e-4)
  # A window of T holds T targets: ⌈(M − 1) / T⌉ windows of the M validation characters.
  windows = lambda size: f'{-(-(len(validation) - 1) // size)} evaluation windows of {size}'
  assert about == (f'Tiny Shakespeare: {len(train):,} train / {len(validation):,} validation '
                   f'characters, V = {len(vocab)}, {windows(256)}')

  about_2, table_2, results_2, samples_2 = run('--orders=1', '--smoothing=add_k',
                                               '--add_k=0.5', '--seed=3', '--sample_length=10',
                                               '--window=64')
  heading_2 = ("## `--window=64 --orders=1 --smoothing=add_k --add_k=0.5 --prompt='ROMEO:' "
               "--sample_length=10 --seed=3`")
  assert about_2 == about.replace(windows(256), windows(64))
  assert table_2.count('\n') == 2 + 1 and '| 1 | add-k, k = 0.5 | ' in table_2
  assert results_2 == f'{results}\n{heading_2}\n\n{about_2}.\n\n{table_2}'
  # Every sample under its model's heading, each run's under the run's; the second run's
  # one sample is the prompt and 10 characters.
  assert samples_2.startswith(samples)
  assert [line for line in samples_2.splitlines() if line.startswith('#')] == [
      heading, '### n = 1, Kneser–Ney, D = 0.75', '### n = 1, add-k, k = 1',
      '### n = 2, Kneser–Ney, D = 0.75', '### n = 2, add-k, k = 1',
      heading_2, '### n = 1, add-k, k = 0.5']
  last = samples_2.split('### n = 1, add-k, k = 0.5\n\n')[-1]
  assert last.startswith('ROMEO:') and len(last) == len('ROMEO:') + 10 + 1 and last[-1] == '\n'
  # The unigram add-0.5 sample with --seed=3: 10 draws of rng.choice(V, p) from that seed.
  rng = np.random.default_rng(3)
  counts = np.array([train.count(c) for c in vocab])
  p_half = (counts + 0.5) / (len(train) + 0.5 * len(vocab))
  assert last[len('ROMEO:'):-1] == ''.join(vocab[rng.choice(len(vocab), p=p_half)]
                                           for _ in range(10))


def test_a_workdir_that_is_a_file_is_refused_before_the_data_is_read(tmp_path):
  # It was a FileExistsError traceback once every model was fitted, losing the table.
  source = tmp_path / 'source'
  source.mkdir()
  (source / 'input.txt').write_text('ROMEO:\nThe night is young.\n\n' * 40, encoding='utf-8')
  workdir = tmp_path / 'results'
  workdir.write_text('an earlier file\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.ngram', f'--workdir={workdir}', '--orders=1',
       f'--tiny_shakespeare_dir={source}', f'--data_dir={tmp_path / "data"}'],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1 and result.stdout == '', result.stderr[-2000:]
  assert result.stderr == (f"error: The work directory '{workdir}' is not writable "
                           f"('{workdir}' is a file).\n")
  assert not (tmp_path / 'data').exists()


@pytest.mark.parametrize('folder, other, role', [
    ('results.md', 'samples.txt', 'the table is appended to'),
    ('samples.txt', 'results.md', 'the samples are appended to'),
])
def test_a_results_file_that_is_a_folder_is_refused_before_the_data_is_read(tmp_path, folder,
                                                                            other, role):
  # It was an IsADirectoryError traceback once every model was fitted.
  workdir = tmp_path / 'run'
  (workdir / folder).mkdir(parents=True)
  (workdir / other).write_text(f'an earlier {other}\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.ngram', f'--workdir={workdir}', '--orders=1',
       f'--data_dir={tmp_path / "data"}'],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1 and result.stdout == '', result.stderr[-2000:]
  assert result.stderr == f"error: '{workdir / folder}', the file {role}, is a folder.\n"
  assert (workdir / other).read_text() == f'an earlier {other}\n'
  assert not (tmp_path / 'data').exists()


def test_a_folder_without_input_txt_is_one_error_line(tmp_path):
  # It was a FileNotFoundError traceback.
  missing = tmp_path / 'no_such_folder'
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'results.md').write_text('an earlier table\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.ngram', f'--workdir={workdir}', '--orders=1',
       f'--tiny_shakespeare_dir={missing}', f'--data_dir={tmp_path / "data"}'],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: Data set 'tiny_shakespeare': the folder {missing} given by source_dir lacks "
      'input.txt; pass source_dir= to data.load or set $TINY_SHAKESPEARE_DIR to a folder holding '
      'input.txt.')
  assert (workdir / 'results.md').read_text() == 'an earlier table\n'


@pytest.mark.parametrize('train_tokens, add_k', [
    ([0, 1, 1, 2, 2, 2, 0, 1, 2, 2], 1.0),
    # Add-0 without id 0 in the train stream: the padding targets (id 0) have probability 0.
    ([1, 1, 2, 2, 2, 1, 2, 2], 0.0),
])
def test_evaluate_scores_every_target_of_the_text_once(train_tokens, add_k):
  # A unigram add-k model predicts (c(w) + k) / (N + k V) whatever the context, so the summed NLL
  # is a sum over the 7 targets x_1 … x_7 of the eval text, worked out without the windows.
  vocab_size, units_per_token = 3, np.array([1.0, 2.0, 4.0], np.float32)
  counts = np.bincount(train_tokens, minlength=vocab_size)
  p = (counts + add_k) / (len(train_tokens) + add_k * vocab_size)
  eval_tokens = np.array([2, 1, 1, 2, 2, 1, 2, 1])  # inputs and targets spell unequal units
  windows = text.TokenWindows(eval_tokens, 3, training=False)  # 3 windows, the last padded
  model = ngram_models.NGramModel(np.array(train_tokens), vocab_size=vocab_size, order=1,
                                  smoothing='add_k', add_k=add_k)
  summary = ngram.evaluate(model, windows.gather(np.arange(len(windows))), units_per_token, 'byte')
  targets = eval_tokens[1:]
  nats = -np.log(p[targets]).sum()
  units = units_per_token[targets].sum()
  np.testing.assert_allclose(summary['loss'], nats / 7, rtol=1e-6)
  np.testing.assert_allclose(summary['perplexity'], np.exp(nats / 7), rtol=1e-6)
  np.testing.assert_allclose(summary['bits_per_byte'], nats / units / np.log(2), rtol=1e-6)
