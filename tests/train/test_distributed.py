"""Distributed start-up: which mode joins which run, and two processes that join through a
(faked) SLURM job step with nothing but JAX's own cluster detection."""

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import types

import jax
import pytest

from tests.subprocess_util import REPO_ROOT
from tests.subprocess_util import run_python
from train import distributed

_SLURM = {'SLURM_JOB_ID': '4242', 'SLURM_STEP_NODELIST': '127.0.0.1', 'SLURM_NTASKS': '2',
          'SLURM_PROCID': '0', 'SLURM_LOCALID': '0', 'SLURM_STEP_NUM_NODES': '1'}
_JOIN_ENV = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID',
             'JAX_COORDINATOR_PORT', 'OMPI_MCA_orte_hnp_uri')


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@pytest.fixture
def calls(monkeypatch):
  """Records jax.distributed.initialize calls and config updates instead of joining a run."""
  recorded = {'initialize': [], 'config': []}
  monkeypatch.setattr(jax.distributed, 'initialize',
                      lambda **kwargs: recorded['initialize'].append(kwargs))
  monkeypatch.setattr(jax.config, 'update', lambda *args: recorded['config'].append(args))
  for name in (*_JOIN_ENV, *_SLURM):
    monkeypatch.delenv(name, raising=False)
  return recorded


def test_alone_without_coordinator_or_cluster(calls):
  assert distributed.initialize() is None
  assert calls['initialize'] == []


def test_auto_joins_a_detected_slurm_job(calls, monkeypatch):
  for name, value in _SLURM.items():
    monkeypatch.setenv(name, value)
  assert distributed.detected_cluster() == 'slurm'
  assert distributed.initialize() == 'slurm'
  assert calls['initialize'] == [{}]  # JAX reads the job's coordinator, count and id itself
  assert calls['config'] == [('jax_cpu_collectives_implementation', 'gloo')]


def test_a_single_task_slurm_job_runs_alone(calls, monkeypatch):
  for name, value in {**_SLURM, 'SLURM_NTASKS': '1'}.items():
    monkeypatch.setenv(name, value)
  assert distributed.detected_cluster() is None
  assert distributed.initialize() is None and calls['initialize'] == []


def test_an_opt_in_only_cluster_is_not_detected(calls, monkeypatch):
  # As jax.distributed.initialize() without arguments, which asks only the other kinds (mpi4py,
  # present wherever the package is installed, is one of the opt-in kinds).
  from jax._src import clusters  # pylint: disable=g-import-not-at-top
  def cluster(opt_in):
    return type('Fake', (), {'name': 'fake', 'opt_in_only_method': opt_in,
                             'is_env_present': staticmethod(lambda: True),
                             'get_process_count': staticmethod(lambda: 2)})
  monkeypatch.setattr(clusters.ClusterEnv, '_cluster_types', [cluster(True)])
  assert distributed.detected_cluster() is None
  assert distributed.initialize() is None and calls['initialize'] == []
  monkeypatch.setattr(clusters.ClusterEnv, '_cluster_types', [cluster(True), cluster(False)])
  assert distributed.detected_cluster() == 'fake'


def test_off_ignores_coordinator_and_cluster(calls, monkeypatch):
  for name, value in _SLURM.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
  assert distributed.initialize(mode='off') is None and calls['initialize'] == []


@pytest.mark.parametrize('arguments, environment, named', [
    ((2, None), {}, '--num_processes=2'),
    ((None, 1), {}, '--process_id=1'),
    ((2, 1), {'JAX_NUM_PROCESSES': '4'}, '--num_processes=2'),
    ((None, None), {'JAX_NUM_PROCESSES': '2'}, 'JAX_NUM_PROCESSES=2'),
    ((None, None), {'JAX_PROCESS_ID': '3'}, 'JAX_PROCESS_ID=3'),
    ((1, None), {'JAX_PROCESS_ID': '1'}, 'JAX_PROCESS_ID=1'),
])
def test_auto_refuses_other_processes_without_a_coordinator(calls, monkeypatch, arguments,
                                                            environment, named):
  """Each process would otherwise train alone as process 0 of 1."""
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError) as info:
    distributed.initialize(None, *arguments)
  assert str(info.value) == (f'{named} needs --coordinator_address=HOST:PORT (or '
                             'JAX_COORDINATOR_ADDRESS) to join a multi-process run.')
  assert calls == {'initialize': [], 'config': []}


