"""Multi-process start-up with `jax.distributed`, driven by flags, environment or cluster.

Three modes:

  auto    (default) join a run when a coordinator is given (argument or
          JAX_COORDINATOR_ADDRESS), else when JAX recognises a cluster job of
          more than one process (SLURM, Open MPI, Cloud TPU, ...), which then
          supplies the coordinator, process count and process id; else run alone.
  manual  join the run named by the coordinator, process count and process id
          (arguments, else JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
  off     run alone, whatever the environment says.

Under SLURM, JAX takes the coordinator's host from the first node of
SLURM_STEP_NODELIST and its port from SLURM_JOB_ID unless JAX_COORDINATOR_PORT is set.
"""

import importlib.metadata
import importlib.util
import os
import pkgutil

import jax

MODES = ('auto', 'manual', 'off')


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, mode: str = 'auto') -> str | None:
  """Joins a multi-process run as `mode` says; returns how it joined, or None if alone.

  The result is 'manual' for a run named by coordinator, count and id, or the
  name of the cluster JAX detected ('slurm', 'ompi', ...). Must run before
  anything touches a JAX backend. On a CPU-only platform the processes talk over gloo.

  Raises:
    ValueError: an unknown mode, or a manual run without a coordinator or with
      a process id outside [0, num_processes).
  """
  if mode not in MODES:
    raise ValueError(f'Unknown distributed mode {mode!r}; allowed: {", ".join(MODES)}.')
  if mode == 'off':
    return None
  coordinator_address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
  if coordinator_address:
    _join_manual(coordinator_address, num_processes, process_id)
    return 'manual'
  if mode == 'manual':
    raise ValueError('--distributed=manual needs --coordinator_address=HOST:PORT (or '
                     'JAX_COORDINATOR_ADDRESS), --num_processes and --process_id.')
  cluster = detected_cluster()
  if cluster is None:
    return None
  _use_gloo_on_cpu()
  jax.distributed.initialize()  # JAX reads coordinator, count and id from the cluster
  return cluster


def detected_cluster() -> str | None:
  """The name of the cluster job JAX's own detection finds with more than one process, or None.

  A single-process job (e.g. `srun -n 1`) counts as none: it has nobody to join,
  and starting a coordinator would only take a port.
  """
  # JAX exposes its detection only through `jax.distributed.initialize()`, which
  # fails rather than answers when there is no cluster; these are the classes it asks.
  from jax._src import clusters  # pylint: disable=g-import-not-at-top
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if not env.opt_in_only_method and env.is_env_present():
      return env.name if env.get_process_count() > 1 else None
  return None


def _join_manual(coordinator_address: str, num_processes: int | None,
                 process_id: int | None) -> None:
  if num_processes is None and 'JAX_NUM_PROCESSES' in os.environ:
    num_processes = int(os.environ['JAX_NUM_PROCESSES'])
  if process_id is None and 'JAX_PROCESS_ID' in os.environ:
    process_id = int(os.environ['JAX_PROCESS_ID'])
  if num_processes is None or process_id is None or not 0 <= process_id < num_processes:
    raise ValueError(f'A multi-process run needs num_processes >= 1 and 0 <= process_id < '
                     f'num_processes, got num_processes={num_processes}, process_id={process_id}.')
  _use_gloo_on_cpu()
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def cpu_only() -> bool:
  """Whether JAX will run on the CPU alone, judged without starting a backend.

  JAX_PLATFORMS (or jax_platforms) decides when set; otherwise the CPU is all
  there is unless an accelerator plugin (CUDA, ROCm, libtpu) is installed.
  """
  platforms = jax.config.jax_platforms
  if platforms:
    return {p.strip() for p in platforms.split(',') if p.strip()} == {'cpu'}
  if importlib.util.find_spec('libtpu') is not None:
    return False
  # Where JAX itself looks for accelerator plugins (jax_cuda12_plugin, ...).
  if list(importlib.metadata.entry_points(group='jax_plugins')):
    return False
  try:
    import jax_plugins  # pylint: disable=g-import-not-at-top
  except ImportError:
    return True
  return not any(pkgutil.iter_modules(jax_plugins.__path__))


def _use_gloo_on_cpu() -> None:
  # Cross-process collectives on the CPU need an implementation (JAX 0.10.2's
  # default is gloo; naming it keeps CPU runs working if the default changes).
  # GPU and TPU bring their own collectives, so they are left alone.
  if cpu_only():
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
