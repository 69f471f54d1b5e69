"""Transformer blocks (Vaswani et al. 2017), post-LN or pre-LN.

Post-LN, the original (each sub-layer f wrapped as LayerNorm(x + f(x))):

  EncoderBlock(X):     Z = LayerNorm(MHA(X, X, X) + X);  E = LayerNorm(FFN(Z) + Z)
  DecoderBlock(Y, E):  Z = LayerNorm(MHA(Y, Y, Y) + Y)                 (causal)
                       Z′ = LayerNorm(MHA(Z, E, E) + Z)                 (cross-attention)
                       D = LayerNorm(FFN(Z′) + Z′)

Pre-LN (Xiong et al. 2020; GPT-2): x + f(LayerNorm(x)) for each sub-layer and one
LayerNorm after the last block; its gradients at initialisation are well
scaled, so it trains without warmup at learning rates where post-LN diverges.

FFN(x) = W_2 GELU(W_1 x + b_1) + b_2, hidden width `mlp_dim` (Hendrycks & Gimpel
2016 for GELU, in its tanh form ½x(1 + tanh(√(2/π)(x + 0.044715x³))), as in BERT's and
GPT-2's code). Dropout follows every sub-layer (residual dropout, §5.4); the
attention weights themselves are not dropped, so the exact path stays one
`jax.nn.dot_product_attention` call.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.attention.core import MultiHeadAttention
from models.attention.core import tokens_first


def layer_norm(use_bias: bool, name: str | None = None) -> nn.LayerNorm:
  """LayerNorm over the width, in float32, with logically named parameters."""
  return nn.LayerNorm(use_bias=use_bias, dtype=jnp.float32, param_dtype=jnp.float32, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)))


def output_logits(x_BxTxD, embed: 'TokenEmbedding', tie_embeddings: bool, vocab_size: int,
                  dtype) -> jax.Array:
  """Logits [B, T, V] in float32: x Eᵀ with the embedding table (tied, Press & Wolf 2017) or a
  separate output layer 'output' of the caller (call it inside a compact method)."""
  if tie_embeddings:
    logits_BxTxV = embed.attend(x_BxTxD.astype(dtype))
  else:
    logits_BxTxV = nn.Dense(vocab_size, use_bias=False, dtype=dtype, param_dtype=jnp.float32,
                            name='output', kernel_init=nn.with_logical_partitioning(
                                nn.initializers.lecun_normal(), ('embed', 'vocab')))(x_BxTxD)
  return nn.with_logical_constraint(logits_BxTxV.astype(jnp.float32), ('batch', 'length', 'vocab'))


class FeedForward(nn.Module):
  """W_2 drop(GELU(W_1 x + b_1)) + b_2; the hidden axis is named 'mlp' (split by tensor
  parallelism). `hidden_dropout_rate` drops hidden units in training (ViT's App. B.1; GPT-2's
  and BERT's code drop none, the default)."""
  mlp_dim: int
  use_bias: bool = True
  dtype: Any = jnp.float32
  hidden_dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x_BxTxD, *, train: bool = False):
    def dense(features, names, name):
      return nn.Dense(features, use_bias=self.use_bias, dtype=self.dtype, param_dtype=jnp.float32,
                      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[1:]),
                      name=name)
    # Dense layers on one token axis: see models.attention.core.tokens_first.
    h_MxF = nn.gelu(dense(self.mlp_dim, ('embed', 'mlp'), 'hidden')(tokens_first(x_BxTxD)))
    h_MxF = nn.Dropout(self.hidden_dropout_rate, deterministic=not train)(h_MxF)
    h_BxTxF = nn.with_logical_constraint(h_MxF.reshape(*x_BxTxD.shape[:-1], self.mlp_dim),
                                         ('batch', 'length', 'mlp'))
    y_MxD = dense(x_BxTxD.shape[-1], ('mlp', 'embed'), 'output')(tokens_first(h_BxTxF))
    return y_MxD.reshape(x_BxTxD.shape)


class TransformerBlock(nn.Module):
  """One encoder block, or one decoder block when `cross_attention` is set (see module doc).

  `__call__(x, memory=None, *, mask=None, memory_mask=None, train, decode)`:
  `mask` [B, 1 | N, T, T] restricts self-attention (padding; the other attention kinds
  than 'exact' take only a key mask [B, 1, 1, T]), `causal` makes it
  causal, `memory` [B, S, D] is what cross-attention reads and `memory_mask`
  [B, 1, 1, S] its valid positions. `attention` and `attention_options` choose the
  self-attention's kind (models/attention/kinds.py); cross-attention is exact.
  `mlp_hidden_dropout` also drops the MLP's hidden units at `dropout_rate` (ViT).
  """
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  pre_norm: bool = True
  causal: bool = False
  cross_attention: bool = False
  positions: str = 'none'
  attention: str = 'exact'
  attention_options: Any = ()
  max_length: int | None = None
  use_bias: bool = True
  dtype: Any = jnp.float32
  mlp_hidden_dropout: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, memory_BxSxD=None, *, mask=None, memory_mask=None,
               train: bool = False, decode: bool = False):
    drop = nn.Dropout(self.dropout_rate, deterministic=not train)

    def sublayer(x, f, name):
      if self.pre_norm:
        return x + drop(f(layer_norm(self.use_bias, f'{name}_norm')(x)))
      return layer_norm(self.use_bias, f'{name}_norm')(x + drop(f(x)))

    self_attention = MultiHeadAttention(
        self.num_heads, positions=self.positions, attention=self.attention,
        attention_options=self.attention_options, max_length=self.max_length,
        use_bias=self.use_bias, dtype=self.dtype, name='self_attention')
    x_BxTxD = sublayer(x_BxTxD, lambda h: self_attention(
        h, mask=mask, causal=self.causal, decode=decode, train=train), 'self_attention')
    if self.cross_attention:
      if memory_BxSxD is None:
        raise ValueError('A decoder block with cross_attention needs the encoder memory.')
      cross_attention = MultiHeadAttention(self.num_heads, use_bias=self.use_bias,
                                           dtype=self.dtype, name='cross_attention')
      x_BxTxD = sublayer(x_BxTxD, lambda h: cross_attention(h, memory_BxSxD, mask=memory_mask),
                         'cross_attention')
    mlp = FeedForward(self.mlp_dim, self.use_bias, self.dtype,
                      self.dropout_rate if self.mlp_hidden_dropout else 0.0, name='mlp')
    x_BxTxD = sublayer(x_BxTxD, lambda h: mlp(h, train=train), 'mlp')
    return nn.with_logical_constraint(x_BxTxD, ('batch', 'length', 'embed'))


class TokenEmbedding(nn.Module):
  """Token embedding E [V, D] (N(0, 0.02²) as in GPT-2 and BERT) with `attend` for tied outputs."""
  vocab_size: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embed = nn.Embed(self.vocab_size, self.features, dtype=self.dtype, param_dtype=jnp.float32,
                          embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                                      ('vocab', 'embed')))

  def __call__(self, tokens_BxT):
    if jnp.ndim(tokens_BxT) != 2 or not jnp.issubdtype(jnp.result_type(tokens_BxT), jnp.integer):
      raise ValueError(f'A Transformer reads token ids as integers of shape [batch, length], got '
                       f'{jnp.result_type(tokens_BxT)} of shape {jnp.shape(tokens_BxT)}.')
    return self.embed(tokens_BxT)

  def attend(self, x_BxTxD):
    """Logits x Eᵀ [B, T, V] (the output layer tied to the embedding, Press & Wolf 2017)."""
    return self.embed.attend(x_BxTxD)