@pytest.mark.parametrize('arguments, environment', [
    ((1, 0), {}), ((None, None), {'JAX_NUM_PROCESSES': '1', 'JAX_PROCESS_ID': '0'}),
    ((None, None), {'JAX_NUM_PROCESSES': ''}),
    ((None, None), {'JAX_NUM_PROCESSES': ' 1 ', 'JAX_PROCESS_ID': '0 '}),  # as int() reads them
    ((1, 0), {'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '1'})])  # the arguments win, 0 too
def test_auto_without_a_coordinator_runs_alone_when_told_one_process(calls, monkeypatch,
                                                                     arguments, environment):
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  assert distributed.initialize(None, *arguments) is None
  assert calls == {'initialize': [], 'config': []}


@pytest.mark.parametrize('arguments, named', [
    (('127.0.0.1:1234', None, None), '--coordinator_address=127.0.0.1:1234'),
    ((None, 2, None), '--num_processes=2'), ((None, 1, 1), '--process_id=1')])
def test_off_refuses_arguments_naming_a_multi_process_run(calls, arguments, named):
  with pytest.raises(ValueError) as info:
    distributed.initialize(*arguments, mode='off')
  assert str(info.value) == f'{named} contradicts --distributed=off, which runs alone.'
  assert calls == {'initialize': [], 'config': []}


def test_off_ignores_the_environment_and_one_process_arguments(calls, monkeypatch):
  for name, value in {'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'JAX_NUM_PROCESSES': '2',
                      'JAX_PROCESS_ID': '1'}.items():
    monkeypatch.setenv(name, value)
  # experiments/main.py passes JAX_COORDINATOR_ADDRESS as --coordinator_address's default.
  assert distributed.initialize('127.0.0.1:1234', mode='off') is None
  assert distributed.initialize(None, 1, 0, mode='off') is None
  assert calls == {'initialize': [], 'config': []}


def test_a_coordinator_joins_manually_and_wins_over_the_cluster(calls, monkeypatch):
  for name, value in _SLURM.items():
    monkeypatch.setenv(name, value)
  assert distributed.initialize('10.0.0.1:99', 4, 3) == 'manual'
  assert calls['initialize'] == [{'coordinator_address': '10.0.0.1:99', 'num_processes': 4,
                                  'process_id': 3}]


def test_manual_without_coordinator_is_one_sentence(calls):
  with pytest.raises(ValueError) as info:
    distributed.initialize(mode='manual')
  assert str(info.value) == ('--distributed=manual needs --coordinator_address=HOST:PORT (or '
                             'JAX_COORDINATOR_ADDRESS), --num_processes and --process_id.')


def test_unknown_mode_is_one_sentence(calls):
  with pytest.raises(ValueError, match=r"^Unknown distributed mode 'slurm'; allowed: auto, "
                                       r'manual, off\.$'):
    distributed.initialize(mode='slurm')


_ADDRESS_ERROR = ('{} must be HOST:PORT with a port in 1..65535 (e.g. localhost:1234 or '
                  '[::1]:1234), got {!r}.')


@pytest.mark.parametrize('address', ['localhost', 'localhost:abc', 'localhost:0',
                                     'localhost:65536', 'localhost:', ':1234', '::1:1234',
                                     'grpc://localhost:1234', 'local host:1234'])
def test_a_coordinator_not_host_port_is_refused_before_joining(calls, address):
  with pytest.raises(ValueError) as info:
    distributed.initialize(address, 1, 0)
  assert str(info.value) == _ADDRESS_ERROR.format('--coordinator_address', address)
  assert calls == {'initialize': [], 'config': []}


def test_a_coordinator_from_the_environment_is_named_as_such(calls, monkeypatch):
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', 'myhost')
  monkeypatch.setenv('JAX_NUM_PROCESSES', '1')
  monkeypatch.setenv('JAX_PROCESS_ID', '0')
  with pytest.raises(ValueError) as info:
    distributed.initialize()
  assert str(info.value) == _ADDRESS_ERROR.format('JAX_COORDINATOR_ADDRESS', 'myhost')
  assert calls['initialize'] == []


@pytest.mark.parametrize('address', ['[::1]:1234', 'localhost:65535', 'node-7.cluster:1',
                                     '10.0.0.1:8476'])
def test_host_port_forms_jax_accepts_are_passed_on(calls, address):
  assert distributed.initialize(address, 2, 1) == 'manual'
  assert calls['initialize'] == [{'coordinator_address': address, 'num_processes': 2,
                                  'process_id': 1}]


@pytest.mark.parametrize('arguments, environment, message', [
    ((None, 0), {'JAX_NUM_PROCESSES': 'two'},
     "JAX_NUM_PROCESSES must be an integer >= 1, got 'two'."),
    ((2, None), {'JAX_PROCESS_ID': 'first'},
     "JAX_PROCESS_ID must be an integer in [0, num_processes), got 'first'."),
    ((None, None), {'JAX_NUM_PROCESSES': '', 'JAX_PROCESS_ID': '0'},
     "JAX_NUM_PROCESSES must be an integer >= 1, got ''."),
    ((0, 0), {}, '--num_processes must be an integer >= 1, got 0.'),
    ((None, 0), {'JAX_NUM_PROCESSES': '-2'}, 'JAX_NUM_PROCESSES must be an integer >= 1, got -2.'),
    ((2, 2), {}, '--process_id must be an integer in [0, 2) for 2 processes, got 2.'),
    ((2, None), {'JAX_PROCESS_ID': '-1'},
     'JAX_PROCESS_ID must be an integer in [0, 2) for 2 processes, got -1.'),
    ((2.0, 0), {}, '--num_processes must be an integer >= 1, got 2.0.'),
    ((2, None), {},
     'The multi-process run at 127.0.0.1:1234 also needs --num_processes (or JAX_NUM_PROCESSES) '
     'and --process_id (or JAX_PROCESS_ID), got num_processes=2, process_id=None.'),
])
def test_a_bad_process_count_or_id_names_its_flag_or_variable(calls, monkeypatch, arguments,
                                                              environment, message):
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError) as info:
    distributed.initialize('127.0.0.1:1234', *arguments)
  assert str(info.value) == message
  assert calls == {'initialize': [], 'config': []}


def test_process_count_and_id_from_the_environment(calls, monkeypatch):
  monkeypatch.setenv('JAX_NUM_PROCESSES', '4')
  monkeypatch.setenv('JAX_PROCESS_ID', '3')
  assert distributed.initialize('127.0.0.1:1234') == 'manual'
  assert calls['initialize'] == [{'coordinator_address': '127.0.0.1:1234', 'num_processes': 4,
                                  'process_id': 3}]


@pytest.mark.parametrize('port', ['abc', '0', '70000', '', '\uff11\uff12\uff13'])  # full-width
def test_a_cluster_job_with_a_bad_coordinator_port_is_refused(calls, monkeypatch, port):
  for name, value in {**_SLURM, 'JAX_COORDINATOR_PORT': port}.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError) as info:
    distributed.initialize()
  assert str(info.value) == f'JAX_COORDINATOR_PORT must be an integer in 1..65535, got {port!r}.'
  assert calls['initialize'] == []


def test_a_runtime_failure_to_join_is_one_sentence(calls, monkeypatch):
  """E.g. a process > 0 whose coordinator never answers (JAX gives up after 5 minutes)."""
  failure = jax.errors.JaxRuntimeError('DEADLINE_EXCEEDED: Barrier timed out')
  def fail(**kwargs):
    raise failure
  monkeypatch.setattr(jax.distributed, 'initialize', fail)
  with pytest.raises(ValueError) as info:
    distributed.initialize('10.0.0.1:1234', 2, 1)
  assert str(info.value) == ('Could not join the multi-process run at 10.0.0.1:1234 as process 1 '
                             'of 2: the port may be in use or the coordinator unreachable.')
  assert info.value.__cause__ is failure
  for name, value in _SLURM.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError) as info:
    distributed.initialize()
  assert str(info.value) == ("Could not join the slurm job's multi-process run: its coordinator "
                             'port may be in use (JAX_COORDINATOR_PORT picks another) or the '
                             'coordinator unreachable.')
  assert info.value.__cause__ is failure


@pytest.mark.parametrize('held', ['127.0.0.1', '0.0.0.0'])
def test_a_coordinator_port_in_use_is_refused_before_joining(calls, held):
  """jaxlib may crash outright instead of raising when process 0 cannot listen."""
  with socket.socket() as holder:
    holder.bind((held, 0))
    port = holder.getsockname()[1]
    with pytest.raises(ValueError) as info:
      distributed.initialize(f'127.0.0.1:{port}', 2, 0)
    assert calls == {'initialize': [], 'config': []}
    distributed.initialize(f'127.0.0.1:{port}', 2, 1)  # only process 0 listens
  assert str(info.value) == (f'Port {port} of --coordinator_address=127.0.0.1:{port} is already '
                             'in use on this machine, where process 0 starts the coordinator; '
                             'pick a free port.')
  assert calls['initialize'] == [{'coordinator_address': f'127.0.0.1:{port}', 'num_processes': 2,
                                  'process_id': 1}]



def test_a_port_held_on_ipv6_only_is_in_use(calls):
  try:
    holder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
  except OSError:
    pytest.skip('no IPv6 on this machine')
  with holder:
    holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
      holder.bind(('::', 0))
    except OSError:
      pytest.skip('no IPv6 address to bind on this machine')
    port = holder.getsockname()[1]
    with pytest.raises(ValueError, match=f'^Port {port} of --coordinator_address='):
      distributed.initialize(f'127.0.0.1:{port}', 2, 0)
  assert calls['initialize'] == []


def test_a_port_whose_last_connection_lingers_is_free(calls):
  # A coordinator that just ended leaves its port in TIME_WAIT; gRPC, which marks its sockets
  # SO_REUSEADDR as this listener is, binds it again, so the rerun must not be refused.
  with socket.socket() as listener:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(('127.0.0.1', 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(('127.0.0.1', port))
    accepted, _ = listener.accept()
    accepted.close()  # the side that closes first keeps the port in TIME_WAIT
    client.close()
  assert distributed.initialize(f'127.0.0.1:{port}', 2, 0) == 'manual'
  assert calls['initialize'][-1]['coordinator_address'] == f'127.0.0.1:{port}'


def test_a_machine_without_ipv6_probes_the_port_on_ipv4_alone(calls, monkeypatch):
  socket_class = socket.socket
  def no_ipv6(family=socket.AF_INET, *args):
    if family == socket.AF_INET6:
      raise OSError(errno.EAFNOSUPPORT, 'Address family not supported by protocol')
    return socket_class(family, *args)
  monkeypatch.setattr(socket, 'socket', no_ipv6)
  port = _free_port()
  assert distributed.initialize(f'127.0.0.1:{port}', 2, 0) == 'manual'
  with socket_class() as holder:
    holder.bind(('0.0.0.0', 0))
    port = holder.getsockname()[1]
    with pytest.raises(ValueError, match=f'^Port {port} of --coordinator_address='):
      distributed.initialize(f'127.0.0.1:{port}', 2, 0)


def test_a_coordinator_bound_elsewhere_skips_the_port_check(calls, monkeypatch):
  # With JAX_COORDINATOR_BIND_ADDRESS the coordinator listens there, not on this port.
  with socket.socket() as holder:
    holder.bind(('0.0.0.0', 0))
    port = holder.getsockname()[1]
    monkeypatch.setenv('JAX_COORDINATOR_BIND_ADDRESS', '127.0.0.1:0')
    assert distributed.initialize(f'127.0.0.1:{port}', 2, 0) == 'manual'


def test_an_installed_accelerator_plugin_is_not_cpu_only(platforms, monkeypatch):
  platforms(None)
  found = [object()]  # what importlib.metadata lists for an installed jax_cuda12_plugin
  entry_points = distributed.importlib.metadata.entry_points
  monkeypatch.setattr(
      distributed.importlib.metadata, 'entry_points',
      lambda group=None: found if group == 'jax_plugins' else entry_points(group=group))
  assert not distributed.cpu_only()


def test_libtpu_or_a_jax_plugins_module_is_not_cpu_only(platforms, monkeypatch, tmp_path):
  platforms(None)
  namespace = types.ModuleType('jax_plugins')  # JAX's namespace package for plugins
  namespace.__path__ = [str(tmp_path)]
  monkeypatch.setitem(sys.modules, 'jax_plugins', namespace)
  assert distributed.cpu_only()  # the namespace, empty
  (tmp_path / 'xla_cuda12').mkdir()
  (tmp_path / 'xla_cuda12' / '__init__.py').write_text('')
  assert not distributed.cpu_only()
  monkeypatch.delitem(sys.modules, 'jax_plugins')
  find_spec = distributed.importlib.util.find_spec
  monkeypatch.setattr(distributed.importlib.util, 'find_spec',
                      lambda name, *args: object() if name == 'libtpu' else find_spec(name, *args))
  assert not distributed.cpu_only()


def test_a_real_coordinator_on_a_free_port_is_joined_and_its_port_then_in_use():
  """The check against JAX itself, in a child as initialize runs once per process: the port
  it found free is one JAX listens on, and a second coordinator there is refused."""
  result = run_python(f"""
      import json
      from train import distributed
      address = '127.0.0.1:{_free_port()}'
      joined = distributed.initialize(address, 1, 0)
      try:
        distributed.initialize(address, 1, 0)
      except ValueError as e:
        print(json.dumps({{'joined': joined, 'address': address, 'again': str(e)}}))
      """, timeout=60)
  port = result['address'].split(':')[1]
  assert result == {'joined': 'manual', 'address': result['address'],
                    'again': f'Port {port} of --coordinator_address={result["address"]} is '
                             'already in use on this machine, where process 0 starts the '
                             'coordinator; pick a free port.'}


@pytest.fixture
def platforms():
  """Sets jax_platforms for one test (only read here: the backends are not restarted)."""
  update, previous = jax.config.update, jax.config.jax_platforms
  yield lambda value: update('jax_platforms', value)
  update('jax_platforms', previous)


@pytest.mark.parametrize('value, expected', [('cpu', True), ('cuda', False), ('cuda,cpu', False),
                                             ('tpu', False), (None, True)])
def test_gloo_only_on_a_cpu_platform(platforms, calls, value, expected):
  """None: JAX picks the platform, and this environment has no accelerator plugin."""
  platforms(value)
  assert distributed.cpu_only() == expected
  distributed.initialize('127.0.0.1:1', 2, 0)
  assert (('jax_cpu_collectives_implementation', 'gloo') in calls['config']) == expected


_CHILD = textwrap.dedent('''
    import json
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from train import distributed
    joined = distributed.initialize()
    mesh = jax.make_mesh((jax.device_count(),), ('processes',))
    local = np.full((jax.local_device_count(),), 10.0 * (jax.process_index() + 1), np.float32)
    x = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, P('processes')), local)
    total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, 'processes'), mesh=mesh,
                                  in_specs=P('processes'), out_specs=P()))(x)
    print(json.dumps({'joined': joined, 'count': jax.process_count(),
                      'index': jax.process_index(), 'devices': jax.device_count(),
                      'psum': float(np.asarray(total.addressable_data(0))[0])}))
''')


def test_two_processes_join_a_faked_slurm_step():
  """Each process sees only SLURM's variables (its own SLURM_PROCID and SLURM_LOCALID)
  and the port; JAX derives the coordinator 127.0.0.1:PORT from SLURM_STEP_NODELIST."""
  base = {k: v for k, v in os.environ.items() if k not in _JOIN_ENV and not k.startswith('SLURM_')}
  base.update(_SLURM, JAX_COORDINATOR_PORT=str(_free_port()), JAX_PLATFORMS='cpu',
              PYTHONPATH=REPO_ROOT, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  processes = [subprocess.Popen([sys.executable, '-c', _CHILD], cwd=REPO_ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**base, 'SLURM_PROCID': str(i), 'SLURM_LOCALID': str(i)})
               for i in range(2)]
  try:
    outputs = [p.communicate(timeout=300) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  results = []
  for p, (out, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  assert results == [{'joined': 'slurm', 'count': 2, 'index': i, 'devices': 2, 'psum': 30.0}
                     for i in range(2)]
