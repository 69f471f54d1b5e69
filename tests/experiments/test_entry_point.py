"""`python -m experiments.main` itself: wrong command lines stop with exit status 1 and
one `error:` line (no traceback), `--help` exits 0 and lists what a run can name, and
under a (faked) SLURM job step two processes join one run with no flag at all."""

import ast
import glob
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.subprocess_util import REPO_ROOT
from train import xla_cpu

_DIGITS = 'experiments/configs/digits_mlp.py'


def _main(*args, env=None, timeout=120):
  return subprocess.run([sys.executable, '-m', 'experiments.main', *args], capture_output=True,
                        text=True, cwd=REPO_ROOT, timeout=timeout,
                        env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu',
                             **(env or {})})


def _error(*args) -> str:
  """The one line a wrong command line prints, checked to be all of stderr."""
  result = _main(*args)
  assert result.returncode == 1, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr[-2000:]
  assert lines[0].endswith(('.', '?)')) and result.stdout == ''
  return lines[0]


def test_missing_config_file(tmp_path):
  line = _error('--config=experiments/configs/nope.py', f'--workdir={tmp_path}')
  assert line.startswith("error: The config file 'experiments/configs/nope.py' does not exist; "
                         'the experiment configs are: ')
  assert f'{_DIGITS}, ' in line and 'default.py' not in line


def test_config_file_with_a_syntax_error(tmp_path):
  config = tmp_path / 'broken.py'
  config.write_text('def get_config():\n  return {\n')
  assert _error(f'--config={config}', f'--workdir={tmp_path}') == (
      f"error: The config file '{config}' has a syntax error at line 2: '{{' was never closed.")


def test_config_whose_get_config_raises(tmp_path):
  config = tmp_path / 'raises.py'
  config.write_text('def get_config():\n  raise KeyError("no such preset")\n')
  assert _error(f'--config={config}', f'--workdir={tmp_path}') == (
      f"error: get_config() of '{config}' failed: KeyError: 'no such preset'.")


def test_unknown_key(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.foo=1') == (
      "error: --config.foo: the config has no key 'foo'; every key and its default is in "
      'experiments/configs/default.py.')


def test_a_key_inside_an_empty_block_says_to_set_the_block_whole(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}',
                '--config.data.options.source_dir=/x') == (
      "error: --config.data.options.source_dir: config.data.options has no key 'source_dir'; it "
      "is empty, so set it whole, e.g. --config.data.options=\"{'source_dir': ...}\".")


def test_unknown_key_names_the_real_ones_nearby(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.batch_size=7') == (
      "error: --config.batch_size: the config has no key 'batch_size' (nearest: "
      'eval_batch_size, global_batch_size); every key and its default is in '
      'experiments/configs/default.py.')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.learning_rate=1') == (
      "error: --config.learning_rate: the config has no key 'learning_rate' (nearest: "
      'optimizer.learning_rate); every key and its default is in experiments/configs/default.py.')


def test_a_task_or_model_option_the_config_leaves_out_can_be_set(tmp_path):
  # digits_mlp.py lists neither batch_norm nor layer_norm; both reach the MLP, whose own
  # check refuses the pair. A misspelt option is still an unknown key, with the real ones.
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.model.batch_norm=true',
                '--config.model.layer_norm=True') == (
      'error: MLP takes batch_norm or layer_norm, not both.')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.model.layer_norms=1') == (
      "error: --config.model.layer_norms: config.model has no key 'layer_norms'; the mlp model "
      'takes: activation, batch_norm, dropout_rate, dtype, features, layer_norm, residual.')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.task.smoothing=0.1') == (
      "error: --config.task.smoothing: config.task has no key 'smoothing' (nearest: "
      'task.label_smoothing); the classification task takes: augment, input_key, input_mean, '
      'input_scale, input_std, label_smoothing.')


