"""Post-training batch statistics against a brute force computed without them: the
float64 model in training mode on the whole data set as one batch, whose BatchNorm
layers each normalise by (and record) the statistics of exactly that batch."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.mlp import MLP
from models.vision import resnet
from train import batch_stats

NUM_EXAMPLES, BATCH = 38, 8  # batches of 8, 8, 8, 8 and an uneven 6
# Every BatchNorm of models/vision/resnet.py updates ra ← 0.9·ra + 0.1·stat.
_MOMENTUM = 0.9
# Largest error allowed on the normalised scale, max(|Δμ| / σ, |Δσ²| / σ²), for float32
# passes against the float64 brute force (measured: 2.9e-7; Flax's own float32 training-mode
# statistics of the same single batch are off by 4.7e-7).
TOLERANCE = 5e-6


def _resnet(dtype=jnp.float32):
  # Stem BN, then two BNs in sequence per block; the second block's shortcut is a
  # strided 1×1 convolution + BN (a branch beside the main path): 6 BN layers.
  return resnet.ResNet(num_classes=3, stage_sizes=(1, 1), stage_widths=(4, 8), stem_width=4,
                       small_input_stem=True, dtype=dtype)


def _images():
  # Each batch of 8 has its own offset and spread, so per-batch statistics differ much
  # from the pooled ones (the bugs below must show).
  rng = np.random.default_rng(0)
  offset_N = np.repeat(np.linspace(-2.0, 2.0, -(-NUM_EXAMPLES // BATCH)), BATCH)[:NUM_EXAMPLES]
  scale_N = 1 + 0.5 * np.abs(offset_N)
  noise = rng.normal(size=(NUM_EXAMPLES, 8, 8, 2))
  return (noise * scale_N[:, None, None, None] + offset_N[:, None, None, None]).astype(np.float32)


def _brute_force(variables, x_NxHxWxC) -> dict:
  """{'layer/path': (mean, var)} of one float64 training-mode apply on all of `x`.

  The running averages start at 0, so each updated one is (1 − momentum)·stat.
  """
  with jax.enable_x64(True):
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float64), variables['batch_stats'])

    @jax.jit
    def train_mode_stats(params, x):
      _, updates = _resnet(jnp.float64).apply({'params': params, 'batch_stats': zeros}, x,
                                              train=True, mutable=['batch_stats'])
      return updates['batch_stats']
    ra = train_mode_stats(variables['params'], jnp.asarray(x_NxHxWxC, jnp.float64))
    return _by_layer(jax.tree.map(lambda r: np.asarray(r, np.float64) / (1 - _MOMENTUM), ra))


def _by_layer(stats) -> dict:
  flat = {jax.tree_util.keystr(path, simple=True, separator='/'): np.asarray(v, np.float64)
          for path, v in jax.tree_util.tree_flatten_with_path(stats)[0]}
  return {name[:-5]: (flat[name], flat[name[:-4] + 'var']) for name in flat if name.endswith('/mean')}


def _errors(stats, reference) -> dict:
  """{layer: max(|Δμ| / σ, |Δσ²| / σ²)} of `stats` against the `reference` (μ, σ²)."""
  ours = _by_layer(stats)
  assert sorted(ours) == sorted(reference)
  errors = {}
  for name, (mean, var) in reference.items():
    our_mean, our_var = ours[name]
    errors[name] = max(np.max(np.abs(our_mean - mean) / np.sqrt(var)),
                       np.max(np.abs(our_var - var) / var))
  return errors


def _variables(model, x, seed):
  """Random parameters of `model` (kernels ~ N(0, 1/fan_in), BN scale ~ 1 + N(0, 0.04), bias ~
  N(0, 0.04)) and its initial running statistics (μ = 0, σ² = 1), far from the data's. Drawn in
  NumPy: compiling the model's own random initialisation takes seconds."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init, jax.random.key(0), x[:1])

  def draw(path, leaf):
    name = jax.tree_util.keystr(path[-1:], simple=True)
    if name == 'kernel':
      return rng.normal(size=leaf.shape).astype(np.float32) / np.sqrt(np.prod(leaf.shape[:-1]))
    return (float(name == 'scale') + 0.2 * rng.normal(size=leaf.shape)).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, shapes['params'])
  stats = jax.tree_util.tree_map_with_path(
      lambda path, leaf: np.full(leaf.shape, float(path[-1].key == 'var'), np.float32),
      shapes['batch_stats'])
  return {'params': params, 'batch_stats': stats}


