"""Transformer blocks, GPT and BERT with every sub-layer live, against float64 numpy references
written out here from the papers' formulas:

  LayerNorm(x) = γ (x − μ) / √(σ² + ε) + β,   ε = 1e-6 (flax's default), over the width
  GELU(x) = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))   (Hendrycks & Gimpel 2016, the tanh form
            of GPT-2 and of BERT's original code; flax's `nn.gelu` default)
  FFN(x) = W₂ GELU(W₁ x + b₁) + b₂
  pre-LN (Xiong et al. 2020):   x ← x + f(LayerNorm(x)) per sub-layer f
  post-LN (Vaswani et al. 2017): x ← LayerNorm(x + f(x)) per sub-layer f
  decoder block: causal self-attention, then cross-attention over the memory, then FFN
  GPT (Radford et al. 2019): h⁰ = E[x_t] + P[t], blocks, LayerNorm, logits = h Eᵀ (or h W_out)
  BERT (Devlin et al. 2019): h⁰ = LayerNorm(E[x_t] + P[t] + S[s_t]), blocks,
                             z = LayerNorm(GELU(W h + b)), logits = z Eᵀ + c

Multi-head attention is `reference_mha` of test_attention.py (heads by a loop). The references
read the modules' parameters by name; every one is drawn with N(0, 0.3²) noise (LayerNorm scales
≠ 1, biases ≠ 0), so each changes the output (all but the key bias, which softmax cancels)."""

import flax
import flax.linen as nn
import jax
import numpy as np
import pytest

from models.transformer.bert import BERT, special_token_id
from models.transformer.blocks import TransformerBlock
from models.transformer.gpt import GPT
from tests.messages import one_sentence
from tests.models.test_attention import draw, padding_allowed, reference_mha

D, HEADS, MLP = 12, 3, 20  # head width 4; an MLP width that is not 4·D
B, T, S = 2, 5, 6  # batch, (target) steps, memory steps


def perturbed_params(module, seed, *args, **kwargs):
  """Every parameter of the module, by name and shape, drawn N(0, 0.3²) around its init's centre:
  LayerNorm scales 1 + noise, everything else (kernels, embeddings, biases) 0 + noise. Shapes
  come from `eval_shape`, which compiles nothing (an eager init costs seconds on two cores)."""
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.PRNGKey(0), *args, **kwargs)))
  flat = flax.traverse_util.flatten_dict(shapes['params'])
  rng = np.random.default_rng(seed)
  return flax.traverse_util.unflatten_dict({
      path: (float(path[-1] == 'scale') + rng.normal(size=a.shape) * 0.3).astype(np.float32)
      for path, a in sorted(flat.items())})


# ---- float64 references ----------------------------------------------------------------------

def reference_layer_norm(p, x_BxTxD, eps=1e-6):
  x = np.asarray(x_BxTxD, np.float64)
  mean_BxTx1 = x.mean(-1, keepdims=True)
  var_BxTx1 = ((x - mean_BxTx1) ** 2).mean(-1, keepdims=True)
  return (x - mean_BxTx1) / np.sqrt(var_BxTx1 + eps) * p['scale'] + p['bias']


