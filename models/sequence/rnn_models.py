"""The four recurrent architectures (Karpathy 2015, "The Unreasonable Effectiveness of RNNs").

  many-to-one    `RNNClassifier`: x_1 … x_T → one label (sequence classification)
  many-to-many   `RNNTagger`: x_t → y_t at every step (aligned tagging), and
                 `RNNLanguageModel`: x_≤t → x_{t+1} (causal, with a decoding cache)
  one-to-many    `Seq2Seq(source='vector')`: one vector → y_1 … y_N (generated)
  seq-to-seq     `Seq2Seq`: x_1 … x_S → y_1 … y_N, an encoder and a decoder
                 (Sutskever et al. 2014), optionally attending over the encoder
                 states at every step (Bahdanau et al. 2015; models/sequence/attention.py)

Inputs are token ids [B, T] (embedded when `vocab_size` is set) or real values
[B, T] or [B, T, C]. Every model takes a compute `dtype` (parameters and logits stay
float32) and the cells of models/sequence/rnn.py, and every model but the language model
per-example `lengths` where sequences are padded.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.sequence import attention as attention_lib
from models.sequence import rnn

# Token ids of the decoders: 0 pads, 1 starts and 2 ends a sequence; the
# other ids are free for the vocabulary (e.g. ASCII codes 32–126).
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def _check(owner: str, cell: str, features: int, num_layers: int, dropout_rate: float,
           unroll: int | bool) -> None:
  rnn.check_cell_options(owner, cell, features, num_layers, unroll)
  if not 0 <= dropout_rate < 1:
    raise ValueError(f'{owner} dropout_rate must lie in [0, 1), got {dropout_rate!r}.')


def _check_sizes(owner: str, optional: tuple[str, ...] = (), **sizes) -> None:
  """One sentence for a size (a width, a vocabulary, a class count) that is not a positive
  integer; the names in `optional` may also be None."""
  for name, value in sizes.items():
    if value is None and name in optional:
      continue
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      allowed = 'None or a positive integer' if name in optional else 'a positive integer'
      raise ValueError(f'{owner} {name} must be {allowed}, got {value!r}.')


class SequenceInput(nn.Module):
  """Token ids [B, T] → embeddings [B, T, E]; real values [B, T] → [B, T, 1]; [B, T, C] as is."""
  vocab_size: int | None = None
  embed_dim: int = 64
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs):
    if jnp.issubdtype(inputs.dtype, jnp.integer):
      if not self.vocab_size:
        raise ValueError('The model got token ids but has no vocab_size; set config.model.vocab_size.')
      return nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype,
                      param_dtype=jnp.float32)(inputs)
    if self.vocab_size:  # real values here would skip the embedding and be read as one feature
      raise ValueError(f'The model has vocab_size={self.vocab_size} but got {inputs.dtype} '
                       'inputs; token ids must be integers.')
    inputs = inputs.astype(self.dtype)
    return inputs[..., None] if inputs.ndim == 2 else inputs


class RNNClassifier(nn.Module):
  """Many-to-one: a recurrent encoder read out once per sequence, then a Dense layer to logits.

  `readout`: 'last' uses the final hidden state of the last layer (the
  backward direction's too, when bidirectional: it has read the whole
  sequence); 'mean' and 'max' pool the last layer's outputs over the valid steps.
  """
  num_classes: int
  cell: str = 'gru'
  features: int = 128
  num_layers: int = 1
  bidirectional: bool = False
  readout: str = 'last'
  dropout_rate: float = 0.0
  vocab_size: int | None = None
  embed_dim: int = 64
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    _check('RNNClassifier', self.cell, self.features, self.num_layers, self.dropout_rate,
           self.unroll)
    _check_sizes('RNNClassifier', ('vocab_size',), num_classes=self.num_classes,
                 vocab_size=self.vocab_size, embed_dim=self.embed_dim)
    if self.readout not in ('last', 'mean', 'max'):
      raise ValueError(f"RNNClassifier readout={self.readout!r}; allowed: last, mean, max.")
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs, lengths_B=None, *, train: bool = False):
    if lengths_B is not None:  # a list of lengths too: the 'mean' and 'max' masks index it
      lengths_B = jnp.asarray(lengths_B)
    x_BxTxC = SequenceInput(self.vocab_size, self.embed_dim, self.dtype)(inputs)
    y_BxTxH, carries = rnn.RNN(self.cell, self.features, self.num_layers, self.bidirectional,
                               self.dropout_rate, self.unroll, self.dtype)(x_BxTxC, lengths_B,
                                                                           train=train)
    if self.readout == 'last':
      summary_BxH = jnp.concatenate([rnn.hidden_state(c) for c in carries[-1]], axis=-1)
    else:
      steps = y_BxTxH.shape[1]
      valid_BxT = (jnp.ones(y_BxTxH.shape[:2], bool) if lengths_B is None
                   else jnp.arange(steps)[None] < lengths_B[:, None])
      if self.readout == 'mean':
        summary_BxH = (jnp.sum(jnp.where(valid_BxT[..., None], y_BxTxH, 0), axis=1)
                       / jnp.maximum(jnp.sum(valid_BxT, 1), 1)[:, None])
      else:  # an empty sequence's summary is 0, as with 'mean', not -inf
        summary_BxH = jnp.max(jnp.where(valid_BxT[..., None], y_BxTxH, -jnp.inf), axis=1)
        summary_BxH = jnp.where(jnp.any(valid_BxT, axis=1)[:, None], summary_BxH, 0.0)
    summary_BxH = nn.Dropout(self.dropout_rate, deterministic=not train)(summary_BxH)
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32)(
        summary_BxH).astype(jnp.float32)


class RNNTagger(nn.Module):
  """Many-to-many, aligned: one label per input step, y_t = softmax(W h_t + b).

  Bidirectional by default (Graves & Schmidhuber 2005), so the tag of x_t
  depends on the whole sequence.
  """
  num_tags: int
  vocab_size: int | None = None
  embed_dim: int = 64
  cell: str = 'lstm'
  features: int = 128
  num_layers: int = 1
  bidirectional: bool = True
  dropout_rate: float = 0.0
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    _check('RNNTagger', self.cell, self.features, self.num_layers, self.dropout_rate, self.unroll)
    _check_sizes('RNNTagger', ('vocab_size',), num_tags=self.num_tags,
                 vocab_size=self.vocab_size, embed_dim=self.embed_dim)
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs, lengths_B=None, *, train: bool = False):
    x_BxTxC = SequenceInput(self.vocab_size, self.embed_dim, self.dtype)(inputs)
    y_BxTxH, _ = rnn.RNN(self.cell, self.features, self.num_layers, self.bidirectional,
                         self.dropout_rate, self.unroll, self.dtype)(x_BxTxC, lengths_B,
                                                                     train=train)
    y_BxTxH = nn.Dropout(self.dropout_rate, deterministic=not train)(y_BxTxH)
    return nn.Dense(self.num_tags, dtype=self.dtype, param_dtype=jnp.float32)(
        y_BxTxH).astype(jnp.float32)


class RNNLanguageModel(nn.Module):
  """Many-to-many, causal: p(x_{t+1} | x_≤t) = softmax(W h_t + b) with h_t of a stacked RNN.

  Embedding E → L recurrent layers of H units (dropout on the embeddings,
  between layers and before the output layer; Zaremba et al. 2014) → logits. With `decode=True`
  every layer keeps its carry in the 'cache' collection, so generation
  (train/sampling.py) reads one token per step in O(1) time.
  """
  vocab_size: int
  cell: str = 'lstm'
  features: int = 512
  num_layers: int = 2
  embed_dim: int = 128
  dropout_rate: float = 0.0
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    _check('RNNLanguageModel', self.cell, self.features, self.num_layers, self.dropout_rate,
           self.unroll)
    _check_sizes('RNNLanguageModel', vocab_size=self.vocab_size, embed_dim=self.embed_dim)
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens_BxT, *, train: bool = False, decode: bool = False):
    x_BxTxE = SequenceInput(self.vocab_size, self.embed_dim, self.dtype)(tokens_BxT)
    x_BxTxE = nn.Dropout(self.dropout_rate, deterministic=not train)(x_BxTxE)
    y_BxTxH, _ = rnn.RNN(self.cell, self.features, self.num_layers, False, self.dropout_rate,
                         self.unroll, self.dtype)(x_BxTxE, train=train, decode=decode)
    y_BxTxH = nn.Dropout(self.dropout_rate, deterministic=not train)(y_BxTxH)
    return nn.Dense(self.vocab_size, dtype=self.dtype, param_dtype=jnp.float32)(
        y_BxTxH).astype(jnp.float32)


class _DecoderStep(nn.Module):
  """One decoder step: attend with s_{t−1}, then the stacked cells on [E y_{t−1}; c_t]."""
  cell: str
  features: int
  num_layers: int
  score: str | None
  attention_features: int
  dtype: Any

  @nn.compact
  def __call__(self, carries, y_BxE, keys_BxSxH, mask_BxS):
    x_BxI = y_BxE
    if self.score is not None:
      query_BxH = rnn.hidden_state(carries[-1])  # s_{t−1}: the top layer's previous state
      context_BxH, weights_BxS = attention_lib.EncoderAttention(
          self.score, self.attention_features, self.dtype, name='attention')(
              query_BxH, keys_BxSxH, mask_BxS)
      x_BxI = jnp.concatenate([y_BxE, context_BxH.astype(y_BxE.dtype)], axis=-1)
    new_carries = []
    for layer in range(self.num_layers):
      carry, x_BxI = rnn.make_cell(self.cell, self.features, self.dtype,
                                   name=f'cell{layer}')(carries[layer], x_BxI)
      new_carries.append(jax.tree.map(lambda n, o: n.astype(o.dtype), carry, carries[layer]))
    if self.score is None:
      return tuple(new_carries), (x_BxI, jnp.zeros(mask_BxS.shape, jnp.float32))
    # The output layer sees the state and the context, a linear map of [s_t; c_t] (Luong et
    # al. 2015 put a tanh layer, h̃_t = tanh(W_c [c_t; h_t]), before theirs, eq. 5).
    out_BxO = jnp.concatenate([x_BxI, context_BxH.astype(x_BxI.dtype)], axis=-1)
    return tuple(new_carries), (out_BxO, weights_BxS)


class Seq2Seq(nn.Module):
  """Encoder–decoder with teacher forcing (Sutskever et al. 2014; Cho et al. 2014), attention optional.

  The encoder reads the source: token ids or real steps through an `rnn.RNN`
  (source='tokens' or 'sequence'), or one vector through a Dense layer
  (source='vector': the one-to-many architecture). The decoder starts from
  the encoder's final carries (the forward ones; from tanh(W v + b) for a
  vector), reads y_0 = BOS, y_1 … y_{N−1} and predicts y_1 … y_N = EOS. With
  `attention` = 'dot' or 'additive' each step also attends over the encoder
  states with its previous state s_{t−1} and feeds the context c_t to the cell
  and the output layer (Bahdanau et al. 2015).

  `__call__(targets_in_BxN, source, source_lengths_B=None)` → logits [B, N, V].
  With `decode=True` the decoder's carries are kept in the 'cache' collection
  and one target token is read per call, the protocol of train/sampling.py's
  `generate` (which passes the source as an extra input): the encoder is run
  again at each call, which costs O(S) per step, and its final carries start
  the decoder at the first call. The attention weights are sown as
  'intermediates'/'attention' [B, N, S].
  """
  vocab_size: int
  source: str = 'tokens'
  source_vocab_size: int | None = None
  cell: str = 'gru'
  features: int = 128
  num_layers: int = 1
  embed_dim: int = 64
  bidirectional_encoder: bool = False
  attention: str = 'none'
  attention_features: int = 128
  dropout_rate: float = 0.0
  unroll: int = 1
  dtype: Any = jnp.float32

  def __post_init__(self):
    _check('Seq2Seq', self.cell, self.features, self.num_layers, self.dropout_rate, self.unroll)
    _check_sizes('Seq2Seq', ('source_vocab_size',), vocab_size=self.vocab_size,
                 source_vocab_size=self.source_vocab_size, embed_dim=self.embed_dim,
                 attention_features=self.attention_features)
    if self.source not in ('tokens', 'sequence', 'vector'):
      raise ValueError(f"Seq2Seq source={self.source!r}; allowed: tokens, sequence, vector.")
    if self.attention not in ('none',) + attention_lib.SCORES:
      raise ValueError(f'Seq2Seq attention={self.attention!r}; allowed: none, '
                       f'{", ".join(attention_lib.SCORES)}.')
    if self.attention != 'none' and self.source == 'vector':
      raise ValueError('Seq2Seq attention needs a sequence to attend over; a vector source has '
                       "none, so set attention='none'.")
    if self.attention == 'dot' and self.bidirectional_encoder:
      raise ValueError("Dot-product attention needs encoder states as wide as the decoder's; a "
                       "bidirectional encoder doubles them, so use attention='additive'.")
    super().__post_init__()

  def _encode(self, source, source_lengths_B, train):
    """(encoder states [B, S, H′] or None, their mask [B, S], the decoder's initial carries)."""
    if source_lengths_B is not None:  # a list of lengths too: the mask indexes it
      source_lengths_B = jnp.asarray(source_lengths_B)
    batch = source.shape[0]
    if self.source == 'vector':
      v_BxD = source.reshape(batch, -1).astype(self.dtype)
      def start(name):
        return jnp.tanh(nn.Dense(self.features, dtype=self.dtype, param_dtype=jnp.float32,
                                 name=name)(v_BxD)).astype(jnp.float32)
      carries = tuple((start(f'start{layer}_c'), start(f'start{layer}_h')) if self.cell == 'lstm'
                      else start(f'start{layer}') for layer in range(self.num_layers))
      return None, jnp.zeros((batch, 1), bool), carries
    vocab = self.source_vocab_size or (self.vocab_size if self.source == 'tokens' else None)
    x_BxSxE = SequenceInput(vocab, self.embed_dim, self.dtype, name='source_input')(source)
    x_BxSxE = nn.Dropout(self.dropout_rate, deterministic=not train)(x_BxSxE)
    states_BxSxH, carries = rnn.RNN(self.cell, self.features, self.num_layers,
                                    self.bidirectional_encoder, self.dropout_rate, self.unroll,
                                    self.dtype, name='encoder')(x_BxSxE, source_lengths_B,
                                                                train=train)
    steps = states_BxSxH.shape[1]
    mask_BxS = (jnp.ones((batch, steps), bool) if source_lengths_B is None
                else jnp.arange(steps)[None] < source_lengths_B[:, None])
    return states_BxSxH, mask_BxS, tuple(layer[0] for layer in carries)

  @nn.compact
  def __call__(self, targets_in_BxN, source, source_lengths_B=None, *, train: bool = False,
               decode: bool = False):
    if jnp.ndim(targets_in_BxN) != 2 or jnp.ndim(source) < 1 or (
        jnp.shape(source)[0] != jnp.shape(targets_in_BxN)[0]):
      raise ValueError(f'Seq2Seq reads targets [B, N] and a source of the same batch B, got '
                       f'targets of shape {jnp.shape(targets_in_BxN)} and a source of shape '
                       f'{jnp.shape(source)}.')
    if self.attention != 'none' and jnp.shape(source)[1:2] == (0,):
      raise ValueError(f'Seq2Seq attention={self.attention!r} needs a source of at least one '
                       f'step to attend over, got shape {jnp.shape(source)}.')
    states_BxSxH, mask_BxS, carries = self._encode(source, source_lengths_B, train)
    if decode:
      is_initialized = self.has_variable('cache', 'carries')
      cached = self.variable('cache', 'carries', lambda: carries)
      started = self.variable('cache', 'started', lambda: jnp.zeros((), bool))
      if is_initialized:
        carries = jax.tree.map(lambda enc, mem: jnp.where(started.value, mem, enc), carries,
                               cached.value)
    y_BxNxE = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype, param_dtype=jnp.float32,
                       name='target_embed')(targets_in_BxN)
    y_BxNxE = nn.Dropout(self.dropout_rate, deterministic=not train)(y_BxNxE)
    keys_BxSxH = (states_BxSxH if states_BxSxH is not None
                  else jnp.zeros((y_BxNxE.shape[0], 1, 1), self.dtype))
    step = nn.scan(_DecoderStep, variable_broadcast='params', split_rngs={'params': False},
                   in_axes=(1, nn.broadcast, nn.broadcast), out_axes=1, unroll=self.unroll)
    score = None if self.attention == 'none' else self.attention
    carries, (out_BxNxO, weights_BxNxS) = step(
        self.cell, self.features, self.num_layers, score, self.attention_features, self.dtype,
        name='decoder')(carries, y_BxNxE, keys_BxSxH, mask_BxS)
    if decode and is_initialized:
      cached.value, started.value = carries, jnp.ones((), bool)
    if score is not None:
      self.sow('intermediates', 'attention', weights_BxNxS)
    out_BxNxO = nn.Dropout(self.dropout_rate, deterministic=not train)(out_BxNxO)
    return nn.Dense(self.vocab_size, dtype=self.dtype, param_dtype=jnp.float32,
                    name='output')(out_BxNxO).astype(jnp.float32)


class VectorToSequence(Seq2Seq):
  """One-to-many: `Seq2Seq` with a vector source (e.g. an image), no attention."""
  source: str = 'vector'
