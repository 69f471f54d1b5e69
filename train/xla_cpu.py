"""The one XLA:CPU compiler default the launchers set: convolutions stay off YNNPACK.

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

This module imports nothing from JAX at import time, so launchers can call it before
JAX is set up.
"""

import os
import sys
from collections.abc import MutableMapping

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
