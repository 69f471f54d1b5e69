"""Orbax checkpoints of the train state and the input iterator's position.

Each checkpoint `<workdir>/checkpoints/<step>/` holds two items: 'state' (the
`TrainState` in its canonical global layout, RNG included) and 'data' (the
iterator state as JSON). Saves are asynchronous and atomic: a run killed while
saving leaves the previous checkpoints intact and the partial one is ignored.
"""

import os

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every_steps` steps and at the end, keeps the last `keep`."""

  def __init__(self, workdir: str, every_steps: int, keep: int):
    if every_steps <= 0 or keep <= 0:
      raise ValueError(f'checkpoint_every_steps ({every_steps}) and checkpoints_to_keep ({keep}) '
                       'must be positive.')
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every_steps, max_to_keep=keep, create=True,
        cleanup_tmp_directories=True)
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=('state', 'data'))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict | None, *, force: bool = False) -> bool:
    """Starts an asynchronous save of `state` (canonical layout) if `step` is due."""
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {})),
                             force=force)

  def check_compatible(self, abstract_state) -> None:
    """Raises one sentence if the latest checkpoint cannot restore into `abstract_state`.

    Called before compiling, so a changed model config with an old --workdir
    stops at once and leaves the checkpoints as they are.
    """
    step = self.latest_step()
    if step is None:
      return
    path = os.path.join(self.directory, str(step), 'state')
    saved = _shapes(_saved_tree(path))
    wanted = _shapes(abstract_state)
    # Parameters first: their mismatch is the one a person recognises.
    for name in sorted(set(saved) | set(wanted), key=lambda n: (not n.startswith('params'), n)):
      if saved.get(name) != wanted.get(name):
        raise ValueError(
            f'The checkpoint of step {step} in {self.directory!r} does not fit this config: '
            f'{name} is {_describe(saved.get(name))} there but {_describe(wanted.get(name))} '
            'here; use a new --workdir or the config that wrote it.')

  def restore(self, abstract_state, step: int | None = None):
    """Returns (state, data_state) of `step` (the latest by default), laid out as `abstract_state`."""
    step = self.latest_step() if step is None else step
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return restored['state'], restored['data']

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _saved_tree(path: str):
  """The saved state's tree of array metadata (shape, dtype), read without restoring."""
  return ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree


def _shapes(tree) -> dict[str, tuple]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path, simple=True, separator='/'): (tuple(x.shape), np.dtype(x.dtype))
          for path, x in leaves}


def _describe(shape_dtype) -> str:
  if shape_dtype is None:
    return 'absent'
  shape, dtype = shape_dtype
  return f'{dtype} {shape}'


def restore_arrays(workdir: str, step: int | None = None) -> dict:
  """The saved train state of `step` (the latest by default) as nested dicts of NumPy arrays.

  Needs no model, config or devices matching the run that wrote it, e.g. to
  compare two runs or to inspect parameters in a notebook.
  """
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  steps = sorted(int(d) for d in os.listdir(directory) if d.isdigit()) if os.path.isdir(directory) else []
  step = (steps[-1] if steps else None) if step is None else step
  if step is None or step not in steps:
    raise FileNotFoundError(f'No checkpoint of step {step} in {directory!r}; found steps {steps}.')
  path = os.path.join(directory, str(step), 'state')
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), _saved_tree(path))
  return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
