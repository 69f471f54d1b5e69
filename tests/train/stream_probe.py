"""A model and task that expose a step's random draws through its weighted-sum metrics.

The model returns its dropout keep-mask beside its output, and the task's transform
draws from its 'augment' stream (and, for comparison, from its 'dropout' stream). Each
draw u_BxK becomes one number per example, code_B = Σ_k u_BxK · r_K with fixed weights
r_K, so a metric's global (Σ total, Σ weight) still tells row groups apart: the metric
`<stream>_contrast_<g>` is Σ code over group 0 minus Σ code over group g (the groups
being the devices' shards or the micro-batches). It is exactly 0 when both groups drew
the same numbers, and |·| ≫ 0 for independent draws.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from train import tasks

WIDTH = 32


def code(draws_BxK: jax.Array) -> jax.Array:
  """One number per example that changes with any single draw of its row."""
  return draws_BxK @ jnp.linspace(1.0, 2.0, draws_BxK.shape[-1])


class ProbeModel(nn.Module):
  """Returns (a linear output, the 0/1 keep-mask of a dropout layer of rate 0.5)."""

  @nn.compact
  def __call__(self, x_BxD, *, train=False):
    dropped_BxW = nn.Dropout(0.5, deterministic=not train)(jnp.ones((x_BxD.shape[0], WIDTH)))
    return nn.Dense(2)(x_BxD), (dropped_BxW != 0).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class ProbeTask(tasks.Task):
  """Batch: 'input' [B, D] and 'contrast' [B, G−1] (see `contrast`)."""
  rng_streams = ('dropout', 'augment')

  def model_inputs(self, batch):
    return (batch['input'],)

  def transform(self, rngs, batch, train):
    # Draws in evaluation too, so the eval streams can be observed.
    shape = (batch['input'].shape[0], WIDTH)
    return {**batch, 'augment_draw': jax.random.uniform(rngs['augment'], shape),
            'dropout_draw': jax.random.uniform(rngs['dropout'], shape)}

  def loss(self, model, batch):
    out_Bx2, kept_BxW = model(batch['input'])
    ones = jnp.ones(out_Bx2.shape[0])
    metrics = {'loss': tasks.mean_over(jnp.mean(out_Bx2 ** 2, -1)),
               'dropout_code': tasks.mean_over(code(kept_BxW)),
               'augment_code': tasks.mean_over(code(batch['augment_draw'])),
               # 0 for every example iff the two named streams drew the same numbers.
               'stream_gap': tasks.mean_over(
                   jnp.abs(batch['augment_draw'] - batch['dropout_draw']).sum(-1))}
    for g in range(batch['contrast'].shape[1]):
      signs_B = batch['contrast'][:, g]
      metrics[f'dropout_contrast_{g + 1}'] = (signs_B * code(kept_BxW), ones)
      metrics[f'augment_contrast_{g + 1}'] = (signs_B * code(batch['augment_draw']), ones)
    return metrics


def contrast(batch_size: int, groups: int) -> np.ndarray:
  """[B, groups − 1]: column g−1 is +1 on the rows of group 0 and −1 on those of group g."""
  group_B = np.arange(batch_size) // (batch_size // groups)
  columns_BxG = (group_B == 0)[:, None].astype(np.float32) - (
      group_B[:, None] == np.arange(1, groups)[None, :])
  return columns_BxG.astype(np.float32)


def batch(batch_size: int, groups: int) -> dict:
  """Identical input rows, so only the random streams can tell the groups apart."""
  return {'input': np.ones((batch_size, 3), np.float32), 'contrast': contrast(batch_size, groups)}


def total(metrics_totals: dict, name: str) -> float:
  return float(metrics_totals[name][0])
