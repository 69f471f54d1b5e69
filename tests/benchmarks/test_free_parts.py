"""benchmarks/free_parts.py removes exactly the part it names from the compiled step, and only
while its variant is built."""

from tests.subprocess_util import run_python

# The benchmark scripts each define absl flags of the same names, so each test imports one in
# its own process.


def test_each_freed_part_leaves_the_compiled_gradient_step_and_nothing_else():
  result = run_python('''
      import json
      import jax
      import jax.numpy as jnp
      import flax.linen as nn
      from benchmarks import free_parts, hlo_dots
      from models.attention import core
      from models.transformer import blocks, gpt
      from models.vision import vit

      originals = (core.dot_product_attention, nn.gelu, blocks.layer_norm, gpt.layer_norm,
                   vit.layer_norm)
      tokens = jnp.arange(2 * 16).reshape(2, 16) % 11

      def compiled(parts):
        with free_parts.freed(parts):
          model = gpt.GPT(vocab_size=11, num_layers=1, features=32, num_heads=4, max_length=16,
                          use_bias=False)
          params = model.init(jax.random.PRNGKey(0), tokens)
          loss = lambda p: jnp.mean(model.apply(p, tokens) ** 2)
          text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
        products = hlo_dots.products(text)
        return {'dense': sum(not p.batched for p in products),
                'batched': sum(p.batched for p in products),
                'tanh': text.count(' tanh('), 'rsqrt': text.count(' rsqrt('),
                'params': len(jax.tree_util.tree_leaves(params))}

      variants = {'+'.join(v) or 'none': compiled(v)
                  for v in [(), ('attention',), ('gelu',), ('layernorm',),
                            ('attention', 'gelu', 'layernorm')]}
      restored = [a is b for a, b in zip(originals, (core.dot_product_attention, nn.gelu,
                                                      blocks.layer_norm, gpt.layer_norm,
                                                      vit.layer_norm))]
      q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 5, 3, 4)) for i in range(3))
      freed_output = free_parts._free_attention(q, k, v, causal=True)
      try:
        free_parts._free_attention(q, k[:, :2], v[:, :2])
        cross = None
      except ValueError as e:
        cross = str(e)
      bad = []
      for text in ('attention+softmax', 'gelu+gelu', ''):
        try:
          free_parts.parse_variant(text)
        except ValueError as e:
          bad.append(str(e))
      print(json.dumps({'variants': variants, 'restored': restored,
                        'freed_is_v': bool(jnp.array_equal(freed_output, v)), 'cross': cross,
                        'bad': bad, 'parsed': free_parts.parse_variant('gelu+attention')}))
      ''')
  v = result['variants']
  none = v['none']
  # The step as it is: the layer's per-head scores, weights·values and their four gradients'
  # products; GELU's tanh; each LayerNorm's 1/σ.
  assert none['batched'] == 6 and none['tanh'] > 0 and none['rsqrt'] > 0
  # Free attention: no per-head product left, every dense one (the projections, the MLP, the
  # output layer and all their gradients) kept.
  assert v['attention'] == {**none, 'batched': 0}
  assert v['gelu'] == {**none, 'tanh': 0}
  # Free LayerNorms: no 1/σ left, and no scale parameters (the block's two and the final one).
  assert v['layernorm'] == {**none, 'rsqrt': 0, 'params': none['params'] - 3}
  assert v['attention+gelu+layernorm'] == {**v['layernorm'], 'batched': 0, 'tanh': 0}
  assert all(result['restored'])
  assert result['freed_is_v']
  assert 'needs self-attention' in result['cross'] and '(2, 5, 3, 4)' in result['cross']
  assert ["'softmax'" in result['bad'][0], 'twice' in result['bad'][1],
          "''" in result['bad'][2]] == [True, True, True]
  assert result['parsed'] == ['gelu', 'attention']
