"""Classification: softmax cross-entropy over class logits, with accuracy."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from data import augment as augment_lib
from models import losses
from train.tasks import base


@dataclasses.dataclass(frozen=True)
class Classification(base.Task):
  """`model(input) → logits [B, C]`; loss −log softmax(logits)[label], label smoothing optional.

  Options:
    input_key: the record feature that is the model input.
    input_scale: the input is `float32(record[input_key]) * input_scale`.
    input_mean, input_std: per-channel normalisation `(input − mean) / std`
      over the last axis (one value per channel, or one for all), applied on
      the device after augmentation (which works on [0, 1] images), in
      training and evaluation alike; empty for none.
    label_smoothing: ε in [0, 1): targets (1 − ε)·onehot + ε/C.
    augment: `data.augment` stages run on each train batch with the task's
      'augment' stream; labels become one-hot so mixup and cutmix can mix
      them (accuracy then counts the most-weighted class).
  """
  rng_streams = ('dropout', 'augment')

  input_key: str = 'image'
  input_scale: float = 1.0
  label_smoothing: float = 0.0
  input_mean: Any = ()
  input_std: Any = ()
  augment: Any = ()

  def validate(self):
    base.check_input_scale(self.input_scale)
    mean, std = tuple(self.input_mean or ()), tuple(self.input_std or ())
    if len(mean) != len(std):
      raise ValueError(f'task.input_mean {mean!r} and task.input_std {std!r} must give one value '
                       'per channel each (or both be empty).')
    if any(not s > 0 for s in std):
      raise ValueError(f'task.input_std must be positive, got {std!r}.')
    object.__setattr__(self, 'input_mean', mean)
    object.__setattr__(self, 'input_std', std)
    if not 0 <= self.label_smoothing < 1:
      raise ValueError(f'task.label_smoothing must lie in [0, 1), got {self.label_smoothing!r}.')
    features = self.meta.get('features')
    if features is not None and self.input_key not in features:
      raise ValueError(f'task.input_key={self.input_key!r} is not a feature of the data set; '
                       f'its features are: {", ".join(sorted(features))}.')
    if 'label' not in (features or ('label',)):
      raise ValueError('The classification task needs a `label` feature; the data set has: '
                       f'{", ".join(sorted(features))}.')
    if self.augment and not self.meta.get('num_classes'):
      raise ValueError('task.augment needs the number of classes, which the data set does not '
                       'report.')
    object.__setattr__(self, '_augment', augment_lib.build_augmentation(self.augment)
                       if self.augment else None)

  def preprocess(self, records):
    scale = np.float32(self.input_scale)
    return {'input': np.asarray(records[self.input_key], np.float32) * scale,
            'label': np.asarray(records['label'], np.int32)}

  def model_inputs(self, batch):
    return (batch['input'],)

  def transform(self, rngs, batch, train):
    if train and self._augment is not None:
      out = self._augment(rngs['augment'], {
          'image': batch['input'], 'label': jax.nn.one_hot(batch['label'], self.meta['num_classes'])})
      batch = {**batch, 'input': out['image'], 'label': out['label']}
    if self.input_mean:
      batch = {**batch, 'input': self.normalize(batch['input'])}
    return batch

  def normalize(self, inputs):
    """`(inputs − input_mean) / input_std` per channel (the last axis)."""
    if not self.input_mean:
      return inputs
    channels = inputs.shape[-1]
    if len(self.input_mean) not in (1, channels):
      raise ValueError(f'task.input_mean has {len(self.input_mean)} values but the input has '
                       f'{channels} channels (its last axis); give one value per channel.')
    mean = jnp.asarray(self.input_mean, inputs.dtype)
    return (inputs - mean) / jnp.asarray(self.input_std, inputs.dtype)

  def loss(self, model, batch):
    logits_BxC = model(*self.model_inputs(batch)).astype(jnp.float32)
    labels = batch['label']
    if labels.ndim == logits_BxC.ndim:  # soft labels (after mixup or cutmix)
      loss_B = losses.softmax_cross_entropy(logits_BxC, labels,
                                            label_smoothing=self.label_smoothing)
      labels = jnp.argmax(labels, -1)
    else:
      loss_B = losses.cross_entropy(logits_BxC, labels, label_smoothing=self.label_smoothing)
    correct_B = jnp.argmax(logits_BxC, -1) == labels
    return {'loss': base.mean_over(loss_B), 'accuracy': base.mean_over(correct_B)}
