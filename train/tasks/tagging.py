"""Tagging: one label per input step (many-to-many, aligned), weighted per valid step."""

import dataclasses
import numbers

import jax.numpy as jnp
import numpy as np

from models import losses
from train.tasks import base


@dataclasses.dataclass(frozen=True)
class Tagging(base.Task):
  """`model(inputs [B, T], lengths [B]) → logits [B, T, K]`; cross-entropy at the steps t < length.

  Records hold the inputs (`input_key`: token ids, or real values), the tags
  (`tag_key`, one per step) and the number of valid steps (`length_key`).
  Reports the per-step `loss` and `accuracy` and, for tag `positive_tag`, the
  F1 score 2TP / (2TP + FP + FN) as one weighted sum over the whole split
  (e.g. the rare class of a binary tagging, where accuracy alone flatters a
  model that never predicts it).

  Options: input_key, tag_key, length_key, positive_tag (−1: no F1).
  """
  input_key: str = 'input'
  tag_key: str = 'tags'
  length_key: str = 'length'
  positive_tag: int = 1

  def validate(self):
    tag = self.positive_tag
    if not isinstance(tag, numbers.Integral) or isinstance(tag, bool) or tag < -1:
      raise ValueError(f'task.positive_tag must be a tag (an integer >= 0) or -1 for no F1, got '
                       f'{tag!r}.')
    features = self.meta.get('features')
    if features is not None:
      for option in ('input_key', 'tag_key', 'length_key'):
        if getattr(self, option) not in features:
          raise ValueError(f'task.{option}={getattr(self, option)!r} is not a feature of the data '
                           f'set; its features are: {", ".join(sorted(features))}.')

  def preprocess(self, records):
    inputs = np.asarray(records[self.input_key])
    inputs = inputs.astype(np.int32 if np.issubdtype(inputs.dtype, np.integer) else np.float32)
    tags = np.asarray(records[self.tag_key], np.int32)
    lengths = np.asarray(records[self.length_key], np.int32)
    if inputs.shape[:2] != tags.shape:
      raise ValueError(f'The tags {tags.shape} must give one tag per input step {inputs.shape[:2]}.')
    return {'input': inputs, 'tags': tags, 'length': lengths}

  def model_inputs(self, batch):
    return batch['input'], batch['length']

  def loss(self, model, batch):
    logits_BxTxK = model(*self.model_inputs(batch)).astype(jnp.float32)
    tags_BxT = batch['tags']
    num_tags = logits_BxTxK.shape[-1]
    if self.positive_tag >= num_tags:
      # It could never be predicted nor match a tag the model knows: an F1 of NaN.
      raise ValueError(f'task.positive_tag={self.positive_tag} is not one of the model\'s '
                       f'{num_tags} tags (0 to {num_tags - 1}); give one of them, or -1 for no F1.')
    steps = tags_BxT.shape[1]
    valid_BxT = (jnp.arange(steps)[None] < batch['length'][:, None]).astype(jnp.float32)
    nll_BxT = losses.cross_entropy(logits_BxTxK, tags_BxT)
    predicted_BxT = jnp.argmax(logits_BxTxK, -1)
    metrics = {'loss': base.mean_over(nll_BxT, valid_BxT),
               'accuracy': base.mean_over(predicted_BxT == tags_BxT, valid_BxT)}
    if self.positive_tag >= 0:
      predicted = (predicted_BxT == self.positive_tag) * valid_BxT
      actual = (tags_BxT == self.positive_tag) * valid_BxT
      true_positives = predicted * actual
      metrics['f1'] = (2 * true_positives, predicted + actual)  # 2TP / (2TP + FP + FN)
    return metrics