@pytest.fixture(scope='module')
def trained():
  x = _images()
  model = _resnet()
  variables = _variables(model, x, seed=0)
  return model, variables, x, _brute_force(variables, x)


def _batches(x, size=BATCH):
  return lambda: ({'input': x[i:i + size]} for i in range(0, len(x), size))


def test_matches_the_whole_data_set_as_one_batch(trained):
  model, variables, x, reference = trained
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x))
  errors = _errors(stats, reference)
  assert max(errors.values()) < TOLERANCE, errors
  assert info['examples'] == NUM_EXAMPLES and len(info['layers']) == 6 and info['converged']
  # Pass 6 at the latest (one per BN layer); the last pass changes nothing.
  assert info['passes'] <= 6 and info['changes'][-1] == 0.0


def test_masked_examples_are_left_out(trained):
  model, variables, x, reference = trained
  # Full batches of 8 padded with absurd rows whose mask is 0, as eval batches are padded.
  padded = np.concatenate([x, np.full((2,) + x.shape[1:], 1e3, np.float32)])
  mask = (np.arange(len(padded)) < NUM_EXAMPLES).astype(np.int32)
  batches = lambda: ({'input': padded[i:i + BATCH], 'mask': mask[i:i + BATCH]}
                     for i in range(0, len(padded), BATCH))
  stats, info = batch_stats.recompute_batch_stats(model, variables, batches)
  assert max(_errors(stats, reference).values()) < TOLERANCE
  assert info['examples'] == NUM_EXAMPLES


def test_max_examples_uses_only_the_first_examples(trained):
  model, variables, x, _ = trained
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x), max_examples=20)
  assert max(_errors(stats, _brute_force(variables, x[:20])).values()) < TOLERANCE
  assert info['examples'] == 20


def test_a_single_pass_is_exact_for_the_first_layer_only(trained):
  """The plausible bug of one pass: later layers saw inputs normalised by stale statistics."""
  model, variables, x, reference = trained
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x), max_passes=1)
  errors = _errors(stats, reference)
  assert info['passes'] == 1 and not info['converged']
  assert errors['stem_norm'] < TOLERANCE
  assert min(e for name, e in errors.items() if name != 'stem_norm') > 1e4 * TOLERANCE, errors


def test_averaging_per_batch_variances_is_measurably_wrong(trained, monkeypatch):
  """The plausible bug of pooling batches without the spread of their means: Σ M2_b / Σ n_b,
  the count-weighted average of the per-batch variances."""
  model, variables, x, reference = trained

  def merge_without_between_batch_term(totals, batch):
    count = totals.count + batch.count
    fraction = jnp.where(count > 0, batch.count / jnp.maximum(count, 1e-30), 0.0)
    return batch_stats._Moments(count, totals.mean + (batch.mean - totals.mean) * fraction,
                                totals.m2 + batch.m2)

  monkeypatch.setattr(batch_stats._Moments, 'merge', merge_without_between_batch_term)
  batch_stats._accumulate.clear_cache()  # retrace with the buggy merge
  try:
    stats, _ = batch_stats.recompute_batch_stats(model, variables, _batches(x))
  finally:
    monkeypatch.undo()
    batch_stats._accumulate.clear_cache()
  errors = _errors(stats, reference)
  # Already at the first layer, whose every variance comes out too small.
  assert min(errors.values()) > 1e4 * TOLERANCE, errors
  assert np.all(_by_layer(stats)['stem_norm'][1] < reference['stem_norm'][1])


def test_a_pass_that_changes_nothing_ends_the_loop(trained):
  model, variables, x, _ = trained
  exact, _ = batch_stats.recompute_batch_stats(model, variables, _batches(x))
  again, info = batch_stats.recompute_batch_stats(model, {**variables, 'batch_stats': exact},
                                                   _batches(x))
  assert info['passes'] == 1 and info['changes'] == [0.0] and info['converged']
  jax.tree.map(np.testing.assert_array_equal, again, exact)


def _mlp_with_two_batch_norms(x_NxD):
  model = MLP(features=(5, 4, 3), batch_norm=True)
  return model, _variables(model, x_NxD, seed=1)


