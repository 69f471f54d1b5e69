r"""Trains any experiment config with the shared train library.

  python -m experiments.main --config=experiments/configs/digits_mlp.py \
      --workdir=/tmp/digits_mlp [--config.optimizer.learning_rate=0.01 ...]

Rerunning the same command resumes from the latest checkpoint in --workdir.
Multi-process runs: under SLURM, Open MPI or on Cloud TPU start one process per
task and JAX finds the others (--distributed=auto); elsewhere give every process
the same --coordinator_address and --num_processes and its own --process_id (or
set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
"""

import functools
import os
import sys

from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments import command_line

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
command_line.load_config_files_with('config')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and metrics.')
# train.distributed.MODES, not imported here: it imports JAX, which --help and flag errors skip.
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', ['auto', 'manual', 'off'],
    'auto: join a multi-process run when a coordinator is given or JAX detects a cluster job '
    '(SLURM, Open MPI, Cloud TPU); manual: join the run named by --coordinator_address, '
    '--num_processes and --process_id; off: run alone.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', os.environ.get('JAX_COORDINATOR_ADDRESS'),
                                   'host:port of process 0, for multi-process runs.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process in a multi-process run.')
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    'allow_config_change', False, 'Resume the checkpoints of --workdir although the config '
    'differs from the one that wrote them beyond what a resume takes as it is (step counts, '
    'intervals, checkpoints_to_keep, max_bad_steps, profile_steps, parallel settings, data paths '
    'and reader threads).')


def main(argv):
  del argv  # _parse_flags refused any positional argument
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO.
    # A failed checkpoint write reaches the person as one sentence of ours; Orbax's
    # own log records of it (tracebacks from its threads) show with --verbosity=0.
    logging.get_absl_handler().addFilter(
        lambda record: f'{os.sep}orbax{os.sep}' not in record.pathname)
  # Imported after flag parsing so that `--help` and flag errors stay fast.
  from train import xla_cpu  # pylint: disable=g-import-not-at-top
  xla_cpu.keep_convolutions_off_ynnpack()  # both before JAX starts (see train/xla_cpu.py)
  xla_cpu.keep_freed_host_memory()
  from train import distributed  # pylint: disable=g-import-not-at-top
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                           mode=_DISTRIBUTED.value)
    from train import loop  # pylint: disable=g-import-not-at-top
    run = loop.setup(_CONFIG.value, _WORKDIR.value,
                     allow_config_change=_ALLOW_CONFIG_CHANGE.value)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  except KeyboardInterrupt:
    # Before training starts (while data is prepared or steps are traced).
    sys.stderr.write('interrupted before training started; nothing was written\n')
    sys.exit(130)
  _quiet_closed_event_loop_callbacks()
  try:
    final = run.train()
  except loop.Stopped as e:  # a stop signal, or too many non-finite steps
    sys.stderr.write(f'{e}\n')
    sys.exit(e.exit_code)
  except (ValueError, FileNotFoundError) as e:
    # E.g. a checkpoint write that failed: Orbax's background threads of that save
    # wait for signals that never come, so the interpreter could not shut down.
    sys.stderr.write(f'error: {e}\n')
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)  # pylint: disable=protected-access
  print('final eval: ' + ' '.join(f'{k}={v:.4f}' for k, v in sorted(final.items())))


def _quiet_closed_event_loop_callbacks() -> None:
  """After a checkpoint write fails, TensorStore still calls back into Orbax's closed event
  loops, and each call reports an unraisable RuntimeError with its traceback; the failure
  itself is reported in one sentence."""
  default = sys.unraisablehook

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == 'Event loop is closed'):
      default(unraisable)
  sys.unraisablehook = hook


if __name__ == '__main__':
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__))
