"""The benchmark scripts refuse counts that would leave nothing to time, and every other bad
flag, in one sentence before any work."""

import os
import subprocess
import sys

import pytest

from tests.messages import assert_one_sentence
from tests.subprocess_util import REPO_ROOT

_GPT = 'experiments/configs/shakespeare_char_gpt.py'
_DIGITS = 'experiments/configs/digits_mlp.py'


@pytest.mark.parametrize('script, args', [
    ('train_step.py', [f'--config={_DIGITS}', '--steps=0']),
    ('train_step.py', [f'--config={_DIGITS}', '--pipeline_batches=0']),
    ('profile_step.py', [f'--config={_DIGITS}', '--steps=0']),
    ('profile_step.py', [f'--config={_DIGITS}', '--top=0']),
    ('free_parts.py', [f'--config={_GPT}', '--steps=0']),
    ('free_parts.py', [f'--config={_GPT}', '--rounds=0']),
    ('generation.py', [f'--config={_GPT}', '--repeats=0']),
    ('attention_scaling.py', ['--repeats=0']),
    ('attention_scaling.py', ['--width=0']),
])
def test_a_count_of_zero_is_refused_by_name(script, args):
  # Without the bound each ran: a division by the zero count after the timing (train_step,
  # profile_step), NaN rates (generation, attention_scaling), a crash in the model or a table
  # of no rows after the trace (profile_step's --top).
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, os.path.join('benchmarks', script), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  name = args[-1].split('=')[0]
  # absl's 'flag --steps=0: …', or 'error: --steps=0: …' from the entry point's parser.
  assert f'{name}=0: 0 is not a positive integer' in result.stderr
  assert 'matmul peak' not in result.stdout  # refused before anything was measured


