"""SIGTERM and Ctrl-C stop a run cleanly: the current step finishes, a checkpoint is saved,
the process says `stopped at step N; rerun the same command to resume`, and the rerun ends
bit-identical to a run that was never stopped — with one process, and when only one of
two processes is signalled (both stop after the same step)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from tests.subprocess_util import REPO_ROOT
from tests.train import loop_patches
from tests.train.test_multiprocess import _free_port
from train import checkpoint
from train import loop
from train import preemption

_CONFIG = os.path.join(REPO_ROOT, 'experiments', 'configs', 'digits_mlp.py')


def _command(workdir, data_dir, steps, *extra):
  return [sys.executable, '-m', 'experiments.main', f'--config={_CONFIG}', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', f'--config.num_train_steps={steps}',
          '--config.checkpoint_every_steps=100', '--config.eval_every_steps=1000000',
          '--config.log_every_steps=100', '--config.optimizer.warmup_steps=10', *extra]


def _env(**extra):
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO_ROOT,
          'XLA_FLAGS': '--xla_force_host_platform_device_count=1', **extra}


def _steps(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit()) if os.path.isdir(directory) else []


def _wait_for_checkpoint(workdir, processes, at_least):
  deadline = time.time() + 300
  while not any(s >= at_least for s in _steps(workdir)):
    assert all(p.poll() is None for p in processes), 'the run ended before it could be stopped'
    assert time.time() < deadline
    time.sleep(0.05)


def _assert_same_end(a_workdir, b_workdir, step):
  a, b = checkpoint.restore_arrays(a_workdir, step), checkpoint.restore_arrays(b_workdir, step)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_sigterm_saves_stops_and_the_rerun_is_bit_identical(tmp_path, data_dir):
  steps = 600  # the signal comes at step 300 or just after, well before the end
  straight, stopped = str(tmp_path / 'straight'), str(tmp_path / 'stopped')
  subprocess.run(_command(straight, data_dir, steps), env=_env(), cwd=REPO_ROOT, check=True,
                 capture_output=True, timeout=600)
  process = subprocess.Popen(_command(stopped, data_dir, steps), env=_env(), cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  _wait_for_checkpoint(stopped, [process], 300)
  process.send_signal(signal.SIGTERM)
  _, err = process.communicate(timeout=300)
  assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith('stopped at step ') and last.endswith('; rerun the same command to resume')
  at = int(last.split()[3].rstrip(';'))
  assert 300 <= at < steps and at in _steps(stopped)  # saved where it stopped
  assert 'Traceback' not in err

  rerun = subprocess.run(_command(stopped, data_dir, steps), env=_env(), cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert f'resuming from step {at} of {steps}' in rerun.stderr
  _assert_same_end(straight, stopped, steps)


def test_a_second_ctrl_c_exits_at_once():
  source = textwrap.dedent('''
      import os, signal, time
      from train import preemption
      with preemption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.exit_code == 130
        print('first handled', flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
      print('not reached', flush=True)
  ''')
  result = subprocess.run([sys.executable, '-c', source], env=_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 130
  assert result.stdout.strip() == 'first handled'
  assert result.stderr.strip().splitlines()[-1] == 'interrupted again: exiting without saving'



def test_the_first_signal_decides_and_only_a_second_ctrl_c_exits():
  # A cluster may send SIGTERM again while the run saves; that must not cut the save short,
  # nor change the exit status the first signal set. Leaving restores the handlers.
  source = textwrap.dedent('''
      import json, os, signal
      from train import preemption
      previous = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT)}
      with preemption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        after_two_sigterms = stop.exit_code
      restored = all(signal.getsignal(n) is h for n, h in previous.items())
      with preemption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        print(json.dumps([after_two_sigterms, restored, stop.exit_code]), flush=True)
        os.kill(os.getpid(), signal.SIGINT)
      print('not reached', flush=True)
  ''')
  result = subprocess.run([sys.executable, '-c', source], env=_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 128 + signal.SIGINT, result.stderr[-2000:]
  assert json.loads(result.stdout) == [128 + signal.SIGTERM, True, 128 + signal.SIGINT]
  assert result.stderr.strip().splitlines()[-1] == 'interrupted again: exiting without saving'


def test_a_stop_request_off_the_main_thread_leaves_the_signals_alone():
  # Python installs handlers from the main thread only; a run started from a worker thread
  # (e.g. in a notebook or a server) trains with the signals' default effect.
  before = signal.getsignal(signal.SIGTERM)
  seen, errors = [], []

  def enter():
    try:
      with preemption.StopRequest() as stop:
        seen.append((signal.getsignal(signal.SIGTERM), stop.requested))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  worker = threading.Thread(target=enter)
  worker.start()
  worker.join(timeout=30)
  assert not errors and seen == [(before, False)]
  assert signal.getsignal(signal.SIGTERM) is before


def test_an_exception_inside_propagates_and_the_handlers_are_restored():
  # The loop stops by raising (loop.Stopped); leaving the context must not swallow it.
  before = {number: signal.getsignal(number) for number in preemption.StopRequest.SIGNALS}
  with pytest.raises(KeyError, match='inside'):
    with preemption.StopRequest() as stop:
      assert signal.getsignal(signal.SIGTERM) == stop._handle  # pylint: disable=protected-access
      raise KeyError('inside')
  assert all(signal.getsignal(number) is handler for number, handler in before.items())


def test_sigterm_to_one_of_two_processes_stops_both_after_the_same_step(tmp_path, data_dir):
  steps = 500  # the signal comes at step 200 or just after, well before the end

  def launch(workdir):
    address = f'127.0.0.1:{_free_port()}'
    return [subprocess.Popen(
        _command(workdir, data_dir, steps, f'--coordinator_address={address}',
                 '--num_processes=2', f'--process_id={i}', '--config.model.dropout_rate=0.0'),
        env=_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]

  straight = str(tmp_path / 'straight')
  for p in launch(straight):
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]

  stopped = str(tmp_path / 'stopped')
  processes = launch(stopped)
  _wait_for_checkpoint(stopped, processes, 200)
  processes[1].send_signal(signal.SIGTERM)
  errs = [p.communicate(timeout=300)[1] for p in processes]
  assert [p.returncode for p in processes] == [1, 128 + signal.SIGTERM], errs[0][-2000:]
  lasts = [e.strip().splitlines()[-1] for e in errs]
  assert lasts[0] == lasts[1] and lasts[0].startswith('stopped at step '), lasts
  at = int(lasts[0].split()[3].rstrip(';'))
  assert at in _steps(stopped) and at < steps

  processes = launch(stopped)
  reruns = [p.communicate(timeout=600)[1] for p in processes]
  assert [p.returncode for p in processes] == [0, 0], reruns[0][-2000:]
  assert f'resuming from step {at} of {steps}' in reruns[0]  # process 0 speaks for both
  _assert_same_end(straight, stopped, steps)


def _stop_config(data_dir):
  from experiments.configs import digits_mlp  # pylint: disable=g-import-not-at-top
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.num_train_steps, config.optimizer.warmup_steps = 4, 1
  config.log_every_steps = config.eval_every_steps = config.checkpoint_every_steps = 2
  return config


def _eval_records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  return [r for r in records if r['split'] == 'eval']


@pytest.mark.parametrize('stop_at', [2, 4])
def test_an_evaluation_a_stop_skipped_runs_on_resuming_and_is_recorded_once(
    stop_at, data_dir, tmp_path, monkeypatch):
  # SIGTERM during step 2 (due an evaluation) or step 4 (the last) of a run that evaluates
  # every 2 steps: the stopped run saves and exits without evaluating. Its evaluation was
  # lost: the rerun resumed past it (or, after the last step, found the run finished), so
  # metrics.jsonl lacked the eval record of that step.
  straight = str(tmp_path / 'straight')
  loop.setup(_stop_config(data_dir), straight).train()

  stopped = str(tmp_path / 'stopped')
  with monkeypatch.context() as patch:
    loop_patches.stop_during_step(stop_at, patch)
    with pytest.raises(loop.Stopped, match=f'stopped at step {stop_at};'):
      loop.setup(_stop_config(data_dir), stopped).train()
  assert [r['step'] for r in _eval_records(stopped)] == [2] * (stop_at == 4)

  expected = _eval_records(straight)
  assert [r['step'] for r in expected] == [2, 4]
  hook_steps = []
  run_hooks = loop.Run.run_hooks
  monkeypatch.setattr(loop.Run, 'run_hooks',
                      lambda self, state, step: hook_steps.append(step) or run_hooks(self, state,
                                                                                     step))
  for rerun in range(2):  # the resumed run, then a rerun of the finished run
    loop.setup(_stop_config(data_dir), stopped).train()
    assert _eval_records(stopped) == expected
    if not rerun:  # the evaluation run on resuming gives its hooks the step it evaluates
      assert hook_steps == [stop_at, 4][:1 + (stop_at == 2)]