def test_a_key_inside_an_option_the_config_leaves_out_says_to_set_the_option_whole(tmp_path):
  # Only a whole option is added to the config, so a key inside one was refused with the
  # model's option list, which names the very option the flag had set.
  gpt = 'experiments/configs/shakespeare_char_gpt.py'
  assert _error(f'--config={gpt}', f'--workdir={tmp_path}',
                '--config.model.attention_options.block=64') == (
      "error: --config.model.attention_options.block: config.model has no key "
      "'attention_options'; the gpt model takes 'attention_options', but the config leaves it "
      "out, so set it whole, e.g. --config.model.attention_options=\"{'block': ...}\".")
  # Set whole, the option reaches the model, whose own check names what it takes (after the
  # data, which sets the vocabulary: a small input.txt stands in for Tiny Shakespeare).
  import data  # pylint: disable=g-import-not-at-top
  source = tmp_path / 'text'
  source.mkdir()
  (source / 'input.txt').write_text('ROMEO:\nTo be, or not to be, that is the question.\n' * 50)
  data.load('tiny_shakespeare', 'train', data_dir=str(tmp_path / 'data'), source_dir=str(source))
  assert _error(f'--config={gpt}', f'--workdir={tmp_path / "w"}', '--config.model.attention=local',
                "--config.model.attention_options={'block_size': 32}",
                f'--config.data.data_dir={tmp_path / "data"}',
                f'--config.data.options={{"source_dir": "{source}"}}') == (
      "error: GPT attention_options has 'block_size', which attention='local' does not take; "
      'allowed: block, query_blocks.')


def test_a_boolean_option_the_config_leaves_out_can_be_given_without_a_value(tmp_path):
  # absl's --config.X and --noconfig.X forms; the first was refused with a list of options that
  # named the very one given.
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.model.batch_norm',
                '--config.model.layer_norm=True') == (
      'error: MLP takes batch_norm or layer_norm, not both.')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--noconfig.model.batch_norm',
                '--config.model.layer_norm', '--config.num_train_steps=0') == (
      'error: config.num_train_steps must be a positive integer, got 0.')
  # An option of another type needs its value after '='.
  gpt = 'experiments/configs/shakespeare_char_gpt.py'
  assert _error(f'--config={gpt}', f'--workdir={tmp_path}', '--config.model.attention') == (
      "error: --config.model.attention: config.model has no key 'attention'; the gpt model "
      "takes 'attention', but the config leaves it out, so give its value after '=', e.g. "
      '--config.model.attention=VALUE.')
  assert not os.path.exists(tmp_path / 'checkpoints')


def test_badly_typed_override(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}',
                '--config.num_train_steps=abc') == (
      'error: --config.num_train_steps=abc is not a valid int: config.num_train_steps holds 2000.')
  # A model option the config lists is left to config_flags, which names the value it holds.
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}',
                '--config.model.dropout_rate=abc') == (
      'error: --config.model.dropout_rate=abc is not a valid float: config.model.dropout_rate '
      'holds 0.2.')


def test_a_tuple_option_given_twice_is_refused(tmp_path):
  # config_flags joins the values of a repeated tuple flag: this command used to train an MLP
  # of features (32, 10, 16, 10), the earlier value not replaced but extended.
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.model.features=(32,10)',
                '--config.model.features=(16, 10)') == (
      'error: --config.model.features is given 2 times ((32,10), (16, 10)), and the values of a '
      'tuple option given more than once are joined into one tuple; give it once.')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--config.model.features=(32,10)',
                '--config.model.features=16').startswith(
      'error: --config.model.features is given 2 times ((32,10), 16), ')
  assert os.listdir(tmp_path) == []


def test_missing_workdir_and_config(tmp_path):
  assert _error(f'--config={_DIGITS}') == (
      'error: --workdir is missing; give the directory for checkpoints, logs and metrics, e.g. '
      '--workdir=workdirs/digits_mlp.')
  assert _error(f'--workdir={tmp_path}').startswith('error: --config is missing; ')


