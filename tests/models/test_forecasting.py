"""Forecasters (WaveNet stacks as TCNs) against NumPy equations, their causality, the
autoregressive forecast against a brute-force loop, and the baselines against hand
computations."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from models.sequence import forecasting
from tests.messages import one_sentence

SMALL = dict(channels=4, kernel_size=2, dilations=(1, 2))  # receptive field 4


def _random_variables(module, seed):
  """Variables of `module`'s structure drawn by NumPy (`jax.eval_shape` of `init`, nothing
  compiled): kernels N(0, 1/fan_in), and biases N(0, 0.3²) rather than zeros, so a dropped
  or misplaced bias shows."""
  shapes = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct((2, 4), jnp.float32))
  rng = np.random.default_rng(seed)

  def draw(leaf):
    scale = 0.3 if len(leaf.shape) == 1 else 1 / np.sqrt(np.prod(leaf.shape[:-1]))
    return rng.normal(scale=scale, size=leaf.shape).astype(np.float32)
  return jax.tree.map(draw, shapes)


def _series(batch=2, length=20, seed=0):
  return jax.random.normal(jax.random.key(seed), (batch, length))


def _model(kind, **options):
  if kind == 'shifted':
    return forecasting.ShiftedConvForecaster(**{**SMALL, **options})
  return forecasting.PooledConvForecaster(**{**SMALL, 'horizon': 3, **options})


def _init(module, x_BxT, seed=1):
  """Random variables; the parameters depend neither on the input length nor on `pooling`
  or `predict_change`, so models that differ only there share them."""
  del x_BxT
  return _init_cached(type(module), getattr(module, 'horizon', None), seed)


@functools.lru_cache(maxsize=None)
def _init_cached(cls, horizon, seed):
  return _random_variables(cls(**SMALL) if horizon is None else cls(**SMALL, horizon=horizon), seed)


@functools.lru_cache(maxsize=None)
def _jitted(module, method):
  # One compilation per model and shape instead of one per operation and shape.
  return jax.jit(functools.partial(module.apply, method=method))


def _apply(module, variables, x_BxT, method=None):
  return _jitted(module, method)(variables, x_BxT)


# NumPy reference of the equations ----------------------------------------------------------

def _conv(x_BxTxC, kernel_KxCxF, bias_F, dilation):
  """y_t = Σ_j W_j x_{t−j·d} + b with x_s = 0 for s < 0; W_j = kernel[k−1−j]."""
  k = kernel_KxCxF.shape[0]
  y = np.zeros(x_BxTxC.shape[:2] + (kernel_KxCxF.shape[-1],)) + bias_F
  for t in range(x_BxTxC.shape[1]):
    for j in range(k):
      if t - j * dilation >= 0:
        y[:, t] += x_BxTxC[:, t - j * dilation] @ kernel_KxCxF[k - 1 - j]
  return y


def _reference_shifted(params, x_BxT, dilations, predict_change=True):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  stack = p['stack']
  dense = lambda z, name, tree=stack: z @ tree[name]['kernel'] + tree[name]['bias']
  x = np.asarray(x_BxT, np.float64)
  u = np.concatenate([np.zeros_like(x[:, :1]), np.diff(x, axis=1)], 1) if predict_change else x
  h = dense(u[..., None], 'Dense_0')
  skip = np.zeros_like(h)
  for block, dilation in enumerate(dilations):
    conv = stack[f'CausalConv1D_{block}']['Conv_0']
    f, g = np.split(_conv(h, conv['kernel'], conv['bias'], dilation), 2, axis=-1)
    s = dense(np.tanh(f) / (1 + np.exp(-g)), f'Dense_{block + 1}')
    h, skip = h + s, skip + s
  e = np.maximum(dense(np.maximum(skip, 0), f'Dense_{len(dilations) + 1}'), 0)
  y = (e @ p['head']['kernel'] + p['head']['bias'])[..., 0]
  return y + x if predict_change else y


@pytest.mark.parametrize('predict_change', [True, False])
def test_shifted_model_equals_numpy_wavenet_equations(predict_change):
  # Fails if the gate swaps tanh and σ, a residual or skip term is dropped, the input is
  # not differenced, or the last value is not added back.
  model = _model('shifted', predict_change=predict_change)
  x_BxT = _series()
  variables = _init(model, x_BxT)
  expected = _reference_shifted(variables['params'], x_BxT, SMALL['dilations'], predict_change)
  np.testing.assert_allclose(_apply(model, variables, x_BxT), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('pooling', ['mean', 'max', 'last'])
def test_pooled_model_equals_pooled_stack_features_through_its_head(pooling):
  model = _model('pooled', pooling=pooling)
  x_BxT = _series()
  variables = _init(model, x_BxT)
  params = variables['params']
  u_BxTx1 = np.diff(np.asarray(x_BxT), axis=1, prepend=np.asarray(x_BxT)[:, :1])[..., None]
  e_BxTxC = np.asarray(forecasting.CausalConvStack(4, 2, (1, 2)).apply(
      {'params': params['stack']}, u_BxTx1), np.float64)
  pooled = {'mean': e_BxTxC.mean(1), 'max': e_BxTxC.max(1), 'last': e_BxTxC[:, -1]}[pooling]
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['head'])
  expected = pooled @ head['kernel'] + head['bias'] + np.asarray(x_BxT)[:, -1:]
  out = _apply(model, variables, x_BxT)
  assert out.shape == (2, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_pooled_model_without_predict_change_reads_the_values_and_adds_nothing_back():
  model = _model('pooled', pooling='last', predict_change=False)
  x_BxT = _series()
  variables = _init(model, x_BxT)
  params = variables['params']
  e_BxTxC = np.asarray(forecasting.CausalConvStack(4, 2, (1, 2)).apply(
      {'params': params['stack']}, np.asarray(x_BxT)[..., None]), np.float64)
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['head'])
  np.testing.assert_allclose(_apply(model, variables, x_BxT),
                             e_BxTxC[:, -1] @ head['kernel'] + head['bias'], rtol=1e-4, atol=1e-4)


def test_stacks_repeat_the_dilations_and_widen_the_receptive_field():
  # num_stacks = 2 runs the blocks with dilations 1, 2, 1, 2; with k = 3 the stack reads
  # R = 2 · (2·1 + 2·2) + 1 = 13 inputs.
  model = forecasting.ShiftedConvForecaster(channels=4, kernel_size=3, dilations=(1, 2),
                                            num_stacks=2)
  x_BxT = _series()
  variables = _random_variables(model, seed=2)
  y_BxT = np.asarray(_apply(model, variables, x_BxT))
  np.testing.assert_allclose(y_BxT, _reference_shifted(variables['params'], x_BxT, (1, 2, 1, 2)),
                             rtol=1e-4, atol=1e-4)
  assert model.receptive_field == 13
  # x_4 is in Δx_4 and Δx_5, which reach positions 4 … 5 + R − 1 (with these weights no ReLU
  # is dead on the way; with some, e.g. seed 5, a few positions do not change).
  y2 = np.asarray(_apply(model, variables, x_BxT.at[:, 4].add(2.0)))
  changed = np.flatnonzero(np.any(np.abs(y2 - y_BxT) > 1e-6, axis=0))
  assert changed.tolist() == list(range(4, 4 + 13 + 1))


@pytest.mark.parametrize('kind', ['shifted', 'pooled'])
def test_dropout_acts_in_training_only(kind):
  # At inference the stack with dropout computes what the same parameters compute without it
  # (the NumPy equations for the shifted model); in training some gated activations are dropped.
  model, plain = _model(kind, dropout_rate=0.3), _model(kind)
  x_BxT = _series()
  variables = _init(plain, x_BxT)
  expected = _apply(plain, variables, x_BxT)
  if kind == 'shifted':
    np.testing.assert_allclose(expected, _reference_shifted(variables['params'], x_BxT,
                                                            SMALL['dilations']), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_apply(model, variables, x_BxT), expected, rtol=1e-6, atol=1e-6)
  trained = jax.jit(lambda v, x: model.apply(v, x, train=True, rngs={'dropout': jax.random.key(2)}))(
      variables, x_BxT)
  assert np.max(np.abs(np.asarray(trained) - np.asarray(expected))) > 1e-3


# Causality -------------------------------------------------------------------------------

@pytest.mark.parametrize('pooling', ['mean', 'max', 'last'])
def test_pooled_forecast_depends_only_on_the_past(pooling):
  model = _model('pooled', pooling=pooling)
  x_BxT = _series()
  variables = _init(model, x_BxT)
  per_position = _apply(model, variables, x_BxT, method='per_position')
  assert per_position.shape == (2, 20, 3)
  # The last position is the forecast from the whole window ...
  np.testing.assert_allclose(per_position[:, -1], _apply(model, variables, x_BxT), rtol=1e-5,
                             atol=1e-5)
  # ... position t is the forecast from the window cut after t ...
  np.testing.assert_allclose(per_position[:, 5], _apply(model, variables, x_BxT[:, :6]),
                             rtol=1e-5, atol=1e-5)
  for t in (0, 5, 11):
    # ... so perturbing the future leaves it unchanged, and perturbing x_t does not.
    future = _apply(model, variables, x_BxT.at[:, t + 1:].add(3.0), method='per_position')
    np.testing.assert_array_equal(future[:, :t + 1], per_position[:, :t + 1])
    present = _apply(model, variables, x_BxT.at[:, t].add(3.0), method='per_position')
    assert not np.allclose(present[:, t], per_position[:, t], atol=1e-3)


def test_pooled_next_value_is_the_horizon_one_forecast_of_the_cut_window():
  # With H = 3, position t's forecast of x_{t+1} is the first of the H values forecast from
  # x_{≤t}: `__call__` on the window cut after t.
  model = _model('pooled')
  x_BxT = _series()
  variables = _init(model, x_BxT)
  next_value = _apply(model, variables, x_BxT, method='next_value')
  assert next_value.shape == (2, 20)
  for t in (5, 19):
    np.testing.assert_allclose(next_value[:, t], _apply(model, variables, x_BxT[:, :t + 1])[:, 0],
                               rtol=1e-5, atol=1e-5)


def test_shifted_model_is_causal_per_position_with_its_receptive_field():
  model = _model('shifted')
  x_BxT = _series()
  variables = _init(model, x_BxT)
  y_BxT = np.asarray(_apply(model, variables, x_BxT))
  receptive = model.receptive_field
  assert receptive == 4
  for s in (3, 10, 17):
    y2 = np.asarray(_apply(model, variables, x_BxT.at[:, s].add(2.0)))
    changed = np.flatnonzero(np.any(np.abs(y2 - y_BxT) > 1e-6, axis=0))
    # x_s is in Δx_s and Δx_{s+1}, which the stack's R = 4 inputs carry to positions
    # s … s + 1 + R − 1: never to an earlier one.
    assert changed.tolist() == list(range(s, min(s + receptive + 1, 20)))


@pytest.mark.parametrize('kind', ['pooled', 'shifted'])
def test_predict_change_moves_forecasts_with_the_level(kind):
  model = _model(kind)
  x_BxT = _series()
  variables = _init(model, x_BxT)
  np.testing.assert_allclose(_apply(model, variables, x_BxT + 5.0),
                             _apply(model, variables, x_BxT) + 5.0, rtol=1e-5, atol=1e-4)
  raw = _model(kind, predict_change=False)
  raw_variables = _init(raw, x_BxT)
  assert not np.allclose(_apply(raw, raw_variables, x_BxT + 5.0),
                         _apply(raw, raw_variables, x_BxT) + 5.0, atol=1e-2)


# Autoregressive forecasts ----------------------------------------------------------------

def _brute_force(step_fn, history_BxT, num_steps):
  """The growing history, one model call per step, in a Python loop."""
  history = np.asarray(history_BxT, np.float32)
  out = []
  for _ in range(num_steps):
    y_B = np.asarray(step_fn(jnp.asarray(history)), np.float32)
    out.append(y_B)
    history = np.concatenate([history, y_B[:, None]], axis=1)
  return np.stack(out, axis=1)


def test_forecast_of_the_shifted_model_equals_a_python_loop():
  model = _model('shifted')
  history_BxT = _series(length=8)
  variables = _init(model, history_BxT)
  expected = _brute_force(lambda h: _apply(model, variables, h)[:, -1], history_BxT, 5)
  got = forecasting.forecast(model, variables, history_BxT, 5)
  assert got.shape == (2, 5)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # A window of the last 6 values sees everything the receptive field (5 values) reaches.
  windowed = forecasting.forecast(model, variables, history_BxT, 5, window=6)
  np.testing.assert_allclose(windowed, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('window', [None, 10])
def test_forecast_of_the_pooled_model_with_horizon_one_equals_a_python_loop(window):
  # Without a window the pooled mean grows with the history; with one, every step reads the
  # last 10 values, as in training. Both against `__call__` on the (cut) growing history.
  model = _model('pooled', horizon=1)
  history_BxT = _series(length=10, seed=3)
  variables = _init(model, history_BxT)
  cut = (lambda h: h) if window is None else (lambda h: h[:, -window:])
  expected = _brute_force(lambda h: _apply(model, variables, cut(h))[:, 0], history_BxT, 4)
  got = forecasting.forecast(model, variables, history_BxT, 4, window=window)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  if window is not None:
    growing = _brute_force(lambda h: _apply(model, variables, h)[:, 0], history_BxT, 4)
    assert not np.allclose(got, growing, atol=1e-4)  # the window matters for a mean


def test_forecast_is_jittable_and_checks_its_arguments():
  model = _model('shifted')
  history_BxT = _series(length=8)
  variables = _init(model, history_BxT)
  jitted = jax.jit(lambda v, h: forecasting.forecast(model, v, h, 4))
  np.testing.assert_allclose(jitted(variables, history_BxT),
                             forecasting.forecast(model, variables, history_BxT, 4), rtol=1e-6)
  for kwargs, words in [({'num_steps': 0}, 'num_steps must be an integer >= 1, got 0'),
                        ({'num_steps': 3, 'window': 9}, 'window must be None or an integer in '
                                                        '[1, 8]'),
                        ({'num_steps': 3, 'window': 0}, 'window must be None or an integer in '
                                                        '[1, 8]')]:
    with pytest.raises(ValueError, match=words.replace('[', r'\[').replace(']', r'\]')):
      forecasting.forecast(model, variables, history_BxT, **kwargs)
  with pytest.raises(ValueError, match=r'history must have shape \[batch, length >= 1\]'):
    forecasting.forecast(model, variables, history_BxT[:, :0], 2)


# Baselines -------------------------------------------------------------------------------

def test_last_value_baseline_by_hand():
  history = np.array([[1.0, 2.0, 7.0], [4.0, 5.0, -1.0]])
  np.testing.assert_array_equal(forecasting.last_value_forecast(history, 4),
                                [[7, 7, 7, 7], [-1, -1, -1, -1]])


def test_seasonal_naive_baseline_by_hand():
  # Period 4, history x_1 … x_6 = 10, 20, 30, 40, 50, 60: the season of x_{6+h} is that of
  # x_{6+h−4k}; the last observed values of the seasons are x_3 = 30, x_4 = 40, x_5 = 50, x_6 = 60.
  history = np.array([[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]])
  np.testing.assert_array_equal(forecasting.seasonal_naive_forecast(history, 9, period=4),
                                [[30, 40, 50, 60, 30, 40, 50, 60, 30]])
  # Period 12 on months 0 … 13: ŷ_{T+h} repeats months 2 … 13 (the last year).
  months = np.arange(14.0)[None]
  np.testing.assert_array_equal(forecasting.seasonal_naive_forecast(months, 13),
                                [list(range(2, 14)) + [2]])
  with pytest.raises(ValueError, match='needs at least 12 values of history, got 6'):
    forecasting.seasonal_naive_forecast(history, 3)


def test_seasonal_naive_needs_exactly_one_period_of_history():
  # T = m values hold every season once: ŷ_{T+h} = x_{T+h−m}, the history repeated.
  history = np.array([[1.0, 2.0, 3.0, 4.0]])
  np.testing.assert_array_equal(forecasting.seasonal_naive_forecast(history, 6, period=4),
                                [[1, 2, 3, 4, 1, 2]])
  with pytest.raises(ValueError, match='needs at least 4 values of history, got 3'):
    forecasting.seasonal_naive_forecast(history[:, 1:], 2, period=4)


@pytest.mark.parametrize('period', [0, -4, 12.0, True])
def test_seasonal_naive_period_that_is_not_a_positive_integer_is_one_sentence(period):
  # Period 0 "needed at least 0 values of history, got 24"; 12.0 was an IndexError.
  history = np.arange(24.0)[None]
  one_sentence(lambda: forecasting.seasonal_naive_forecast(history, 3, period),
               'period must be a positive integer', repr(period))


# Construction ------------------------------------------------------------------------------

def test_registry_builds_both_with_the_data_horizon_and_a_compute_dtype():
  # Shapes and dtypes by tracing (jax.eval_shape), without compiling.
  pooled = registry.build('causal_conv_pooled', data_defaults={'horizon': 5}, dtype='bfloat16',
                          channels=4, dilations=[1, 2])
  assert pooled.horizon == 5 and pooled.dilations == (1, 2) and pooled.dtype == jnp.bfloat16
  x_BxT = jax.ShapeDtypeStruct((2, 8), jnp.float32)
  key = jax.random.key(0)
  variables = jax.eval_shape(pooled.init, key, x_BxT)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  outputs = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == '__call__' and hasattr(out, 'dtype'):
      outputs.append((type(context.module).__name__, out.dtype))
    return out

  with nn.intercept_methods(record):
    out = jax.eval_shape(pooled.apply, variables, x_BxT)
  assert out.shape == (2, 5) and out.dtype == jnp.float32
  # The convolutions and dense layers compute in bfloat16; the forecast comes back float32.
  assert ('Conv', jnp.bfloat16) in outputs and ('Dense', jnp.bfloat16) in outputs
  shifted = registry.build('causal_conv_shifted', data_defaults={'horizon': 1}, channels=4)
  shifted_variables = jax.eval_shape(shifted.init, key, x_BxT)
  assert jax.eval_shape(shifted.apply, shifted_variables, x_BxT).shape == (2, 8)
  # Without predict_change no float32 value is added back: the heads' outputs are cast.
  for name in ('causal_conv_pooled', 'causal_conv_shifted'):
    raw = registry.build(name, data_defaults={'horizon': 2}, dtype='bfloat16', channels=4,
                         dilations=[1], predict_change=False)
    raw_variables = jax.eval_shape(raw.init, key, x_BxT)
    assert jax.eval_shape(raw.apply, raw_variables, x_BxT).dtype == jnp.float32, name


@pytest.mark.parametrize('options, words', [
    ({'horizon': 0}, 'PooledConvForecaster horizon must be a positive integer, got 0'),
    ({'pooling': 'median'}, "PooledConvForecaster pooling must be one of mean, max, last, got "
                            "'median'"),
    ({'dilations': ()}, 'PooledConvForecaster dilations must be a non-empty sequence'),
    ({'channels': 0}, 'PooledConvForecaster channels must be a positive integer, got 0'),
    ({'dropout_rate': 1.0}, 'PooledConvForecaster dropout_rate must lie in [0, 1), got 1.0'),
])
def test_bad_options_fail_at_construction_in_one_sentence(options, words):
  with pytest.raises(ValueError) as info:
    forecasting.PooledConvForecaster(**options)
  message = str(info.value)
  assert message.startswith(words) and '\n' not in message and message.endswith('.')
