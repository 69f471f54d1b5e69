"""benchmarks/free_parts.py removes exactly the part it names from the compiled step, and only
while its variant is built."""

from tests.subprocess_util import run_python

# The benchmark scripts each define absl flags of the same names, so each test imports one in
# its own process.


def test_each_freed_part_leaves_the_compiled_gradient_step_and_nothing_else():
  result = run_python('''
      import json, sys
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
      # Every model module that uses the blocks' LayerNorm, found by looking, is freed of it.
      import importlib, pkgutil, models
      for info in pkgutil.walk_packages(models.__path__, 'models.'):
        importlib.import_module(info.name)
      users = sorted(name for name, module in sys.modules.items()
                     if name.startswith('models.')
                     and getattr(module, 'layer_norm', None) is blocks.layer_norm)
      with free_parts.freed(('layernorm',)):
        freed_users = sorted(name for name in users
                             if sys.modules[name].layer_norm is free_parts._identity_layer_norm)
      print(json.dumps({'variants': variants, 'restored': restored, 'users': users,
                        'freed_users': freed_users,
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
  assert 'models.vision.vit' in result['users'] and result['freed_users'] == result['users']
  assert result['freed_is_v']
  assert 'needs self-attention' in result['cross'] and '(2, 5, 3, 4)' in result['cross']
  assert ["'softmax'" in result['bad'][0], 'twice' in result['bad'][1],
          "''" in result['bad'][2]] == [True, True, True]
  assert result['parsed'] == ['gelu', 'attention']


def test_free_parts_prints_each_variants_rounds_and_the_median_time_each_part_takes():
  # Three rounds of made-up step times, each measured while its variant's parts are freed; the
  # step as it is takes 100, 300 and 120 ms (median 120 ms), gelu freed 90, 80 and 300 ms
  # (90 ms), attention and gelu freed 60, 50 and 70 ms (60 ms).
  result = run_python('''
      import contextlib, io, json, types
      import flax.linen as nn
      from absl import flags
      from benchmarks import free_parts, train_step
      from models.attention import core
      flags.FLAGS(['free_parts.py', '--config=experiments/configs/shakespeare_char_gpt.py',
                   '--parts=gelu,attention+gelu', '--rounds=3', '--steps=7'])
      free_parts.runs = types.SimpleNamespace(setup=lambda config, workdir: types.SimpleNamespace(
          lock=types.SimpleNamespace(release=lambda: None)))
      train_step.matmul_peak_flops = lambda: (1e11, 2048)
      times = {'': [0.1, 0.3, 0.12], 'gelu': [0.09, 0.08, 0.3],
               'attention+gelu': [0.06, 0.05, 0.07]}
      seen = []
      def measure_step(config, steps):
        freed = [part for part, is_freed in (
            ('attention', core.dot_product_attention is free_parts._free_attention),
            ('gelu', float(nn.gelu(3.0)) == 3.0)) if is_freed]
        label = '+'.join(freed)
        seen.append([label, steps, flags.FLAGS.products_alone, not train_step._LOOP_FREE_FLOPS])
        train_step._LOOP_FREE_FLOPS[label] = 1  # what a real count of this variant would keep
        return {'step_seconds': times[label].pop(0), 'flops': 2e9,
                'products': [types.SimpleNamespace(batched=b) for b in (False, True, False)]}
      train_step.measure_step = measure_step
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        free_parts.main([])
      print(json.dumps({'printed': printed.getvalue().splitlines(), 'seen': seen}))
      ''')
  # Round by round, every variant in turn; each measured afresh (no loop-free FLOPs kept from
  # another variant), with --steps and without timing the products alone.
  assert result['seen'] == [[v, 7, False, True] for v in ('', 'gelu', 'attention+gelu')] * 3
  assert result['printed'][1:3] == [
      'matmul peak (float32, 2048x2048): 100.00 GFLOP/s',
      # 2e9 FLOP in 100 ms: 2e10 FLOP/s, 20% of the peak.
      'round 1, the step as it is: 10.00 steps/s, 2e+09 FLOP/step, 20.00% of the matmul peak; '
      '3 products (1 with batch dimensions)']
  assert result['printed'][-3:] == [
      'median over 3 round(s): the step as it is 120.0 ms',
      '  gelu free: 90.0 ms, so it takes 30.0 ms (25.0% of the step)',
      '  attention+gelu free: 60.0 ms, so it takes 60.0 ms (50.0% of the step)']
