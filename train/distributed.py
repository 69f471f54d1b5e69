"""Multi-process start-up with `jax.distributed`, driven by flags or environment."""

import os

import jax


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins a multi-process run when a coordinator is given; a no-op otherwise.

  Arguments left as None are read from JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID. On CPU the processes talk over gloo.
  """
  coordinator_address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
  if not coordinator_address:
    return
  if num_processes is None and 'JAX_NUM_PROCESSES' in os.environ:
    num_processes = int(os.environ['JAX_NUM_PROCESSES'])
  if process_id is None and 'JAX_PROCESS_ID' in os.environ:
    process_id = int(os.environ['JAX_PROCESS_ID'])
  if num_processes is None or process_id is None or not 0 <= process_id < num_processes:
    raise ValueError(f'A multi-process run needs num_processes >= 1 and 0 <= process_id < '
                     f'num_processes, got num_processes={num_processes}, process_id={process_id}.')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
