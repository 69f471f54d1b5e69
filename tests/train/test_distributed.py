"""Distributed start-up: which mode joins which run, and two processes that join through a
(faked) SLURM job step with nothing but JAX's own cluster detection."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import pytest

from tests.subprocess_util import REPO_ROOT
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


def test_off_ignores_coordinator_and_cluster(calls, monkeypatch):
  for name, value in _SLURM.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
  assert distributed.initialize(mode='off') is None and calls['initialize'] == []


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
