"""Transformer encoder–decoder for translation (Vaswani et al. 2017, "Attention Is All You Need").

  encoder   h⁰_s = √D·E_src[x_s] + P[s],                 s = 0 … S−1
            hˡ = EncoderBlock_l(hˡ⁻¹),  l = 1 … L       (bidirectional, valid source keys only)
  decoder   g⁰_t = √D·E_tgt[y_t] + P[t],                 t = 0 … N−1
            gˡ = DecoderBlock_l(gˡ⁻¹, hᴸ),  l = 1 … L   (causal; cross-attention to hᴸ)
            logits_t = gᴸ_t E_tgtᵀ (tied, §3.4) or gᴸ_t W_out

The blocks (models/transformer/blocks.py) are post-LN as in the paper,

  EncoderBlock(X):     Z = LayerNorm(MHA(X, X, X) + X);   E = LayerNorm(FFN(Z) + Z)
  DecoderBlock(Y, E):  Z = LayerNorm(MHA(Y, Y, Y) + Y)    (causal)
                       Z′ = LayerNorm(MHA(Z, E, E) + Z);  D = LayerNorm(FFN(Z′) + Z′)

or pre-LN (`pre_norm`, Xiong et al. 2020): x + f(LayerNorm(x)) per sub-layer and
one LayerNorm after the last block of each stack. The embeddings are multiplied
by √D (§3.4) and summed with the positions P (sinusoidal, §3.5, or a learned
table; rotary and ALiBi act in the self-attentions instead, see
models/attention/positions.py); dropout follows the sums and every sub-layer (§5.4). Source position s
is a key of the encoder's self-attention and of the decoder's cross-attention
only when s < source length, so padding never changes a logit.

Token ids are those of models/sequence/rnn_models.py: 0 pads, 1 is BOS, 2 is EOS;
the decoder reads BOS y_1 … y_{N−1} and position t predicts y_{t+1}.
With `decode=True` (train/sampling.py's protocol) the decoder's self-attention
keeps its keys and values in the 'cache' collection, with the position of the
next target token, and reads one target token per call. The encoder and the
cross-attention keys and values are recomputed at every call, so each decoded
token costs one encoder pass over the S source positions on top of the O(t)
cached self-attention, as `Seq2Seq` recomputes its recurrent encoder.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.attention.core import IN_ATTENTION, key_mask, padding_mask
from models.transformer.blocks import TokenEmbedding, TransformerBlock, layer_norm, output_logits
from models.transformer.gpt import check_transformer_options, decode_start, embed_positions


def _embed(module, embed: TokenEmbedding, tokens_BxT, start, train):
  """√D·E[tokens] + P[start …], then dropout (Vaswani et al. 2017, §3.4, §3.5, §5.4)."""
  x_BxTxD = embed(tokens_BxT) * jnp.sqrt(module.features).astype(module.dtype)
  x_BxTxD = embed_positions(x_BxTxD, module.positions, module.max_length, start)
  x_BxTxD = nn.Dropout(module.dropout_rate, deterministic=not train)(x_BxTxD)
  return nn.with_logical_constraint(x_BxTxD, ('batch', 'length', 'embed'))


class TransformerEncoder(nn.Module):
  """Source tokens [B, S] → memory [B, S, D] (see module doc); `mask` [B, 1, 1, S]: valid keys."""
  vocab_size: int
  num_layers: int
  features: int
  num_heads: int
  mlp_dim: int
  max_length: int
  positions: str
  dropout_rate: float
  pre_norm: bool
  use_bias: bool
  dtype: Any

  @nn.compact
  def __call__(self, source_BxS, mask=None, *, train: bool = False):
    embed = TokenEmbedding(self.vocab_size, self.features, self.dtype, name='source_embed')
    x_BxSxD = _embed(self, embed, source_BxS, 0, train)
    positions = self.positions if self.positions in IN_ATTENTION else 'none'
    for layer in range(self.num_layers):
      x_BxSxD = TransformerBlock(self.num_heads, self.mlp_dim, self.dropout_rate, self.pre_norm,
                                 causal=False, positions=positions, use_bias=self.use_bias,
                                 dtype=self.dtype, name=f'block{layer}')(x_BxSxD, mask=mask,
                                                                         train=train)
    if self.pre_norm:
      x_BxSxD = layer_norm(self.use_bias, 'final_norm')(x_BxSxD)
    return x_BxSxD


class TransformerDecoder(nn.Module):
  """Target tokens [B, N] and memory [B, S, D] → logits [B, N, V] (see module doc)."""
  vocab_size: int
  num_layers: int
  features: int
  num_heads: int
  mlp_dim: int
  max_length: int
  positions: str
  dropout_rate: float
  pre_norm: bool
  tie_embeddings: bool
  use_bias: bool
  dtype: Any

  @nn.compact
  def __call__(self, targets_in_BxN, memory_BxSxD, memory_mask=None, *, train: bool = False,
               decode: bool = False):
    start = decode_start(self, targets_in_BxN.shape[1]) if decode else 0
    embed = TokenEmbedding(self.vocab_size, self.features, self.dtype, name='target_embed')
    y_BxNxD = _embed(self, embed, targets_in_BxN, start, train)
    positions = self.positions if self.positions in IN_ATTENTION else 'none'
    for layer in range(self.num_layers):
      y_BxNxD = TransformerBlock(self.num_heads, self.mlp_dim, self.dropout_rate, self.pre_norm,
                                 causal=True, cross_attention=True, positions=positions,
                                 use_bias=self.use_bias, dtype=self.dtype,
                                 name=f'block{layer}')(y_BxNxD, memory_BxSxD,
                                                       memory_mask=memory_mask, train=train,
                                                       decode=decode)
    if self.pre_norm:
      y_BxNxD = layer_norm(self.use_bias, 'final_norm')(y_BxNxD)
    return output_logits(y_BxNxD, embed, self.tie_embeddings, self.vocab_size, self.dtype)


class TransformerSeq2Seq(nn.Module):
  """Encoder–decoder Transformer (see module doc), called like `Seq2Seq`:

  `__call__(targets_in_BxN, source_BxS, source_lengths_B=None, *, train, decode)`
  → float32 logits [B, N, V]; without lengths every source position is valid.

  Attributes:
    vocab_size: V, the target vocabulary (e.g. 128 ASCII codes).
    source_vocab_size: the source vocabulary (default: V, the same ASCII ids).
    num_layers: L, the blocks of the encoder and of the decoder each.
    features, num_heads: width D and N heads.
    mlp_dim: the FFN's hidden width (default 4·D).
    max_length: the learned position table's size, so the longest source or target
      with learned positions (sinusoidal, rotary and ALiBi ones extrapolate).
    positions: 'sinusoidal' (the paper), 'learned', 'rotary', 'alibi' or 'none'.
    dropout_rate: dropout on the embedding sums and after every sub-layer.
    pre_norm: False (the default): post-LN blocks, as the paper;
      True: pre-LN blocks and a final LayerNorm per stack (Xiong et al. 2020).
    tie_embeddings: logits = g E_tgtᵀ (the paper); else a separate output layer.
    use_bias: biases in the projections and LayerNorms.
    dtype: compute dtype; parameters, LayerNorms and logits are float32.
  """
  vocab_size: int
  source_vocab_size: int | None = None
  num_layers: int = 2
  features: int = 128
  num_heads: int = 4
  mlp_dim: int | None = None
  max_length: int = 64
  positions: str = 'sinusoidal'
  dropout_rate: float = 0.0
  pre_norm: bool = False
  tie_embeddings: bool = True
  use_bias: bool = True
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_transformer_options('TransformerSeq2Seq', self, self.vocab_size)
    source_vocab = self.source_vocab_size
    if source_vocab is not None and (not isinstance(source_vocab, int) or source_vocab < 1):
      raise ValueError(f'TransformerSeq2Seq source_vocab_size must be None (the target '
                       f'vocabulary) or a positive integer, got {source_vocab!r}.')
    super().__post_init__()

  def _stack_options(self) -> dict:
    return dict(num_layers=self.num_layers, features=self.features, num_heads=self.num_heads,
                mlp_dim=self.mlp_dim or 4 * self.features, max_length=self.max_length,
                positions=self.positions, dropout_rate=self.dropout_rate,
                pre_norm=self.pre_norm, use_bias=self.use_bias, dtype=self.dtype)

  @nn.compact
  def __call__(self, targets_in_BxN, source_BxS, source_lengths_B=None, *, train: bool = False,
               decode: bool = False):
    if not jnp.issubdtype(source_BxS.dtype, jnp.integer) or source_BxS.ndim != 2:
      raise ValueError(f'TransformerSeq2Seq reads a source of token ids [batch, length], got '
                       f'{source_BxS.dtype} of shape {source_BxS.shape}.')
    if jnp.ndim(targets_in_BxN) != 2 or jnp.shape(targets_in_BxN)[0] != source_BxS.shape[0]:
      raise ValueError(f'TransformerSeq2Seq reads targets [batch, length] of the source\'s batch '
                       f'{source_BxS.shape[0]}, got targets of shape {jnp.shape(targets_in_BxN)}.')
    memory_mask = None
    if source_lengths_B is not None:
      memory_mask = key_mask(padding_mask(source_lengths_B, source_BxS.shape[1]))
    memory_BxSxD = TransformerEncoder(self.source_vocab_size or self.vocab_size,
                                      **self._stack_options(), name='encoder')(
                                          source_BxS, memory_mask, train=train)
    return TransformerDecoder(self.vocab_size, tie_embeddings=self.tie_embeddings,
                              **self._stack_options(), name='decoder')(
                                  targets_in_BxN, memory_BxSxD, memory_mask, train=train,
                                  decode=decode)
