"""Runs Python source in a fresh interpreter, e.g. with simulated CPU devices.

`XLA_FLAGS` must be set before JAX is imported, so multi-device checks run in
their own process. The child prints JSON on its last stdout line; the parent
gets it back parsed.
"""

import json
import os
import subprocess
import sys
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# LLVM's optimisations off: a child's many small steps compile in about half the time. A
# child compiles its reference runs with the same flags as the runs compared with them.
FAST_COMPILE_FLAGS = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'


def run_python(source: str, *, devices: int = 1, timeout: float = 600, env: dict | None = None,
               fast_compile: bool = False):
  """Runs `source` with `devices` simulated CPU devices (and FAST_COMPILE_FLAGS if
  `fast_compile`); returns its last stdout line as JSON."""
  child_env = dict(os.environ)
  child_env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}'
  if fast_compile:
    child_env['XLA_FLAGS'] += f' {FAST_COMPILE_FLAGS}'
  child_env['JAX_PLATFORMS'] = 'cpu'
  child_env['PYTHONPATH'] = REPO_ROOT + os.pathsep + child_env.get('PYTHONPATH', '')
  child_env.update(env or {})
  result = subprocess.run([sys.executable, '-c', textwrap.dedent(source)], env=child_env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
  if result.returncode != 0:
    raise AssertionError(f'child process failed ({result.returncode}):\n{result.stderr[-4000:]}')
  return json.loads(result.stdout.strip().splitlines()[-1])