def _refused(script, args, env=None, **kwargs):
  """The one line a benchmark script run with `args` (and `env` added to the environment) ends
  with on stderr (absl's 'FATAL Flags parsing error:' prefix removed), and its stdout, after
  checking that it failed without a traceback."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', **(env or {})}
  result = subprocess.run([sys.executable, os.path.join('benchmarks', script), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
                          **kwargs)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  lines = [line.removeprefix('FATAL Flags parsing error: ') for line in result.stderr.splitlines()
           if line.strip() and not line.startswith('Pass --helpshort')]
  return lines[-1], result.stdout


def test_a_trace_dir_that_cannot_hold_the_trace_is_refused_before_the_step(tmp_path):
  # The profiler failed with a traceback after the step was compiled, warmed up and traced.
  (tmp_path / 'a_file').write_text('kept')
  line, stdout = _refused('profile_step.py', [f'--config={_DIGITS}',
                                              f'--trace_dir={tmp_path / "a_file" / "trace"}'])
  assert line == (f'error: --trace_dir={tmp_path / "a_file" / "trace"} cannot hold the trace: '
                  f'{tmp_path / "a_file"} is a file, not a folder.'), line
  assert 'op kind' not in stdout and (tmp_path / 'a_file').read_text() == 'kept'


@pytest.mark.parametrize('script', ['train_step.py', 'profile_step.py', 'generation.py',
                                    'free_parts.py'])
def test_a_missing_config_file_is_one_sentence_when_the_flags_are_parsed(script):
  # config_flags' own parser raised an IOError traceback at the config's first use (in
  # train_step, after the matmul peak had been timed).
  line, stdout = _refused(script, ['--config=experiments/configs/no_such_config.py'])
  assert_one_sentence(line, "The config file 'experiments/configs/no_such_config.py' does not "
                      'exist', _DIGITS)
  assert stdout == ''  # not even XLA_FLAGS: refused while parsing


@pytest.mark.parametrize('script', ['train_step.py', 'profile_step.py', 'generation.py',
                                    'free_parts.py'])
def test_a_config_key_the_config_lacks_is_one_sentence_naming_the_models_options(script):
  # It was a traceback from config_flags.
  line, stdout = _refused(script, [f'--config={_GPT}', '--config.model.widht=3'])
  assert line == ("error: --config.model.widht: config.model has no key 'widht'; the gpt model "
                  'takes: ' + line.split('the gpt model takes: ')[1])
  assert 'attention' in line and stdout == ''


def test_a_model_option_the_config_leaves_out_is_accepted_and_a_missing_config_refused():
  # As `experiments.main` does, the override adds gpt's attention to the config: the run then
  # stops at the next check, the zero step count.
  line, _ = _refused('train_step.py', [f'--config={_GPT}', '--config.model.attention=linear',
                                       '--steps=0'])
  assert line == 'error: --steps=0: 0 is not a positive integer.'
  line, _ = _refused('train_step.py', [])
  assert line.startswith('error: --config is missing; give the experiment config file')


@pytest.mark.parametrize('script', ['train_step.py', 'profile_step.py', 'generation.py',
                                    'free_parts.py'])
def test_a_config_the_run_setup_refuses_is_its_one_sentence_before_anything_is_measured(
    script, tmp_path):
  # Each was a traceback of loop.setup's ValueError or FileNotFoundError (in train_step after
  # the matmul peak had been timed).
  line, stdout = _refused(script, [f'--config={_GPT}', '--config.global_batch_size=0'])
  assert line == 'error: config.global_batch_size must be a positive integer, got 0.'
  assert 'matmul peak' not in stdout
  (tmp_path / 'empty').mkdir()
  line, stdout = _refused(script, [f'--config={_GPT}', f'--config.data.data_dir={tmp_path}/data'],
                          env={'TINY_SHAKESPEARE_DIR': str(tmp_path / 'empty')})
  assert_one_sentence(line, "error: Data set 'tiny_shakespeare': the folder "
                      f'{tmp_path}/empty given by $TINY_SHAKESPEARE_DIR lacks input.txt')
  assert 'matmul peak' not in stdout


@pytest.mark.parametrize('config, args, message', [
    (_GPT, ['--parts=attention+softmax'], "--parts has 'softmax' in 'attention+softmax', which is "
                                          'not a part; allowed: attention, gelu, layernorm'),
    (_GPT, ['--parts=gelu+gelu'], "--parts variant 'gelu+gelu' names a part twice."),
    (_DIGITS, [], "--config trains model 'mlp'; free_parts replaces parts of the Transformers"),
    (_GPT, ['--parts=gelu,attention+gelu,gelu+attention'],
     '--parts=gelu,attention+gelu,gelu+attention names one variant twice.'),
    (_GPT, ['--config.model.attention=linear'], "--parts frees attention, which replaces the "
                                                "exact attention only, and the config's is "
                                                "'linear'"),
    ('experiments/configs/dates_transformer.py', ['--parts=gelu,attention+gelu'],
     "--parts frees attention, which transformer_seq2seq's cross-attention cannot lose"),
    (_GPT, ['--dtypes=bfloat16', '--products_by_kind'],
     'free_parts does not use --dtypes, --products_by_kind of benchmarks/train_step.py'),
    (_GPT, ['--noproducts_alone'], 'free_parts does not use --products_alone of '),
])
def test_free_parts_refuses_unknown_parts_and_models_before_timing_anything(
    config, args, message):
  # A model that is no Transformer, or a Transformer whose attention is not the exact kind,
  # would have been timed as it is against copies that freed nothing; the encoder-decoder's
  # cross-attention failed in the model after the step as it is had been timed; train_step's
  # --dtypes and --sweep were accepted and ignored (the config's dtype was timed).
  line, stdout = _refused('free_parts.py', [f'--config={config}', *args])
  assert_one_sentence(line, message)
  assert 'matmul peak' not in stdout


_SHORT = ['--steps=1', '--pipeline_batches=1', '--noproducts_alone']


@pytest.mark.parametrize('args, message', [
    (['--dtypes=float32,bf16'], "--dtypes has 'bf16', which is not a compute dtype; allowed: "
                                'float32, bfloat16.'),
    (['--dtypes='], '--dtypes= names no dtype; give one or more of: float32, bfloat16.'),
    (['--sweep=model.depth:1,2'], "--sweep field 'model.depth' is not in the config"),
    (['--sweep=model.dtype:float32,half'], "--sweep has 'half', which is not a compute dtype"),
    (['--sweep=model.dtype'], '--sweep=model.dtype must read FIELD:V1,V2,...'),
    (['--sweep=model.dtype:float32', '--dtypes=bfloat16'],
     '--sweep and --dtypes cannot be given together'),
    (['--sweep=model.features:1,2'], "--sweep field 'model.features' holds (256, 256, 10), not "
                                     'one bool, int, float or str, so --sweep cannot set it.'),
    (['--sweep=model:1,2'], "--sweep field 'model' is a group of fields, not one value; sweep "
                            'one of its fields: activation, dropout_rate, dtype, features, name.'),
    (['--sweep=data.window:64,6x'], "--sweep values '64,6x' are not all ints, the type of "
                                    'data.window.'),
    (['--sweep=global_batch_size:64,0'], 'config.global_batch_size must be a positive integer, '
                                         'got 0.'),
    (['--sweep=parallel.mode:jit,jot'], "Unknown parallel.mode 'jot'; allowed: jit,"),
])
def test_train_step_refuses_bad_dtypes_and_sweeps_before_timing_anything(args, message):
  # A bad dtype failed in the model after the matmul peak and every earlier dtype were timed;
  # a bad sweep field, a tuple or group of fields, a value loop.setup refuses and a value of a
  # placeholder field (read as a str) after the peak.
  line, stdout = _refused('train_step.py', [f'--config={_DIGITS}', *_SHORT, *args])
  assert_one_sentence(line, message)
  assert 'matmul peak' not in stdout


@pytest.mark.parametrize('lengths', ['', '1,64', 'a'])
def test_generation_refuses_lengths_that_generate_nothing(lengths):
  # An empty list raised from min([]).
  line, _ = _refused('generation.py', [f'--config={_GPT}', f'--lengths={lengths}'])
  assert_one_sentence(line, f'--lengths={lengths} must be integers of at least 2')


def test_generation_refuses_a_model_without_a_cache_before_building_the_run(tmp_path):
  # It was refused after loop.setup had prepared the data and traced the steps, and the
  # parameters were initialised.
  data = tmp_path / 'data'
  line, _ = _refused('generation.py', [f'--config={_DIGITS}', f'--config.data.data_dir={data}'])
  assert_one_sentence(line, "Model 'mlp' of --config has no decoding cache to compare with")
  assert not data.exists()


_ONE_KIND = ['--repeats=1', '--min_batch_seconds=0']


@pytest.mark.parametrize('args, message', [
    (['--lengths='], '--lengths= must be positive integers.'),
    (['--lengths=0,64'], '--lengths=0,64 must be positive integers.'),
    (['--lengths=-8'], '--lengths=-8 must be positive integers.'),
    (['--kinds='], '--kinds= names no attention kind; give one or more of: exact, '),
    (['--kinds=exact,flash', '--lengths=16'], "--kinds has 'flash'; allowed: exact, "),
    (['--kinds=linformer', '--causal'], '--kinds=linformer with --causal leaves nothing to measure'),
    (['--kinds=exact', '--lengths=16', '--figure=FOLDER'], 'is a folder'),
    (['--kinds=exact', '--lengths=16', '--figure=scaling.pngg'], 'must end in a figure format'),
    (['--max_gb=0'], 'flag --max_gb=0.0: the compiled memory a setting may take must be a '
                     'positive number of GB.'),
    (['--kinds=exact,local', '--lengths=16,32', '--max_gb=0.000001'],
     'Every setting takes more compiled memory than --max_gb=1e-06 (the least '),
])
def test_attention_scaling_refuses_settings_that_measure_nothing_or_cannot_be_drawn(
    args, message, tmp_path):
  # Empty or non-positive lengths failed deep in JAX, no kinds printed an empty table, a
  # figure that cannot be written failed in savefig after the whole benchmark, and a --max_gb
  # that every setting exceeds (0 among them) printed a table of — and nan.
  args = [a.replace('FOLDER', str(tmp_path)).replace('=scaling', f'={tmp_path}/scaling')
          for a in args]
  line, stdout = _refused('attention_scaling.py', [*_ONE_KIND, *args])
  assert_one_sentence(line, message)
  assert 'forward + backward' not in stdout  # refused before the table's header


@pytest.mark.parametrize('corpus, extra, message', [
    ('missing.txt', [], 'missing.txt is not a file'),
    ('binary.txt', [], 'binary.txt is not UTF-8 text (byte 0xff at offset 3'),
    ('empty.txt', [], 'empty.txt is empty'),
    ('text.txt', ['--vocab_size=255'], 'flag --vocab_size=255: the vocabulary must hold at least '
                                       'the 256 bytes'),
    ('text.txt', ['--save_to=FOLDER'], 'is a folder'),
])
def test_tokenizer_refuses_a_corpus_it_cannot_read_and_a_vocabulary_below_the_bytes(
    tmp_path, corpus, extra, message):
  # Each was a traceback (the vocabulary bound was documented but not checked, and a folder
  # to save to failed after the training and timing).
  (tmp_path / 'binary.txt').write_bytes(b'abc\xff\xfe')
  (tmp_path / 'empty.txt').write_text('')
  (tmp_path / 'text.txt').write_text('to be or not to be\n' * 20)
  extra = [a.replace('FOLDER', str(tmp_path)) for a in extra]
  line, stdout = _refused('tokenizer.py', [f'--corpus={tmp_path / corpus}', *extra])
  assert_one_sentence(line, message)
  assert 'train:' not in stdout
