"""Multi-process start-up with `jax.distributed`, driven by flags, environment or cluster.

Three modes:

  auto    (default) join a run when a coordinator is given (argument or
          JAX_COORDINATOR_ADDRESS), else when JAX recognises a cluster job of
          more than one process (SLURM, Open MPI, Cloud TPU, ...), which then
          supplies the coordinator, process count and process id; else run alone,
          refusing a process count other than 1 or a process id other than 0.
  manual  join the run named by the coordinator, process count and process id
          (arguments, else JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
  off     run alone, whatever the environment says; refuses a coordinator, a
          process count other than 1 or a process id other than 0 given as arguments.

Under SLURM, JAX takes the coordinator's host from the first node of
SLURM_STEP_NODELIST and its port from SLURM_JOB_ID unless JAX_COORDINATOR_PORT is set.
"""

import errno
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import socket

import jax

MODES = ('auto', 'manual', 'off')

# HOST:PORT, the host a name, an IPv4 address or an IPv6 address in brackets ([::1]:1234).
_ADDRESS = re.compile(r'(?:\[[^\[\]\s]+\]|[^\[\]\s:/]+):([0-9]+)')
_PORTS = '1..65535'


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, mode: str = 'auto') -> str | None:
  """Joins a multi-process run as `mode` says; returns how it joined, or None if alone.

  The result is 'manual' for a run named by coordinator, count and id, or the
  name of the cluster JAX detected ('slurm', 'ompi', ...). Must run before
  anything touches a JAX backend. On a CPU-only platform the processes talk over gloo.

  Raises:
    ValueError: an unknown mode; a manual run without a coordinator, with a
      coordinator that is not HOST:PORT, a process count below 1 or a process id
      outside [0, num_processes) (flag or environment variable); in auto mode
      without a coordinator or cluster job, a process count other than 1 or a
      process id other than 0 (flag or environment variable); in off mode, a
      coordinator, count or id of that kind given as an argument; a cluster job
      with a JAX_COORDINATOR_PORT outside 1..65535; or a run that could not be
      joined (the coordinator's port in use, or the coordinator unreachable).
  """
  if mode not in MODES:
    raise ValueError(f'Unknown distributed mode {mode!r}; allowed: {", ".join(MODES)}.')
  if mode == 'off':
    # experiments/main.py defaults --coordinator_address to the variable, which off ignores.
    if coordinator_address and coordinator_address != os.environ.get('JAX_COORDINATOR_ADDRESS'):
      raise ValueError(f'--coordinator_address={coordinator_address} contradicts '
                       '--distributed=off, which runs alone.')
    given = _several_processes(num_processes, process_id, environment=False)
    if given:
      raise ValueError(f'{given} contradicts --distributed=off, which runs alone.')
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
    given = _several_processes(num_processes, process_id, environment=True)
    if given:
      raise ValueError(f'{given} needs --coordinator_address=HOST:PORT (or '
                       'JAX_COORDINATOR_ADDRESS) to join a multi-process run.')
    return None
  port = os.environ.get('JAX_COORDINATOR_PORT')
  if port is not None and not _valid_port(port):
    raise ValueError(f'JAX_COORDINATOR_PORT must be an integer in {_PORTS}, got {port!r}.')
  _use_gloo_on_cpu()
  try:
    jax.distributed.initialize()  # JAX reads coordinator, count and id from the cluster
  except jax.errors.JaxRuntimeError as e:
    raise ValueError(f'Could not join the {cluster} job\'s multi-process run: its coordinator '
                     'port may be in use (JAX_COORDINATOR_PORT picks another) or the '
                     'coordinator unreachable.') from e
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
  """Checks coordinator, count and id (arguments, else environment) and joins their run."""
  # experiments/main.py defaults --coordinator_address to the variable, so an equal
  # value most likely came from the environment.
  address_name = ('JAX_COORDINATOR_ADDRESS'
                  if coordinator_address == os.environ.get('JAX_COORDINATOR_ADDRESS')
                  else '--coordinator_address')
  address = _ADDRESS.fullmatch(coordinator_address)
  if address is None or not _valid_port(address.group(1)):
    raise ValueError(f'{address_name} must be HOST:PORT with a port in {_PORTS} (e.g. '
                     f'localhost:1234 or [::1]:1234), got {coordinator_address!r}.')
  num_processes, count_name = _integer(num_processes, '--num_processes', 'JAX_NUM_PROCESSES',
                                       'an integer >= 1')
  process_id, id_name = _integer(process_id, '--process_id', 'JAX_PROCESS_ID',
                                 'an integer in [0, num_processes)')
  if num_processes is None or process_id is None:
    raise ValueError(f'The multi-process run at {coordinator_address} also needs --num_processes '
                     '(or JAX_NUM_PROCESSES) and --process_id (or JAX_PROCESS_ID), got '
                     f'num_processes={num_processes}, process_id={process_id}.')
  if num_processes < 1:
    raise ValueError(f'{count_name} must be an integer >= 1, got {num_processes}.')
  if not 0 <= process_id < num_processes:
    raise ValueError(f'{id_name} must be an integer in [0, {num_processes}) for '
                     f'{num_processes} processes, got {process_id}.')
  port = int(address.group(1))
  # Process 0's coordinator listens on [::]:PORT; jaxlib may crash outright rather
  # than raise when that port is taken, so it is tried here first.
  if process_id == 0 and 'JAX_COORDINATOR_BIND_ADDRESS' not in os.environ and _in_use(port):
    raise ValueError(f'Port {port} of {address_name}={coordinator_address} is already in use on '
                     'this machine, where process 0 starts the coordinator; pick a free port.')
  _use_gloo_on_cpu()
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  except jax.errors.JaxRuntimeError as e:
    # JAX's plain RuntimeErrors (called twice, or after a backend started) say so
    # themselves; only the runtime's own failures are about the address.
    raise ValueError(f'Could not join the multi-process run at {coordinator_address} as '
                     f'process {process_id} of {num_processes}: the port may be in use or the '
                     'coordinator unreachable.') from e


