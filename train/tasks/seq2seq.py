"""Sequence to sequence: teacher-forced cross-entropy, greedy decoding and exact match.

Targets are ASCII text, one token per character: token id = character code
(32–126), with 0 = padding, 1 = BOS and 2 = EOS (`models.sequence.rnn_models`).
A target y_1 … y_n is trained as

  decoder input   BOS y_1 … y_n            (teacher forcing: the true previous token)
  decoder target  y_1 … y_n EOS            (n + 1 weighted positions)

and evaluated both teacher-forced (`loss`, per-token `accuracy`) and free:
greedy decoding from BOS through the shared generation code
(`train.sampling.generate`, temperature 0, the model's cache), where
`exact_match` counts the targets reproduced exactly up to and including EOS.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models import losses
from models.sequence.rnn_models import BOS_ID, EOS_ID, PAD_ID
from train import sampling
from train.tasks import base

# Token ids 0 … 126: padding, BOS, EOS and the printable ASCII characters' codes.
NUM_TOKEN_IDS = 127


def encode_targets(texts_B: np.ndarray, lengths_B: np.ndarray, max_length: int):
  """ASCII byte rows (0-padded) → (decoder inputs, decoder targets, weights), each [B, max_length + 1]."""
  batch = len(lengths_B)
  inputs = np.full((batch, max_length + 1), PAD_ID, np.int32)
  targets = np.full((batch, max_length + 1), PAD_ID, np.int32)
  inputs[:, 0] = BOS_ID
  for row, (text, length) in enumerate(zip(texts_B, lengths_B)):
    inputs[row, 1:length + 1] = text[:length]
    targets[row, :length] = text[:length]
    targets[row, length] = EOS_ID
  weights = (np.arange(max_length + 1)[None] <= np.asarray(lengths_B)[:, None]).astype(np.float32)
  return inputs, targets, weights


@dataclasses.dataclass(frozen=True)
class Seq2Seq(base.Task):
  """`model(decoder inputs [B, N], source, source lengths) → logits [B, N, V]`.

  Options:
    source_key: the source feature: ASCII bytes [S] (0-padded) or a real vector.
    source_length_key: the source lengths feature ('' for a vector source).
    source_scale: a real source is multiplied by it (e.g. 1/16 for 0–16 pixels).
    target_key, target_length_key: the target bytes [N] and their lengths; or
    target_names: one text per class, so the target of a record is
      target_names[record[target_key]] (e.g. spelling a digit's label).
    max_target_length: the longest target n (the decoder runs n + 1 steps).
  """
  source_key: str = 'source'
  source_length_key: str = 'source_length'
  source_scale: float = 1.0
  target_key: str = 'target'
  target_length_key: str = 'target_length'
  target_names: Any = ()
  max_target_length: int = 10

  def validate(self):
    features = self.meta.get('features')
    keys = ['source_key', 'target_key'] + (['source_length_key'] if self.source_length_key else [])
    if not self.target_names:
      keys.append('target_length_key')
    for option in keys:
      if features is not None and getattr(self, option) not in features:
        raise ValueError(f'task.{option}={getattr(self, option)!r} is not a feature of the data '
                         f'set; its features are: {", ".join(sorted(features))}.')
    if not isinstance(self.max_target_length, int) or self.max_target_length < 1:
      raise ValueError(f'task.max_target_length must be a positive integer, got '
                       f'{self.max_target_length!r}.')
    names = tuple(self.target_names or ())
    for name in names:
      if not name or len(name) > self.max_target_length or not _is_ascii_text(name.encode()):
        raise ValueError(f'task.target_names entry {name!r} must be 1 to max_target_length='
                         f'{self.max_target_length} printable ASCII characters.')
    classes = self.meta.get('num_classes') if self.target_key == 'label' else None
    if names and classes and len(names) != classes:
      raise ValueError(f'task.target_names has {len(names)} names, but the data set\'s '
                       f'{self.target_key!r} has {classes} classes: give one name per class.')
    object.__setattr__(self, 'target_names', names)

  def preprocess(self, records):
    source = np.asarray(records[self.source_key])
    if self.source_length_key:
      source = source.astype(np.int32)
      lengths = np.asarray(records[self.source_length_key], np.int32)
    else:
      source = source.astype(np.float32) * np.float32(self.source_scale)
      lengths = np.full(len(source), 1, np.int32)
    if self.target_names:
      labels = np.asarray(records[self.target_key])
      if labels.min() < 0 or labels.max() >= len(self.target_names):
        raise ValueError(f'A label {int(labels.max())} has no entry in task.target_names '
                         f'({len(self.target_names)} names).')
      texts = [self.target_names[label].encode() for label in labels]
      target_lengths = np.array([len(t) for t in texts], np.int32)
      target_bytes = np.zeros((len(texts), self.max_target_length), np.uint8)
      for row, text in enumerate(texts):
        target_bytes[row, :len(text)] = np.frombuffer(text, np.uint8)
    else:
      target_bytes = np.asarray(records[self.target_key])
      target_lengths = np.asarray(records[self.target_length_key], np.int32)
      if target_lengths.max() > self.max_target_length:
        raise ValueError(f'A target has {int(target_lengths.max())} characters, more than '
                         f'task.max_target_length={self.max_target_length}.')
    inputs, targets, weights = encode_targets(target_bytes, target_lengths, self.max_target_length)
    return {'source': source, 'source_length': lengths, 'decoder_input': inputs,
            'target': targets, 'weights': weights}

  def _source_inputs(self, batch) -> tuple:
    return (batch['source'], batch['source_length']) if self.source_length_key else (
        batch['source'],)

  def model_inputs(self, batch):
    return (batch['decoder_input'],) + self._source_inputs(batch)

  def loss(self, model, batch):
    logits_BxNxV = model(*self.model_inputs(batch)).astype(jnp.float32)
    if logits_BxNxV.shape[-1] < NUM_TOKEN_IDS:
      # A target id past the logits would be a NaN loss at every step, each step skipped.
      raise ValueError(f'The seq2seq task\'s tokens are character codes up to '
                       f'{NUM_TOKEN_IDS - 1} (printable ASCII), but the model gives '
                       f'{logits_BxNxV.shape[-1]} logits; set model.vocab_size to at least '
                       f'{NUM_TOKEN_IDS}.')
    targets_BxN, weights_BxN = batch['target'], batch['weights']
    nll_BxN = losses.cross_entropy(logits_BxNxV, targets_BxN)
    correct_BxN = jnp.argmax(logits_BxNxV, -1) == targets_BxN
    return {'loss': base.mean_over(nll_BxN, weights_BxN),
            'accuracy': base.mean_over(correct_BxN, weights_BxN)}

  def eval_metrics(self, model, batch):
    metrics = self.loss(model, batch)
    decoded_BxN = self.greedy_decode(model.module, {'params': model.params, **model.model_state},
                                     self._source_inputs(batch))
    matches_BxN = (decoded_BxN == batch['target']) | (batch['weights'] == 0)
    metrics['exact_match'] = base.mean_over(jnp.all(matches_BxN, axis=-1))
    return metrics

  def greedy_decode(self, module, variables, source_inputs: tuple) -> jax.Array:
    """argmax decoding from BOS for max_target_length + 1 steps → tokens [B, N] (after BOS)."""
    batch = source_inputs[0].shape[0]
    prompt_Bx1 = jnp.full((batch, 1), BOS_ID, jnp.int32)
    tokens = sampling.generate(module, variables, prompt_Bx1, jax.random.PRNGKey(0),
                               num_new_tokens=self.max_target_length + 1, temperature=0.0,
                               use_cache=sampling.supports_cache(module), inputs=source_inputs)
    return tokens[:, 1:]


def decode_text(tokens) -> str:
  """Token ids → the text before the first EOS (padding and BOS dropped, ids that are not
  printable ASCII shown as '?')."""
  chars = []
  for token in np.asarray(tokens).tolist():
    if token == EOS_ID:
      break
    if token > EOS_ID:
      chars.append(chr(token) if 32 <= token < NUM_TOKEN_IDS else '?')
  return ''.join(chars)


def _is_ascii_text(data: bytes) -> bool:
  return all(32 <= b < NUM_TOKEN_IDS for b in data)
