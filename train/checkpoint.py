"""Orbax checkpoints of the train state and the input iterator's position.

Each checkpoint `<workdir>/checkpoints/<step>/` holds two items: 'state' (the
`TrainState` in its canonical global layout, RNG included) and 'data' (the
iterator state as JSON). Saves are asynchronous and atomic: a run killed while
saving leaves the previous checkpoints intact and the partial one is ignored.
"""

import os

import jax
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


def restore_params(workdir: str, step: int | None = None):
  """The raw state tree of a checkpoint as host arrays, e.g. to compare or reuse params."""
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), 'checkpoints'),
                                  item_names=('state', 'data'))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f'No checkpoint found in {workdir!r}.')
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return jax.tree.map(lambda x: jax.device_get(x), restored['state'])
