r"""Trains any experiment config with the shared train library.

  python -m experiments.main --config=experiments/configs/digits_mlp.py \
      --workdir=/tmp/digits_mlp [--config.optimizer.learning_rate=0.01 ...]

Rerunning the same command resumes from the latest checkpoint in --workdir.
For a multi-process run, give every process the same --coordinator_address and
--num_processes and its own --process_id (or set JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID).
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and metrics.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', os.environ.get('JAX_COORDINATOR_ADDRESS'),
                                   'host:port of process 0, for multi-process runs.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process in a multi-process run.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO.
  # Imported after flag parsing so `--help` stays fast.
  from train import distributed, loop  # pylint: disable=g-import-not-at-top
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  try:
    run = loop.setup(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  final = run.train()
  print('final eval: ' + ' '.join(f'{k}={v:.4f}' for k, v in sorted(final.items())))


if __name__ == '__main__':
  app.run(main)