def test_misspelt_flag_and_stray_argument(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--wrkdir={tmp_path}') == (
      'error: Unknown flag --wrkdir; did you mean --workdir? (see --help).')
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', 'extra').startswith(
      "error: Unexpected arguments 'extra': ")
  # After '--' every argument is positional, a --help there included.
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--', '--help').startswith(
      "error: Unexpected arguments '--help': ")


def test_a_bad_flag_before_the_config_is_named_not_taken_for_a_missing_config(tmp_path):
  # absl stops at the first bad value, before --config is read.
  assert _error('--num_processes=abc', f'--config={_DIGITS}', f'--workdir={tmp_path}').startswith(
      'error: --num_processes=abc: ')


def test_manual_distribution_without_coordinator(tmp_path):
  assert _error(f'--config={_DIGITS}', f'--workdir={tmp_path}', '--distributed=manual') == (
      'error: --distributed=manual needs --coordinator_address=HOST:PORT (or '
      'JAX_COORDINATOR_ADDRESS), --num_processes and --process_id.')


def test_help_exits_0_and_lists_configs_models_and_tasks():
  from models import registry  # pylint: disable=g-import-not-at-top
  from train import tasks  # pylint: disable=g-import-not-at-top
  result = _main('--help')
  assert result.returncode == 0, result.stderr[-2000:]
  text = result.stdout
  configs = sorted(glob.glob(os.path.join(REPO_ROOT, 'experiments', 'configs', '*.py')))
  listed = 0
  for path in configs:
    name = os.path.basename(path)
    with open(path, encoding='utf-8') as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ''
    if name in ('default.py', '__init__.py'):
      assert f'  {name}  ' not in text
      continue
    line = next(line for line in text.splitlines() if line.startswith(f'  {name} '))
    assert line.split(None, 1)[1] == doc.splitlines()[0]
    listed += 1
  assert listed >= 4
  assert f'Models (--config.model.name): {", ".join(sorted(registry.MODELS))}\n' in text
  assert f'Tasks (--config.task.name): {", ".join(sorted(tasks.TASKS))}\n' in text
  for flag in ('--config', '--workdir', '--distributed', '--coordinator_address'):
    assert f'  {flag}: ' in text
  # --helpfull adds the flags of every module (absl's own among them) to the same lists.
  full = _main('--helpfull')
  assert full.returncode == 0, full.stderr[-2000:]
  assert ',--verbosity: ' in full.stdout and ',--verbosity: ' not in text
  assert 'Every flag: --helpfull.' in text and 'Every flag:' not in full.stdout
  assert f'Tasks (--config.task.name): {", ".join(sorted(tasks.TASKS))}\n' in full.stdout


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_a_slurm_job_step_joins_one_run_without_flags(tmp_path):
  """Two processes that see only SLURM's variables (and the port) train one run: had they
  run alone, each would have written its own metrics into the work directory."""
  import data  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / 'data')
  for split in ('train', 'test'):
    data.load('digits', split, data_dir=data_dir)  # prepared before both processes read it
  workdir, steps = tmp_path / 'w', 2
  slurm = {'SLURM_JOB_ID': '77', 'SLURM_STEP_NODELIST': 'localhost', 'SLURM_NTASKS': '2',
           'JAX_COORDINATOR_PORT': str(_free_port()),
           'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'JAX_COORD',
                                                                     'JAX_NUM', 'JAX_PROCESS'))}
  args = [f'--config={_DIGITS}', f'--workdir={workdir}', f'--config.data.data_dir={data_dir}',
          f'--config.num_train_steps={steps}', '--config.log_every_steps=1',
          f'--config.eval_every_steps={steps}', f'--config.checkpoint_every_steps={steps}',
          '--config.optimizer.warmup_steps=1']
  processes = [subprocess.Popen(
      [sys.executable, '-m', 'experiments.main', *args], cwd=REPO_ROOT, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      env={**base, **slurm, 'SLURM_PROCID': str(i), 'SLURM_LOCALID': str(i),
           'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}) for i in range(2)]
  try:
    outputs = [p.communicate(timeout=600)[0] for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  for p, out in zip(processes, outputs):
    assert p.returncode == 0, out[-3000:]
  with open(workdir / 'metrics.jsonl', encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  assert [r['step'] for r in rows if r['split'] == 'train'] == list(range(1, steps + 1))


def _prepared_digits(data_dir):
  return (f'--config={_DIGITS}', f'--config.data.data_dir={data_dir}')


def test_model_widths_zero_or_negative(tmp_path, data_dir):
  for features in ('(256, 0, 10)', '(256, -3, 10)'):
    workdir = tmp_path / 'w'
    line = _error(*_prepared_digits(data_dir), f'--workdir={workdir}',
                  f'--config.model.features={features}')
    assert line == f'error: MLP features must be positive integers, got {features}.'
    assert not workdir.exists()  # nothing is created before every check passed


def test_task_option_out_of_range(tmp_path, data_dir):
  line = _error(*_prepared_digits(data_dir), f'--workdir={tmp_path / "w"}',
                '--config.task.label_smoothing=2.0')
  assert line == 'error: task.label_smoothing must lie in [0, 1), got 2.0.'


def test_deeply_nested_tokenizer_file(tmp_path):
  import data  # pylint: disable=g-import-not-at-top
  source, data_dir, workdir = tmp_path / 'text', tmp_path / 'data', tmp_path / 'w'
  source.mkdir()
  (source / 'input.txt').write_text('To be, or not to be, that is the question.\n' * 50)
  data.load('tiny_shakespeare', 'train', data_dir=str(data_dir), source_dir=str(source))
  workdir.mkdir()
  (workdir / 'tokenizer.json').write_text('[' * 100_000)
  line = _error('--config=experiments/configs/shakespeare_char_conv.py', f'--workdir={workdir}',
                f'--config.data.data_dir={data_dir}',
                f'--config.data.options={{"source_dir": "{source}"}}')
  assert line == (f"error: Tokenizer file '{workdir / 'tokenizer.json'}' is invalid: it nests "
                  'deeper than any tokenizer file.')
  assert (workdir / 'tokenizer.json').read_text() == '[' * 100_000  # left as it was
  assert not (workdir / 'checkpoints').exists()


# Runs experiments/main.py with train.distributed and train.loop replaced by fakes that write
# what main passed them to $CALLS, and that end as $OUTCOME says: nothing is trained or joined.
# The call that keeps freed host memory is recorded with what it returned.
_FAKE_TRAIN = r'''
import json, os, runpy, sys, types
import train

def record(*call):
  with open(os.environ['CALLS'], 'a', encoding='utf-8') as f:
    f.write(json.dumps(call) + '\n')

outcome = os.environ.get('OUTCOME', '')
distributed = types.ModuleType('train.distributed')
distributed.initialize = lambda *args, **kwargs: record('initialize', args, kwargs)
loop = types.ModuleType('train.loop')

class Stopped(Exception):
  def __init__(self, message, exit_code=1):
    super().__init__(message)
    self.exit_code = exit_code

class RaisesWhenDeleted:
  def __init__(self, error):
    self.error = error

  def __del__(self):  # Python reports the error to sys.unraisablehook
    raise self.error

class Run:
  def train(self):
    if outcome == 'stopped':
      raise Stopped('stopped by a signal', exit_code=3)
    if outcome == 'write_failed':
      # As TensorStore calls back into Orbax's closed event loops after a failed write.
      RaisesWhenDeleted(RuntimeError('Event loop is closed'))
      raise ValueError('the checkpoint write failed')
    if outcome == 'other_unraisable':
      RaisesWhenDeleted(RuntimeError('Event loop is closing'))
    return {'loss': 0.5, 'accuracy': 0.25}

def setup(config, workdir, **kwargs):
  record('setup', [config.seed, config.model.name, config.model.features], workdir, kwargs)
  if outcome == 'interrupted':
    raise KeyboardInterrupt
  if outcome == 'missing':
    raise FileNotFoundError('no data set files in /nowhere.')
  return Run()

loop.Stopped, loop.setup = Stopped, setup
from train import xla_cpu
keep_freed_host_memory = xla_cpu.keep_freed_host_memory
xla_cpu.keep_freed_host_memory = lambda: record('keep_freed_host_memory',
                                                keep_freed_host_memory())
for name, module in (('distributed', distributed), ('loop', loop)):
  sys.modules[f'train.{name}'] = module
  setattr(train, name, module)
runpy.run_module('experiments.main', run_name='__main__')
'''


def _faked_main(tmp_path, *args, outcome='', env=None):
  """(exit status, stdout, stderr, the calls of train.distributed and train.loop)."""
  calls = tmp_path / 'calls.jsonl'
  result = subprocess.run([sys.executable, '-c', _FAKE_TRAIN, *args], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=60,
                          env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu',
                               'CALLS': str(calls), 'OUTCOME': outcome, **(env or {})})
  lines = calls.read_text().splitlines() if calls.exists() else []
  return result.returncode, result.stdout, result.stderr, [json.loads(line) for line in lines]


def test_multi_process_flags_overrides_and_workdir_reach_start_up_and_setup(tmp_path):
  code, out, err, calls = _faked_main(
      tmp_path, f'--config={_DIGITS}', f'--workdir={tmp_path / "w"}', '--distributed=manual',
      '--coordinator_address=10.0.0.7:1234', '--num_processes=4', '--process_id=3',
      '--config.seed=11', '--config.model.features=(8, 10)', '--allow_config_change')
  assert code == 0, err[-2000:]
  assert calls == [
      ['keep_freed_host_memory', xla_cpu._is_glibc()],  # pylint: disable=protected-access
      ['initialize', ['10.0.0.7:1234', 4, 3], {'mode': 'manual'}],
      ['setup', [11, 'mlp', [8, 10]], str(tmp_path / 'w'), {'allow_config_change': True}]]
  assert out.splitlines()[-1] == 'final eval: accuracy=0.2500 loss=0.5000'


def test_the_coordinator_defaults_to_its_variable_and_config_change_to_refused(tmp_path):
  # A person's own malloc setting is kept: the call changes nothing and says so.
  code, _, err, calls = _faked_main(tmp_path, f'--config={_DIGITS}', f'--workdir={tmp_path}',
                                    env={'JAX_COORDINATOR_ADDRESS': '10.0.0.9:99',
                                         'MALLOC_ARENA_MAX': '4'})
  assert code == 0, err[-2000:]
  assert calls == [['keep_freed_host_memory', False],
                   ['initialize', ['10.0.0.9:99', None, None], {'mode': 'auto'}],
                   ['setup', [0, 'mlp', [256, 256, 10]], str(tmp_path),
                    {'allow_config_change': False}]]  # digits_mlp.py as it is


@pytest.mark.parametrize('outcome, code, stderr', [
    ('interrupted', 130, 'interrupted before training started; nothing was written\n'),
    ('missing', 1, 'error: no data set files in /nowhere.\n'),
    ('stopped', 3, 'stopped by a signal\n'),
    ('write_failed', 1, 'error: the checkpoint write failed\n')])
def test_exit_status_and_one_line_of_each_way_a_run_ends_early(tmp_path, outcome, code, stderr):
  status, out, err, _ = _faked_main(tmp_path, f'--config={_DIGITS}', f'--workdir={tmp_path}',
                                    outcome=outcome)
  assert (status, err) == (code, stderr)
  assert 'final eval' not in out


def test_only_closed_event_loop_reports_are_silenced(tmp_path):
  # A write that failed is one line above (no 'Event loop is closed' traceback); any other
  # error raised where Python cannot raise it is still reported.
  status, out, err, _ = _faked_main(tmp_path, f'--config={_DIGITS}', f'--workdir={tmp_path}',
                                    outcome='other_unraisable')
  assert status == 0 and out.splitlines()[-1] == 'final eval: accuracy=0.2500 loss=0.5000'
  assert 'Exception ignored' in err and 'RuntimeError: Event loop is closing' in err