def test_two_dense_batch_norms_against_numpy(trained):
  """An MLP Dense → BN → ReLU → Dense → BN → ReLU → Dense on [B, D], in float64 NumPy:
  BN_0's statistics are those of x W_0, BN_1's those of ReLU(BN_0(x W_0)) W_1."""
  _, _, x, _ = trained
  inputs_BxD = x.reshape(NUM_EXAMPLES, -1)
  model, variables = _mlp_with_two_batch_norms(inputs_BxD)
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(inputs_BxD))
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), variables['params'])
  h0 = inputs_BxD.astype(np.float64) @ params['Dense_0']['kernel']
  bn0 = params['BatchNorm_0']
  h1 = np.maximum(0, (h0 - h0.mean(0)) / np.sqrt(h0.var(0) + 1e-5) * bn0['scale'] + bn0['bias'])
  h1 = h1 @ params['Dense_1']['kernel']
  reference = {'BatchNorm_0': (h0.mean(0), h0.var(0)), 'BatchNorm_1': (h1.mean(0), h1.var(0))}
  assert max(_errors(stats, reference).values()) < TOLERANCE
  # Two BN layers: exact after two passes, without a third to confirm it.
  assert info['passes'] == 2 and info['converged']


class _PaddedSequenceNorm(nn.Module):
  """BatchNorm over the real steps of [B, T, C] sequences: its `mask` leaves the padding out."""

  @nn.compact
  def __call__(self, x_BxTxC, lengths_B, *, train=False):
    mask_BxTx1 = (jnp.arange(x_BxTxC.shape[1])[None, :] < lengths_B[:, None])[..., None]
    return nn.BatchNorm(use_running_average=not train)(x_BxTxC, mask=mask_BxTx1)


def test_a_batch_norm_mask_leaves_positions_out_and_the_change_is_on_the_normalised_scale():
  rng = np.random.default_rng(3)
  lengths = np.array([5, 1, 3, 4, 2, 5, 3], np.int32)
  # Channel means 2 and −1, standard deviations 0.5 and 2; the padding holds 100s, which
  # would dominate any statistic that counted it.
  x = rng.normal(size=(7, 5, 2)) * [0.5, 2.0] + [2.0, -1.0]
  valid = np.arange(5)[None, :] < lengths[:, None]
  x = np.where(valid[..., None], x, 100.0).astype(np.float32)
  model = _PaddedSequenceNorm()
  variables = {'batch_stats': {'BatchNorm_0': {'mean': np.zeros(2, np.float32),
                                               'var': np.ones(2, np.float32)}},
               'params': {'BatchNorm_0': {'scale': np.ones(2, np.float32),
                                          'bias': np.zeros(2, np.float32)}}}
  batches = lambda: ({'input': x[i:i + 3], 'length': lengths[i:i + 3]} for i in range(0, 7, 3))
  stats, info = batch_stats.recompute_batch_stats(
      model, variables, batches, model_inputs=lambda b: (b['input'], b['length']))
  real = x[valid].astype(np.float64)  # [23 real steps, C]
  mean, var = real.mean(0), real.var(0)
  np.testing.assert_allclose(stats['BatchNorm_0']['mean'], mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats['BatchNorm_0']['var'], var, rtol=1e-5)
  assert info['examples'] == 7 and info['passes'] == 1
  # From (μ, σ²) = (0, 1): the change is max(|μ| / √(σ² + ε), |σ² − 1| / (σ² + ε)).
  scale = var + 1e-5
  expected = max(np.max(np.abs(mean) / np.sqrt(scale)), np.max(np.abs(var - 1) / scale))
  np.testing.assert_allclose(info['changes'], [expected], rtol=1e-5)
  assert expected == np.max(np.abs(mean) / np.sqrt(scale))  # the means' change, here
  # Started at the exact means, the variances' change is the largest.
  start = {**variables, 'batch_stats': {'BatchNorm_0': {'mean': mean.astype(np.float32),
                                                        'var': np.ones(2, np.float32)}}}
  _, info = batch_stats.recompute_batch_stats(
      model, start, batches, model_inputs=lambda b: (b['input'], b['length']))
  np.testing.assert_allclose(info['changes'], [np.max(np.abs(var - 1) / scale)], rtol=1e-5)


