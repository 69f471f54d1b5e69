"""The two XLA:CPU defaults the launchers set: convolutions stay off YNNPACK, and the host
memory a step frees is kept for the next step.

XLA:CPU hands some operations to the YNNPACK library as "YNN fusions"
(`--xla_cpu_experimental_ynn_fusion_type`, a list of fusion kinds). By default the list
includes `individual_convolution`, and on this project's ResNet-20 train step (batch
128, 28×28 images) the library then computes the weight gradients, convolutions whose
window is a whole feature map, slowly: with it the step's traced operations took 550 ms,
324 ms of them in YNNPACK, and without it 216 ms; the step ran 1.29× and 1.25× faster in
two rounds on a quiet machine (README, Benchmarks). Dots and the other fusion kinds stay
on YNNPACK: turning every YNN fusion off gave the ViT's step between 0.80× and 1.13× its
speed in rounds on a loaded machine, no clear gain.

`keep_convolutions_off_ynnpack` appends `-individual_convolution` (remove that kind from
XLA's default list) to `XLA_FLAGS`, unless `XLA_FLAGS` already names the YNN fusion
types, so a person's own choice always wins. XLA reads `XLA_FLAGS` once, when JAX starts
its first backend, so the call must come before any computation; afterwards it refuses in
one sentence rather than change nothing silently. Accelerator compilers ignore the flag.

XLA:CPU allocates each run of a compiled program's temporary buffer with `malloc` on one
of its worker threads, and frees it at the end. glibc's `malloc` serves a block larger
than its mmap threshold (at most 32 MB), or any block too large for a worker thread's
own arena (64 MB), with a fresh `mmap`, and returns it with `munmap` when it is freed: the
kernel then maps in and zero-fills every page of it again at the next step. The character
GPT's train step (4 layers of width 256, batch 16 × 128 tokens) took 67,000 page faults
per step that way, about 260 MB, and spent a third of a core in the kernel; its step took
348–382 ms. `keep_freed_host_memory` sets glibc's `mallopt` so that every thread allocates
from the one main heap (M_ARENA_MAX 1), no block is mapped on its own (M_MMAP_MAX 0) and
freed memory at the heap's top is kept up to 2 GB (M_TRIM_THRESHOLD): after the first steps
the buffer is the same memory each step, with no page faults, and the same step took
292–315 ms (README, Benchmarks). The cost: the process keeps the memory it has freed (the
GPT's resident size grew from 0.85 GB at its first step to 1.6 GB at step 43, and stayed),
and threads that allocate at once take turns on one heap. The setting acts on the process's
C library, so it holds for whatever runs later; it must come before JAX starts its backend
and its threads, or it refuses in one sentence (a second call changes nothing and is no
error). It changes nothing, and returns False, where the C library is not glibc, or where the
environment already sets `malloc`'s options (MALLOC_ARENA_MAX, MALLOC_MMAP_MAX_,
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, or `glibc.malloc.` in
GLIBC_TUNABLES): a person's own choice wins, so `MALLOC_ARENA_MAX=8` (say) keeps glibc's
defaults.

This module imports nothing from JAX at import time, so launchers can call it before
JAX is set up.
"""

import ctypes
import os
import sys
from collections.abc import Mapping, MutableMapping

YNN_FUSION_FLAG = '--xla_cpu_experimental_ynn_fusion_type'
NO_YNN_CONVOLUTIONS = f'{YNN_FUSION_FLAG}=-individual_convolution'


def keep_convolutions_off_ynnpack(environ: MutableMapping[str, str] = os.environ) -> bool:
  """Adds NO_YNN_CONVOLUTIONS to environ['XLA_FLAGS'] unless it already sets YNN fusion types.

  Returns whether it added the flag. For the process's own environment it raises
  RuntimeError if JAX has already started a backend (the flag would then have no effect)
  and the flag is not there yet.
  """
  flags = environ.get('XLA_FLAGS', '')
  if YNN_FUSION_FLAG in flags:
    return False
  if environ is os.environ and _backends_started():
    raise RuntimeError(
        f'keep_convolutions_off_ynnpack() came after JAX started its backend, so '
        f'{NO_YNN_CONVOLUTIONS} cannot take effect; call it before the first JAX computation.')
  environ['XLA_FLAGS'] = f'{flags} {NO_YNN_CONVOLUTIONS}'.strip()
  return True


def _backends_started() -> bool:
  if 'jax' not in sys.modules:
    return False
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return xla_bridge.backends_are_initialized()


# glibc's mallopt parameters (malloc.h) and the values set.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
KEPT_FREE_BYTES = 2**31 - 1  # mallopt takes an int: 2 GB
MALLOC_ENVIRONMENT = ('MALLOC_ARENA_MAX', 'MALLOC_MMAP_MAX_', 'MALLOC_MMAP_THRESHOLD_',
                      'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_')
_kept_freed_memory = False  # set once this process's malloc keeps freed memory


def keep_freed_host_memory(environ: Mapping[str, str] = os.environ) -> bool:
  """Has glibc's malloc keep freed memory for reuse (see the module doc).

  Returns whether it changed malloc's settings: False where the C library is not glibc or
  `environ` sets malloc's options. Raises RuntimeError if JAX has already started a backend.
  """
  global _kept_freed_memory
  if _kept_freed_memory or not _is_glibc() or _sets_malloc_options(environ):
    return False
  if _backends_started():
    raise RuntimeError(
        'keep_freed_host_memory() came after JAX started its backend, whose threads may '
        "already hold malloc arenas of their own; call it before the first JAX computation.")
  mallopt = ctypes.CDLL(None).mallopt
  for parameter, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
                           (M_TRIM_THRESHOLD, KEPT_FREE_BYTES)):
    if mallopt(parameter, value) != 1:
      raise RuntimeError(f"glibc's mallopt refused parameter {parameter} = {value}.")
  _kept_freed_memory = True
  return True


def _is_glibc() -> bool:
  try:
    return os.confstr('CS_GNU_LIBC_VERSION').startswith('glibc')
  except (AttributeError, ValueError, OSError):  # not a GNU C library, or no confstr
    return False


def _sets_malloc_options(environ: Mapping[str, str]) -> bool:
  return (any(name in environ for name in MALLOC_ENVIRONMENT)
          or 'glibc.malloc.' in environ.get('GLIBC_TUNABLES', ''))