def _several_processes(num_processes: int | str | None, process_id: int | str | None, *,
                       environment: bool) -> str | None:
  """'NAME=VALUE' of the first of a process count other than 1 and a process id other than 0
  given as an argument, else (if `environment`) as JAX_NUM_PROCESSES or JAX_PROCESS_ID;
  None if none is."""
  for argument, flag, variable, alone in (
      (num_processes, '--num_processes', 'JAX_NUM_PROCESSES', 1),
      (process_id, '--process_id', 'JAX_PROCESS_ID', 0)):
    if argument is not None:
      name, value = flag, argument
    elif environment:
      name, value = variable, os.environ.get(variable)
    else:
      continue
    if value not in (None, '') and str(value).strip() != str(alone):
      return f'{name}={value}'
  return None


def _integer(argument: int | str | None, flag: str, variable: str,
             allowed: str) -> tuple[int | None, str]:
  """`argument`, else environment `variable` read as an integer (None if neither), and its name."""
  name, value = (flag, argument) if argument is not None else (variable, os.environ.get(variable))
  if isinstance(value, str):
    try:
      value = int(value)
    except ValueError:
      raise ValueError(f'{name} must be {allowed}, got {value!r}.') from None
  if value is not None and not isinstance(value, int):
    raise ValueError(f'{name} must be {allowed}, got {value!r}.')
  return value, name


def _valid_port(text: str) -> bool:
  return text.isascii() and text.isdigit() and 1 <= int(text) <= 65535


def _in_use(port: int) -> bool:
  """Whether `port` cannot be bound on every IPv6 and IPv4 address of this machine."""
  for family, host in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
    try:
      with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As gRPC does: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as e:  # no IPv6 on this machine, say, is left for JAX to judge
      if e.errno == errno.EADDRINUSE:
        return True
  return False


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
