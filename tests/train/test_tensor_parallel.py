"""'tensor' mode (Megatron-style tensor parallelism on a data × model mesh) on 8 simulated devices:
ten steps of a tiny GPT with dropout equal a 1-device run on 4×2 and 2×4 meshes; the attention
and MLP kernels, their Adam moments and their EMA are really split over 'model' (Q/K/V and the
MLP's first layer by output, the attention output and second layer by input); the activations'
logical constraints reach the compiled step; a model that names no axes runs replicated; a
4×2 checkpoint restores bit-identically on 2×4, on 1 device and in 'jit' mode; and wrong
settings stop with one sentence."""

import pytest

from tests.subprocess_util import run_python

_CHILD = '''
import functools, json, tempfile
import flax.linen as nn
import jax, jax.numpy as jnp, numpy as np, ml_collections
from data import tokenizers
from experiments.configs import digits_mlp
from models.transformer.gpt import GPT
from train import checkpoint, loop, optim, parallel, step, tasks
from train.state import init_train_state

VOCAB = 17

class Unnamed(nn.Module):  # declares no logical axis names
  @nn.compact
  def __call__(self, tokens_BxT, *, train=False):
    return nn.Dense(VOCAB)(jnp.tanh(nn.Embed(VOCAB, 16)(tokens_BxT)))

def batches():
  # x_{t+1} = 3 x_t + 1 mod 17 from a random start: learnable, so the loss falls. Rows end
  # after 4-8 targets (token-weighted loss).
  rng = np.random.default_rng(0)
  for _ in range(10):
    tokens = [rng.integers(0, VOCAB, size=16)]
    for _ in range(8):
      tokens.append((3 * tokens[-1] + 1) % VOCAB)
    lengths = rng.integers(4, 9, size=16)
    weights = (np.arange(8)[None, :] < lengths[:, None]).astype(np.float32)
    yield {'tokens': np.stack(tokens, 1).astype(np.int32), 'weights': weights}

def setup(model_kind, mode, num_devices, model_parallelism=None, use_bias=False):
  par = parallel.Parallel(mode, parallel.make_mesh(num_devices, model_parallelism))
  if model_kind == 'gpt':
    # No biases: the key bias's gradient is 0 up to rounding (softmax ignores a score added
    # to every key), which Adam's g / sqrt(v) would blow up to whole steps of noise.
    model = GPT(vocab_size=VOCAB, num_layers=2, features=32, num_heads=4, mlp_dim=64,
                max_length=8, dropout_rate=0.1, use_bias=use_bias)
  else:
    model = Unnamed()
  meta = {'tokenizer': tokenizers.CharTokenizer(list('abcdefghijklmnopq')),
          'token_units': np.ones(VOCAB, np.float32), 'unit': 'char'}
  task = tasks.build('language_model', meta, sample_length=0)
  tx, lr = optim.make_optimizer(ml_collections.ConfigDict(dict(
      name='adamw', learning_rate=1e-2, weight_decay=0.1, grad_clip_norm=1.0,
      schedule='warmup_cosine', warmup_steps=3)), 10)
  data = list(batches())
  init_fn = lambda rng: init_train_state(model, task, tx, rng, data[0], ema=True,
                                         logical_axes=True)
  abstract = par.abstract_state(init_fn, jax.random.PRNGKey(0))
  return par, model, task, tx, lr, data, init_fn, abstract

def train(model_kind, mode, num_devices, model_parallelism=None):
  par, model, task, tx, lr, data, init_fn, abstract = setup(model_kind, mode, num_devices,
                                                            model_parallelism)
  state = par.init_state(init_fn, jax.random.PRNGKey(0))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=task, tx=tx, learning_rate_fn=lr, ema_decay=0.9),
      abstract)
  lowered = train_step.lower(state, par.shard_batch(data[0])).as_text()
  losses = []
  for batch in data:
    state, metrics = train_step(state, par.shard_batch(batch))
    total, weight = metrics['totals']['loss']
    losses.append(float(total) / float(weight))
  eval_step = par.compile_eval_step(functools.partial(step.eval_step, model=model, task=task),
                                    abstract)
  total, weight = eval_step(state, {**data[0], 'mask': np.ones(16, np.int32)}, np.int32(0))['loss']
  eval_loss = float(total) / float(weight)
  return par, state, losses, eval_loss, lowered.count('sharding_constraint')

def max_diff(a, b):
  """(the largest |a - b| over all leaves, the leaf it is in)."""
  diffs = jax.tree_util.tree_map_with_path(lambda path, x, y: [
      float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))),
      jax.tree_util.keystr(path)], a, b)
  return max(jax.tree.leaves(diffs, is_leaf=lambda x: isinstance(x, list)))

def layout(x):
  return {'spec': str(x.sharding.spec), 'shard': list(x.addressable_shards[0].data.shape),
          'shape': list(x.shape)}

def error_of(fn):
  try:
    fn()
  except ValueError as e:
    return str(e)
  return None

out = {'devices': jax.device_count()}
for kind in ('gpt', 'unnamed'):
  _, reference, ref_losses, ref_eval, ref_constraints = train(kind, 'jit', 1)
  out[f'{kind}/jit1'] = {'constraints': ref_constraints, 'loss_decreased': ref_losses[-1] < ref_losses[0]}
  for data_size, model_size in ((4, 2), (2, 4)) if kind == 'gpt' else ((4, 2),):
    par, state, losses, eval_loss, constraints = train(kind, 'tensor', 8, model_size)
    block = state.params.get('block0')
    mu = state.opt_state[1][0].mu.get('block0')  # (clip, adamw): adamw's scale_by_adam moments
    out[f'{kind}/{data_size}x{model_size}'] = {
        'mesh': dict(par.mesh.shape), 'step': int(state.step),
        'max_state_diff': max_diff(state, reference),
        'max_loss_diff': max(abs(a - b) for a, b in zip(losses, ref_losses)),
        'eval_loss_diff': abs(eval_loss - ref_eval),
        'constraints': constraints,
        'specs': sorted({str(x.sharding.spec) for x in jax.tree.leaves(state)}),
        'layouts': {} if kind != 'gpt' else {
            'query': layout(block['self_attention']['query']['kernel']),
            'value': layout(block['self_attention']['value']['kernel']),
            'out': layout(block['self_attention']['out']['kernel']),
            'mlp_hidden': layout(block['mlp']['hidden']['kernel']),
            'mlp_output': layout(block['mlp']['output']['kernel']),
            'embed': layout(state.params['token_embed']['embed']['embedding']),
            'norm': layout(block['mlp_norm']['scale']),
            'mu_query': layout(mu['self_attention']['query']['kernel']),
            'mu_mlp_hidden': layout(mu['mlp']['hidden']['kernel']),
            'ema_mlp_output': layout(state.ema_params['block0']['mlp']['output']['kernel'])}}
    if kind == 'gpt' and model_size == 2:
      saved_state = state

# Biases: split with a kernel split by output, replicated after one split by input (read from
# an abstract state: no step compiled).
biased = setup('gpt', 'tensor', 8, 2, use_bias=True)[-1].params['block0']
out['bias_layouts'] = {name: {'spec': str(x.sharding.spec), 'shard': list(x.sharding.shard_shape(x.shape)),
                              'shape': list(x.shape)}
                       for name, x in (('query', biased['self_attention']['query']['bias']),
                                       ('out', biased['self_attention']['out']['bias']),
                                       ('mlp_hidden', biased['mlp']['hidden']['bias']),
                                       ('mlp_output', biased['mlp']['output']['bias']))}

# A checkpoint of the 4x2 state restores on other meshes and modes with identical values.
workdir = tempfile.mkdtemp()
ckpt = checkpoint.Checkpointer(workdir, every_steps=1, keep=1)
ckpt.save(10, saved_state, {'iterator': {'next_index': 160}}, force=True)
ckpt.close()
saved = jax.device_get(saved_state)
for name, mode, num_devices, model_parallelism in (
    ('tensor_2x4', 'tensor', 8, 4), ('tensor_1x1', 'tensor', 1, 1), ('jit_8', 'jit', 8, None)):
  par, *_, abstract = setup('gpt', mode, num_devices, model_parallelism)
  ckpt = checkpoint.Checkpointer(workdir, every_steps=1, keep=1)
  ckpt.check_compatible(abstract)
  restored, data_state, restored_step = ckpt.restore_latest(abstract)
  ckpt.close()
  out[f'restore/{name}'] = {
      'step': restored_step, 'data': data_state,
      'identical': all(np.asarray(a).tobytes() == np.asarray(b).tobytes()
                       for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved))),
      'structure_equal': jax.tree.structure(restored) == jax.tree.structure(saved),
      'devices': sorted({len(x.sharding.device_set) for x in jax.tree.leaves(restored)}),
      'query': layout(restored.params['block1']['self_attention']['query']['kernel'])}

# One-sentence errors.
out['errors'] = {
    'indivisible_devices': error_of(lambda: parallel.make_mesh(8, 3)),
    'heads_not_divisible': error_of(lambda: setup('gpt', 'tensor', 8, 8)),
    'unknown_logical_axis': error_of(lambda: parallel.Parallel(
        'tensor', parallel.make_mesh(8, 2), logical_axis_rules=(('batch', 'data'), ('head', 'model')))),
    'unknown_mesh_axis': error_of(lambda: parallel.Parallel(
        'tensor', parallel.make_mesh(8, 2), logical_axis_rules=(('heads', 'tensor'),))),
    'one_d_mesh': error_of(lambda: parallel.Parallel('tensor', parallel.make_mesh(8)))}

def setup_error(global_batch_size=64, **options):
  config = digits_mlp.get_config()
  config.data.data_dir = tempfile.mkdtemp()
  config.global_batch_size = global_batch_size
  config.parallel.update(options)
  return error_of(lambda: loop.setup(config, tempfile.mkdtemp()))

out['errors']['setup_indivisible'] = setup_error(mode='tensor', model_parallelism=3)
out['errors']['setup_model_parallelism_without_tensor'] = setup_error(mode='jit', model_parallelism=2)
out['errors']['setup_batch'] = setup_error(6, mode='tensor', model_parallelism=2)
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def results():
  # ~55 s of CPU; the generous timeout is for a machine busy with other work.
  return run_python(_CHILD, devices=8, fast_compile=True, timeout=1800)


@pytest.mark.parametrize('kind, mesh', [('gpt', '4x2'), ('gpt', '2x4'), ('unnamed', '4x2')])
def test_tensor_mode_matches_single_device(results, kind, mesh):
  assert results['devices'] == 8
  assert results[f'{kind}/jit1']['loss_decreased']
  r = results[f'{kind}/{mesh}']
  data_size, model_size = map(int, mesh.split('x'))
  assert r['mesh'] == {'data': data_size, 'model': model_size} and r['step'] == 10
  # Params, AdamW moments and EMA after 10 steps with dropout 0.1 (the same masks on every
  # mesh); every step's loss; the mean loss of an eval batch. Measured: states <= 5e-7,
  # losses <= 1.5e-6, eval <= 5e-7.
  assert r['max_state_diff'][0] < 1e-5, r
  assert r['max_loss_diff'] < 1e-5, r
  assert r['eval_loss_diff'] < 1e-5, r


@pytest.mark.parametrize('mesh', ['4x2', '2x4'])
def test_megatron_split_of_attention_and_mlp(results, mesh):
  model_size = int(mesh.split('x')[1])
  layouts = results[f'gpt/{mesh}']['layouts']
  if mesh == '4x2':
    layouts = {**layouts, **{f'{name}_bias': x for name, x in results['bias_layouts'].items()}}

  def split(name, spec, axis):
    assert layouts[name]['spec'] == spec, (name, layouts[name])
    expected = list(layouts[name]['shape'])
    if axis is not None:
      expected[axis] //= model_size
    assert layouts[name]['shard'] == expected, (name, layouts[name])

  # Q/K/V [D, N, H] and the MLP's first layer [D, F] split by output (with their biases);
  # W^O [N, H, D] and W_2 [F, D] by input (their biases, added after the sum, replicated);
  # AdamW's moments and the EMA like their parameters; embedding and norms replicated.
  split('query', "P(None, 'model', None)", 1)
  split('value', "P(None, 'model', None)", 1)
  split('out', "P('model', None, None)", 0)
  split('mlp_hidden', "P(None, 'model')", 1)
  split('mlp_output', "P('model', None)", 0)
  split('mu_query', "P(None, 'model', None)", 1)
  split('mu_mlp_hidden', "P(None, 'model')", 1)
  split('ema_mlp_output', "P('model', None)", 0)
  split('embed', 'P()', None)
  split('norm', 'P()', None)
  if mesh == '4x2':
    split('query_bias', "P('model', None)", 0)
    split('mlp_hidden_bias', "P('model',)", 0)
    split('out_bias', 'P()', None)
    split('mlp_output_bias', 'P()', None)


def test_activation_constraints_reach_the_compiled_step(results):
  # Per block q, k, v, the attention output, the MLP hidden layer and the block output; the
  # embeddings and logits: 14 in the forward pass, more in the backward; none in 'jit' mode.
  assert results['gpt/jit1']['constraints'] == 0
  assert results['gpt/4x2']['constraints'] >= 14
  # A model that names no axes: every leaf replicated, nothing constrained.
  assert results['unnamed/4x2']['specs'] == ['P()']
  assert results['unnamed/4x2']['constraints'] == 0


@pytest.mark.parametrize('target', ['tensor_2x4', 'tensor_1x1', 'jit_8'])
def test_tensor_checkpoint_restores_on_other_meshes_and_modes(results, target):
  # Saved on the 4x2 mesh after the 10 steps above.
  r = results[f'restore/{target}']
  assert r['step'] == 10 and r['data'] == {'iterator': {'next_index': 160}}
  assert r['structure_equal'] and r['identical']
  expected = {'tensor_2x4': ("P(None, 'model', None)", [32, 1, 8], [8]),
              'tensor_1x1': ("P(None, 'model', None)", [32, 4, 8], [1]),
              'jit_8': ('P()', [32, 4, 8], [8])}[target]
  assert (r['query']['spec'], r['query']['shard'], r['devices']) == expected


def test_one_sentence_errors(results):
  errors = results['errors']
  for name, message in errors.items():
    assert message and '\n' not in message and message.endswith('.'), (name, message)
  assert errors['indivisible_devices'] == (
      'parallel.model_parallelism=3 must be a positive integer that divides the 8 devices.')
  assert errors['setup_indivisible'] == errors['indivisible_devices']
  assert errors['heads_not_divisible'].startswith(
      "The mesh axis 'model' of size 8 does not divide dimension 1 ('heads', size 4) of "
      'params/block0/self_attention/key/kernel;')
  assert errors['unknown_logical_axis'].startswith(
      "parallel.logical_axis_rules names the unknown logical axis 'head'; known: ")
  assert errors['unknown_mesh_axis'].startswith(
      "parallel.logical_axis_rules maps 'heads' to 'tensor'; allowed: 'data', 'model'")
  assert "('data',)" in errors['one_d_mesh']
  assert errors['setup_batch'] == (
      'config.global_batch_size=6 is not divisible by the 4 rows of the 4 x 2 (data x model) mesh.')
  assert errors['setup_model_parallelism_without_tensor'].startswith(
      "parallel.model_parallelism=2 needs parallel.mode='tensor'")