def reference_gelu(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_ffn(p, x_BxTxD):
  h_BxTxF = reference_gelu(x_BxTxD @ p['hidden']['kernel'] + p['hidden']['bias'])
  return h_BxTxF @ p['output']['kernel'] + p['output']['bias']


def reference_block(params, x_BxTxD, memory_BxSxD=None, *, pre_norm, causal=False, allowed=None,
                    memory_allowed=None):
  """Self-attention (causal and/or `allowed` keys), cross-attention over the memory if given,
  then the FFN; each sub-layer wrapped pre-LN or post-LN."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  sublayers = [('self_attention', lambda h: reference_mha(
      p['self_attention'], h, h, allowed=allowed, causal=causal))]
  if memory_BxSxD is not None:
    memory = np.asarray(memory_BxSxD, np.float64)
    sublayers.append(('cross_attention', lambda h: reference_mha(
        p['cross_attention'], h, memory, allowed=memory_allowed)))
  sublayers.append(('mlp', lambda h: reference_ffn(p['mlp'], h)))
  x = np.asarray(x_BxTxD, np.float64)
  for name, f in sublayers:
    norm = p[f'{name}_norm']
    x = x + f(reference_layer_norm(norm, x)) if pre_norm else reference_layer_norm(norm, x + f(x))
  return x


def reference_gpt(params, tokens_BxT, *, num_layers, pre_norm, tie_embeddings):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  table_VxD = p['token_embed']['embed']['embedding']
  steps = tokens_BxT.shape[1]
  h = table_VxD[tokens_BxT] + p['position_embed']['embedding'][:steps][None]
  for layer in range(num_layers):
    h = reference_block(p[f'block{layer}'], h, pre_norm=pre_norm, causal=True)
  if pre_norm:
    h = reference_layer_norm(p['final_norm'], h)
  return h @ (table_VxD.T if tie_embeddings else p['output']['kernel'])


def reference_bert(params, tokens_BxT, segments_BxT, *, num_layers, pre_norm, pad_id):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  table_VxD = p['token_embed']['embed']['embedding']
  steps = tokens_BxT.shape[1]
  h = (table_VxD[tokens_BxT] + p['position_embed']['embedding'][:steps][None]
       + p['segment_embed'][segments_BxT])
  h = reference_layer_norm(p['embed_norm'], h)
  # Every query sees every key that is not [PAD], in both directions.
  allowed_Bx1x1xT = (tokens_BxT != pad_id)[:, None, None, :]
  for layer in range(num_layers):
    h = reference_block(p[f'block{layer}'], h, pre_norm=pre_norm, allowed=allowed_Bx1x1xT)
  if pre_norm:
    h = reference_layer_norm(p['final_norm'], h)
  head = p['head_transform']
  z = reference_layer_norm(p['head_norm'], reference_gelu(h @ head['kernel'] + head['bias']))
  return z @ table_VxD.T + p['output_bias']


def test_reference_pieces_match_their_textbook_values():
  # GELU(x) ≈ x Φ(x): Φ(1) = 0.841345, Φ(−1) = 0.158655; the tanh form is within 2e-4 of it.
  np.testing.assert_allclose(reference_gelu(np.array([1.0, -1.0, 0.0])),
                             [0.841345, -0.158655, 0.0], atol=2e-4)
  norm = reference_layer_norm({'scale': np.array([2.0, 2.0]), 'bias': np.array([1.0, 1.0])},
                              np.array([[[1.0, 3.0]]]), eps=0.0)
  np.testing.assert_allclose(norm, [[[-1.0, 3.0]]])  # ±1 standardised, times 2, plus 1


# ---- one block -------------------------------------------------------------------------------

# float32 against float64, outputs and logits of order 1–10: the largest differences measured
# are 6.1e-7 (blocks), 1.3e-6 (decoder blocks), 5.7e-7 (GPT) and 1.5e-6 (BERT); about 4× that.
TOL = dict(rtol=1e-6, atol=6e-6)

BLOCK_CASES = {
    # name: (pre_norm, causal, self-attention key lengths or None)
    # (Post-LN causal runs in the decoder-block test, pre-LN with padding in BERT's.)
    'pre_ln_causal': (True, True, None),  # a GPT block
    'post_ln_padding': (False, False, [5, 3]),  # a BERT block
}


@pytest.mark.parametrize('name', sorted(BLOCK_CASES))
def test_block_is_attention_then_gelu_ffn_with_residuals_and_layer_norms(name):
  pre_norm, causal, lengths = BLOCK_CASES[name]
  block = TransformerBlock(HEADS, MLP, pre_norm=pre_norm, causal=causal)
  x_BxTxD = draw((B, T, D), 1, scale=2.0)
  # Padding as BERT gives it: a mask [B, 1, 1, T] of valid keys.
  mask = None if lengths is None else padding_allowed(lengths, T)
  params = perturbed_params(block, 2, x_BxTxD, mask=mask)
  out_BxTxD = jax.jit(lambda params, x, mask: block.apply({'params': params}, x, mask=mask))(
      params, x_BxTxD, mask)
  expected_BxTxD = reference_block(params, x_BxTxD, pre_norm=pre_norm, causal=causal,
                                   allowed=mask)
  np.testing.assert_allclose(out_BxTxD, expected_BxTxD, **TOL)


@pytest.mark.parametrize('pre_norm', [True, False])
def test_decoder_block_is_causal_self_attention_then_cross_attention_then_ffn(pre_norm):
  block = TransformerBlock(HEADS, MLP, pre_norm=pre_norm, causal=True, cross_attention=True)
  y_BxTxD, memory_BxSxD = draw((B, T, D), 3, scale=2.0), draw((B, S, D), 4, scale=2.0)
  memory_mask = padding_allowed([S, 2], S)  # [B, 1, 1, S]: row 1 reads only 2 memory steps
  params = perturbed_params(block, 5, y_BxTxD, memory_BxSxD, memory_mask=memory_mask)
  out_BxTxD = jax.jit(lambda params, y, memory, memory_mask: block.apply(
      {'params': params}, y, memory, memory_mask=memory_mask))(
          params, y_BxTxD, memory_BxSxD, memory_mask)
  expected_BxTxD = reference_block(params, y_BxTxD, memory_BxSxD, pre_norm=pre_norm, causal=True,
                                   memory_allowed=memory_mask)
  np.testing.assert_allclose(out_BxTxD, expected_BxTxD, **TOL)


def test_a_decoder_block_without_the_encoder_memory_is_one_sentence():
  # Without the check, cross-attention would silently attend to the block's own input.
  block = TransformerBlock(HEADS, MLP, cross_attention=True)
  one_sentence(lambda: jax.eval_shape(block.init, jax.random.PRNGKey(0), np.zeros((B, T, D))),
               'A decoder block with cross_attention needs the encoder memory.')


# ---- whole models ----------------------------------------------------------------------------

V, LAYERS, MAX_LENGTH = 11, 2, 8


@pytest.mark.parametrize('tie_embeddings, pre_norm', [(True, True), (False, False)])
def test_gpt_logits_match_the_reference_forward_pass(tie_embeddings, pre_norm):
  model = GPT(V, num_layers=LAYERS, features=D, num_heads=HEADS, mlp_dim=MLP,
              max_length=MAX_LENGTH, positions='learned', pre_norm=pre_norm,
              tie_embeddings=tie_embeddings)
  tokens_BxT = np.random.default_rng(7).integers(0, V, size=(B, 7)).astype(np.int32)
  params = perturbed_params(model, 8, tokens_BxT)
  logits_BxTxV = jax.jit(lambda params, tokens: model.apply({'params': params}, tokens))(
      params, tokens_BxT)
  expected_BxTxV = reference_gpt(params, tokens_BxT, num_layers=LAYERS, pre_norm=pre_norm,
                                 tie_embeddings=tie_embeddings)
  assert logits_BxTxV.shape == (B, 7, V)
  np.testing.assert_allclose(logits_BxTxV, expected_BxTxV, **TOL)


@pytest.mark.parametrize('pre_norm', [False, True])
def test_bert_logits_match_the_reference_forward_pass(pre_norm):
  model = BERT(V, num_segments=2, num_layers=LAYERS, features=D, num_heads=HEADS, mlp_dim=MLP,
               max_length=MAX_LENGTH, positions='learned', dropout_rate=0.0, pre_norm=pre_norm)
  pad, cls, sep, mask = (special_token_id(V, token)
                         for token in ('[PAD]', '[CLS]', '[SEP]', '[MASK]'))
  tokens_BxT = np.array([[cls, 3, mask, 5, sep, 9, 2],
                         [cls, 7, 1, sep, mask, pad, pad]], np.int32)
  segments_BxT = np.array([[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 1]], np.int32)
  params = perturbed_params(model, 9, tokens_BxT, segments_BxT)
  logits_BxTxV = jax.jit(lambda params, tokens, segments: model.apply(
      {'params': params}, tokens, segments))(params, tokens_BxT, segments_BxT)
  expected_BxTxV = reference_bert(params, tokens_BxT, segments_BxT, num_layers=LAYERS,
                                  pre_norm=pre_norm, pad_id=pad)
  assert logits_BxTxV.shape == (B, 7, model.num_embeddings)
  np.testing.assert_allclose(logits_BxTxV, expected_BxTxV, **TOL)


@pytest.mark.parametrize('pre_norm', [True, False])
def test_dropout_falls_on_the_sublayer_outputs_never_on_the_residual_path(pre_norm):
  # Zero output projections (attention W^O, b^O and the FFN's W₂, b₂) make every sub-layer
  # f ≡ 0, so in training with dropout 0.5 a pre-LN block is still x + drop(0) = x exactly,
  # and a post-LN block LayerNorm(x + drop(0)) per sub-layer: dropout on the residual stream
  # would zero about half the entries and double the others.
  block = TransformerBlock(HEADS, MLP, dropout_rate=0.5, pre_norm=pre_norm, causal=True)
  x_BxTxD = draw((B, T, D), 6, scale=2.0)
  flat = flax.traverse_util.flatten_dict(perturbed_params(block, 7, x_BxTxD))
  flat = {path: np.zeros_like(a) if path[-2] == 'out' or path[-3:-1] == ('mlp', 'output') else a
          for path, a in flat.items()}
  params = flax.traverse_util.unflatten_dict(flat)
  out_BxTxD = jax.jit(lambda params, x: block.apply(
      {'params': params}, x, train=True, rngs={'dropout': jax.random.PRNGKey(0)}))(
          params, x_BxTxD)
  expected_BxTxD = np.asarray(x_BxTxD, np.float64)
  if not pre_norm:
    for name in ('self_attention_norm', 'mlp_norm'):
      expected_BxTxD = reference_layer_norm(params[name], expected_BxTxD)
  np.testing.assert_allclose(out_BxTxD, expected_BxTxD, **TOL)


def test_training_redraws_performer_features_in_the_self_attention():
  # Performer attention draws its random features from the 'features' stream in training (a
  # fixed draw at evaluation): the block passes its train flag on, so two stream keys give
  # two different training outputs.
  block = TransformerBlock(HEADS, MLP, causal=True, attention='performer',
                           attention_options={'num_features': 8, 'orthogonal': False})
  x_BxTxD = draw((B, T, D), 8)
  params = perturbed_params(block, 9, x_BxTxD)
  run = lambda params, key: block.apply({'params': params}, x_BxTxD, train=True,
                                        rngs={'features': key})
  first, second = jax.jit(jax.vmap(run, in_axes=(None, 0)))(
      params, jax.random.split(jax.random.PRNGKey(0)))
  assert np.abs(np.asarray(first) - np.asarray(second)).max() > 1e-3


# ---- options ---------------------------------------------------------------------------------

def _parameter_paths(module, *args, **kwargs):
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.PRNGKey(0), *args, **kwargs)))
  return set(flax.traverse_util.flatten_dict(shapes['params']))


def test_use_bias_false_leaves_no_bias_in_any_projection_or_layer_norm():
  # use_bias=False reaches every sub-layer: a LayerNorm, the cross-attention or BERT's head
  # transform built without it would keep a bias β or b (zero at init, then trained). BERT
  # keeps only its output bias c, by design.
  y_BxTxD, memory_BxSxD = draw((B, T, D), 3), draw((B, S, D), 4)
  tokens_BxT = np.zeros((B, T), np.int32)
  modules = {
      'decoder block': (TransformerBlock(HEADS, MLP, causal=True, cross_attention=True,
                                         use_bias=False), (y_BxTxD, memory_BxSxD)),
      'gpt': (GPT(V, num_layers=1, features=D, num_heads=HEADS, max_length=MAX_LENGTH,
                  tie_embeddings=False, use_bias=False), (tokens_BxT,)),
      'bert': (BERT(V, num_segments=2, num_layers=1, features=D, num_heads=HEADS,
                    max_length=MAX_LENGTH, pre_norm=True, use_bias=False), (tokens_BxT,)),
  }
  for name, (module, args) in modules.items():
    paths = _parameter_paths(module, *args)
    assert not [path for path in paths if path[-1] == 'bias'], name
    norms = {path[:-1] for path in paths if len(path) > 1 and path[-2].endswith('norm')}
    assert norms and all(norm + ('scale',) in paths for norm in norms), name
    if name == 'bert':
      assert ('output_bias',) in paths
  # Control: with biases, every LayerNorm and projection of the decoder block has one.
  with_bias = _parameter_paths(TransformerBlock(HEADS, MLP, causal=True, cross_attention=True),
                               y_BxTxD, memory_BxSxD)
  for layer in (('self_attention_norm',), ('cross_attention_norm',), ('mlp_norm',),
                ('cross_attention', 'query'), ('cross_attention', 'out'), ('mlp', 'hidden')):
    assert layer + ('bias',) in with_bias, layer