class _TwoSideBySideNorms(nn.Module):
  """Two independent BN layers on the first two and the last two features; the first has ε = ½."""

  @nn.compact
  def __call__(self, x_BxD, *, train=False):
    wide = nn.BatchNorm(use_running_average=not train, epsilon=0.5, name='wide')(x_BxD[:, :2])
    narrow = nn.BatchNorm(use_running_average=not train, name='narrow')(x_BxD[:, 2:])
    return jnp.concatenate([wide, narrow], axis=-1)


def test_the_change_of_a_pass_is_the_largest_over_every_layer_with_its_own_epsilon():
  # The first layer's inputs (μ ≈ 10, σ ≈ 3) move far from (0, 1), the second's little; the
  # layers are independent, so one pass makes both exact and the second confirms it.
  rng = np.random.default_rng(6)
  x = (rng.normal(size=(10, 4)) * [3.0, 3.0, 1.0, 1.0] + [10.0, -8.0, 0.1, 0.0]).astype(np.float32)
  model = _TwoSideBySideNorms()
  variables = jax.tree.map(np.asarray, model.init(jax.random.key(0), x))
  _, info = batch_stats.recompute_batch_stats(model, variables, _batches(x, 4))
  expected = 0.0
  for columns, epsilon in ((slice(0, 2), 0.5), (slice(2, 4), 1e-5)):
    mean, var = x[:, columns].astype(np.float64).mean(0), x[:, columns].astype(np.float64).var(0)
    scale = var + epsilon
    expected = max(expected, np.max(np.abs(mean) / np.sqrt(scale)), np.max(np.abs(var - 1) / scale))
  np.testing.assert_allclose(info['changes'], [expected, 0.0], rtol=1e-5)
  assert info['passes'] == 2 and info['layers'] == ['narrow', 'wide']


def test_a_model_without_batch_norm_is_refused():
  model = MLP(features=(4, 3))
  variables = {'params': jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 6)))['params']}
  with pytest.raises(ValueError, match=r"^The model has no batch statistics to recompute: its "
                                       r"variables have no 'batch_stats' collection\.$"):
    batch_stats.recompute_batch_stats(model, variables, lambda: [np.zeros((2, 6), np.float32)])


def test_max_examples_counts_only_unmasked_examples(trained):
  """Masked padding rows inside the batches neither count towards max_examples nor enter the
  statistics: the result is that of the first 22 real examples (the 22nd follows a padding
  row of its batch)."""
  model, variables, x, _ = trained
  # A padding row (mask 0, absurd values) after every third real example.
  real_N = np.repeat(np.arange(NUM_EXAMPLES), [2 if i % 3 == 2 else 1 for i in range(NUM_EXAMPLES)])
  mask_N = np.ones(len(real_N), np.int32)
  mask_N[np.flatnonzero(np.diff(real_N) == 0) + 1] = 0
  padded = np.where(mask_N[:, None, None, None] == 1, x[real_N], 1e3).astype(np.float32)
  batches = lambda: ({'input': padded[i:i + BATCH], 'mask': mask_N[i:i + BATCH]}
                     for i in range(0, len(padded), BATCH))
  stats, info = batch_stats.recompute_batch_stats(model, variables, batches, max_examples=22)
  assert max(_errors(stats, _brute_force(variables, x[:22])).values()) < TOLERANCE
  assert info['examples'] == 22


def test_the_passes_never_exceed_the_number_of_batch_norm_layers(trained):
  _, _, x, _ = trained
  inputs_BxD = x.reshape(NUM_EXAMPLES, -1)
  model, variables = _mlp_with_two_batch_norms(inputs_BxD)
  _, info = batch_stats.recompute_batch_stats(model, variables, _batches(inputs_BxD), max_passes=10)
  assert info['passes'] == 2 and info['converged']


