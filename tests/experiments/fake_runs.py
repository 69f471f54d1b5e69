"""A run's work directory with a checkpoint of chosen parameters, written by the run's own
Checkpointer, for the tests of scripts that read trained runs (nothing is trained or
compiled: the parameters are drawn in NumPy)."""

import jax
import numpy as np

from train import loop


def save_random_run(config, workdir: str, step: int = 2, draw=None) -> str:
  """Sets up the run of `config` in `workdir` and saves, as step `step`, a state whose leaves
  are `draw(path, leaf)` (default N(0, 1) draws, seed 0). Returns `workdir`."""
  run = loop.setup(config, workdir)
  if draw is None:
    rng = np.random.default_rng(0)
    draw = lambda path, leaf: rng.normal(size=leaf.shape).astype(leaf.dtype)
  try:
    state = jax.tree_util.tree_map_with_path(
        draw, run.parallel.abstract_state(run.init_fn, run.rng))
    state = state.replace(step=np.int32(step))
    run.checkpointer.save(step, state, {'iterator': run.train_iterator().get_state()}, force=True)
  finally:
    run.checkpointer.close()
    run.lock.release()
  return workdir