def test_statistics_no_layer_reads_are_kept_and_reported():
  x = np.random.default_rng(4).normal(size=(12, 6)).astype(np.float32)
  model, variables = _mlp_with_two_batch_norms(x)
  unused = {'mean': np.full(3, 7.0, np.float32), 'var': np.full(3, 2.0, np.float32)}
  variables = {**variables, 'batch_stats': {**variables['batch_stats'], 'Retired_0': unused}}
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x, 5))
  assert info['unused_layers'] == ['Retired_0'] and info['layers'] == ['BatchNorm_0', 'BatchNorm_1']
  jax.tree.map(np.testing.assert_array_equal, stats['Retired_0'], unused)
  h0 = x.astype(np.float64) @ np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  np.testing.assert_allclose(stats['BatchNorm_0']['mean'], h0.mean(0), rtol=1e-5, atol=1e-6)


class _NormTwice(nn.Module):

  @nn.compact
  def __call__(self, x, *, train=False):
    norm = nn.BatchNorm(use_running_average=not train)
    return norm(norm(x))


class _NormAcrossTheBatch(nn.Module):
  """Normalises x transposed: the BN layer's first axis is the features."""

  @nn.compact
  def __call__(self, x, *, train=False):
    return nn.BatchNorm(use_running_average=not train)(x.T)


def _variables_of(model, x):
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)
  return jax.tree.map(lambda s: np.ones(s.shape, np.float32), shapes)


_X = np.arange(24, dtype=np.float32).reshape(6, 4)


@pytest.mark.parametrize('case, message', [
    ('max_passes=0', 'max_passes must be a positive integer or None, got 0.'),
    ('max_examples=0', 'max_examples must be a positive integer or None, got 0.'),
    ('max_examples=2.5', 'max_examples must be a positive integer or None, got 2.5.'),
    ('growing batches', 'A batch of 6 examples follows a first batch of 3; the batches may shrink '
                        '(the last one) but not grow.'),
    ('growing by one', 'A batch of 6 examples follows a first batch of 5; the batches may shrink '
                       '(the last one) but not grow.'),
    ('all masked', 'The batches hold no example (every batch was empty or masked out).'),
    ('called twice', "The BatchNorm layer 'BatchNorm_0' is called more than once per apply, so its "
                     'population statistics are not defined.'),
    ('batch axis not first', "The BatchNorm layer 'BatchNorm_0' normalises an input of shape (4, 6) "
                             'whose first axis is not the batch of 6 examples.'),
    ('no batch norm called', 'The model calls no BatchNorm layer when applied with these arguments, '
                             'so there are no statistics to recompute.'),
])
def test_what_cannot_be_computed_is_refused_in_one_sentence(case, message):
  model = {'called twice': _NormTwice(), 'batch axis not first': _NormAcrossTheBatch()}.get(
      case, MLP(features=(3, 2), batch_norm=True))
  variables = _variables_of(model, _X)
  if case == 'no batch norm called':  # the statistics of a model with batch norm
    model = MLP(features=(3, 2))
    variables = {**_variables_of(model, _X), 'batch_stats': variables['batch_stats']}
  options, batches = {}, [{'input': _X}]
  if case.startswith('max_'):
    name, value = case.split('=')
    options[name] = float(value) if '.' in value else int(value)
  elif case.startswith('growing'):
    batches = [{'input': _X[:3 if case == 'growing batches' else 5]}, {'input': _X}]
  elif case == 'all masked':
    batches = [{'input': _X, 'mask': np.zeros(6, np.int32)}]
  with pytest.raises(ValueError) as info:
    batch_stats.recompute_batch_stats(model, variables, lambda: iter(batches), **options)
  assert str(info.value) == message


def test_the_loop_stops_at_the_first_pass_within_the_tolerance(trained):
  """With the third pass's change as the tolerance, the loop ends after that pass (a change
  equal to the tolerance is within it), the first two having changed more."""
  model, variables, x, _ = trained
  _, exact = batch_stats.recompute_batch_stats(model, variables, _batches(x))
  changes = exact['changes']  # not monotone: 5.4, 18.2, 1.02, 26.5, 0.73, 0 when measured
  assert exact['passes'] > 3 and min(changes[:2]) > changes[2]
  _, info = batch_stats.recompute_batch_stats(model, variables, _batches(x), tolerance=changes[2])
  assert info['passes'] == 3 and info['changes'] == changes[:3] and info['converged']


class _NormInAMethod(nn.Module):
  """Batch norm only in `features`; `__call__` returns its input."""

  def setup(self):
    self.norm = nn.BatchNorm()

  def __call__(self, x, *, train=False):
    return x

  def features(self, x, *, train=False):
    return self.norm(x, use_running_average=not train)


def test_the_statistics_of_the_method_applied():
  model = _NormInAMethod()
  x = np.random.default_rng(5).normal(size=(10, 3)).astype(np.float32) * [1.0, 2.0, 3.0]
  variables = jax.tree.map(np.asarray, model.init(jax.random.key(0), x, method='features'))
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x, 4), method='features')
  np.testing.assert_allclose(stats['norm']['mean'], x.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats['norm']['var'], x.astype(np.float64).var(0), rtol=1e-5)
  assert info['layers'] == ['norm'] and info['examples'] == 10


def test_moments_of_inputs_far_from_zero_keep_their_variance():
  """Two-pass moments: inputs 1000 + N(0, 0.1²) in float32, where Σx² − n·μ² (each term about
  10⁷) would lose the variance (10⁻²) to rounding."""
  model = _NormInAMethod()
  x = (1000 + 0.1 * np.random.default_rng(7).normal(size=(12, 3))).astype(np.float32)
  variables = jax.tree.map(np.asarray, model.init(jax.random.key(0), x, method='features'))
  stats, _ = batch_stats.recompute_batch_stats(model, variables, _batches(x, 5), method='features')
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(stats['norm']['var'], x64.var(0), rtol=1e-3)
  np.testing.assert_allclose(stats['norm']['mean'], x64.mean(0), rtol=1e-7)


def test_the_last_batch_is_padded_with_real_examples():
  """The padding rows of a short last batch are copies of its first example: a model input
  that divides by each example's spread gives no NaN (0 / 0 for rows of zeros), which would
  spoil the statistics although the rows weigh 0."""
  model = _NormInAMethod()
  x = np.random.default_rng(8).normal(size=(10, 3)).astype(np.float32) + [0.0, 1.0, 2.0]
  variables = jax.tree.map(np.asarray, model.init(jax.random.key(0), x, method='features'))
  standardise = lambda b: (b['input'] / jnp.std(b['input'], axis=1, keepdims=True),)
  stats, _ = batch_stats.recompute_batch_stats(model, variables, _batches(x, 4),
                                               model_inputs=standardise, method='features')
  inputs = x.astype(np.float64) / x.astype(np.float64).std(axis=1, keepdims=True)
  np.testing.assert_allclose(stats['norm']['mean'], inputs.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats['norm']['var'], inputs.var(0), rtol=1e-5)


class _TrainingByDefault(nn.Module):
  """A model whose `train` defaults to True: the passes must still apply it in inference mode."""

  @nn.compact
  def __call__(self, x, *, train=True):
    return nn.BatchNorm(use_running_average=not train)(x)


def test_the_passes_apply_the_model_with_train_false_by_default():
  model = _TrainingByDefault()
  x = np.random.default_rng(9).normal(size=(6, 2)).astype(np.float32) * [1.0, 3.0]
  ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
  variables = {'params': {'BatchNorm_0': {'scale': ones, 'bias': zeros}},
               'batch_stats': {'BatchNorm_0': {'mean': zeros, 'var': ones}}}
  stats, info = batch_stats.recompute_batch_stats(model, variables, _batches(x, 4))
  np.testing.assert_allclose(stats['BatchNorm_0']['var'], x.astype(np.float64).var(0), rtol=1e-5)
  assert info['passes'] == 1


class _UseRunningAverageByPosition(nn.Module):
  """Passes `use_running_average` positionally: the recorded input is the first argument."""

  @nn.compact
  def __call__(self, x, *, train=False):
    return nn.BatchNorm()(x, not train)


def test_the_statistics_are_of_the_first_positional_argument():
  model = _UseRunningAverageByPosition()
  x = np.random.default_rng(10).normal(size=(6, 2)).astype(np.float32) * [1.0, 3.0] + [0.5, -1.0]
  variables = jax.tree.map(np.asarray, model.init(jax.random.key(0), x))
  stats, _ = batch_stats.recompute_batch_stats(model, variables, _batches(x, 4))
  np.testing.assert_allclose(stats['BatchNorm_0']['mean'], x.astype(np.float64).mean(0), rtol=1e-5)
  np.testing.assert_allclose(stats['BatchNorm_0']['var'], x.astype(np.float64).var(0), rtol=1e-5)
