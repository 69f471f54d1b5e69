"""Hand-written BPTT for the Elman RNN against `jax.grad` through a `jax.lax.scan` of the Elman
equations and through `rnn.Recurrent('elman')` (Flax's SimpleCell) with the parameters mapped;
in float32 here and in float64 in a child process."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.sequence import bptt
from models.sequence import rnn
from tests import subprocess_util

# float32 on both sides, 9 steps, gradients up to ≈ 10: the largest difference measured is
# 1.9e-6 absolute, 4.3e-7 relative to the largest entry of its gradient.
GRAD_TOL = dict(rtol=1e-5, atol=2e-6)

B, T, C, H, K = 3, 9, 4, 5, 2


def problem(seed, readout=True, scale=1.2):
  """Non-trivial parameters (non-symmetric W_hh of norm `scale`, non-zero biases), inputs,
  targets, an initial state and per-step weights with zeros past each example's length."""
  rng = np.random.default_rng(seed)
  f = lambda *shape, s=1.0: jnp.asarray(rng.normal(scale=s, size=shape), jnp.float32)
  params = {'W_xh': f(H, C, s=0.6), 'W_hh': f(H, H, s=scale / np.sqrt(H)), 'b_h': f(H, s=0.3)}
  if readout:
    params.update(W_hy=f(K, H, s=0.7), b_y=f(K, s=0.3))
  out = K if readout else H
  lengths = np.array([T, 5, 2])
  weights_BxT = jnp.asarray(np.arange(T)[None, :] < lengths[:, None], jnp.float32)
  return params, f(B, T, C), f(B, T, out), f(B, H, s=0.5), weights_BxT


def scan_loss(params, h0_BxH, x_BxTxC, targets, weights_BxT):
  """The Elman equations as a plain scan, step by step: the reference jax.grad differentiates."""

  def step(h_BxH, x_BxC):
    h_BxH = jnp.tanh(x_BxC @ params['W_xh'].T + h_BxH @ params['W_hh'].T + params['b_h'])
    return h_BxH, h_BxH

  _, h_TxBxH = jax.lax.scan(step, h0_BxH, jnp.swapaxes(x_BxTxC, 0, 1))
  y = h_TxBxH @ params['W_hy'].T + params['b_y'] if 'W_hy' in params else h_TxBxH
  per_step_TxB = jnp.sum((y - jnp.swapaxes(targets, 0, 1)) ** 2, axis=-1)
  if weights_BxT is not None:
    per_step_TxB = per_step_TxB * weights_BxT.T
  return jnp.sum(per_step_TxB) / x_BxTxC.shape[0]


def assert_grads_close(got, expected, **tol):
  assert set(got) == set(expected)
  for name in expected:
    np.testing.assert_allclose(got[name], expected[name], err_msg=name, **tol)


@pytest.mark.parametrize('weighted', [False, True], ids=['every_step', 'weighted'])
@pytest.mark.parametrize('readout', [True, False], ids=['readout', 'hidden_states'])
def test_bptt_equals_autodiff_through_a_scan(readout, weighted):
  params, x, targets, h0, weights = problem(0, readout)
  weights = weights if weighted else None

  @jax.jit  # one compilation for all three
  def run(params, h0, x, targets, weights):
    return (jax.value_and_grad(scan_loss, argnums=(0, 1))(params, h0, x, targets, weights),
            bptt.value_and_grad(params, x, targets, h0, weights),
            bptt.loss(params, x, targets, h0, weights))

  (expected_value, (expected, expected_h0)), (value, grads), loss = run(params, h0, x, targets,
                                                                        weights)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  np.testing.assert_allclose(loss, expected_value, rtol=1e-6)
  assert_grads_close(grads, {**expected, 'h0': expected_h0}, **GRAD_TOL)
  # The recurrence matters: the gradients are far from those of a net without the W_hhᵀ δ_{t+1}
  # term (which would give ∂L/∂h_0 = 0).
  assert np.max(np.abs(grads['h0'])) > 1e-2


def test_bptt_with_the_default_zero_initial_state():
  params, x, targets, _, _ = problem(1)
  expected, (_, grads) = jax.jit(lambda p: (jax.grad(scan_loss)(p, jnp.zeros((B, H)), x, targets, None),
                                             bptt.value_and_grad(p, x, targets)))(params)
  assert_grads_close({k: v for k, v in grads.items() if k != 'h0'}, expected, **GRAD_TOL)


def test_bptt_equals_autodiff_through_the_recurrent_layer():
  """Flax's SimpleCell as `rnn.Recurrent('elman')`, its kernels mapped from W (W = kernelᵀ)."""
  params, x, targets, h0, weights = problem(2, readout=True, scale=1.5)
  readout = {k: params[k] for k in ('W_hy', 'b_y')}

  def layer_loss(variables, readout, h0_BxH):
    h_BxTxH, _ = rnn.Recurrent('elman', H).apply(variables, x, None, h0_BxH)
    y = h_BxTxH @ readout['W_hy'].T + readout['b_y']
    return jnp.sum(jnp.sum((y - targets) ** 2, axis=-1) * weights) / B

  variables = bptt.to_simple_cell(params)
  layer_grads, readout_grads, h0_grad = jax.jit(jax.grad(layer_loss, argnums=(0, 1, 2)))(
      variables, readout, h0)
  _, grads = bptt.value_and_grad(params, x, targets, h0, weights)
  expected = {**bptt.from_simple_cell(layer_grads), **readout_grads, 'h0': h0_grad}
  assert_grads_close(grads, expected, **GRAD_TOL)
  # The mapping round-trips, and the layer computes the same hidden states.
  assert_grads_close(bptt.from_simple_cell(variables), {k: params[k] for k in ('W_xh', 'W_hh', 'b_h')},
                     rtol=0, atol=0)
  np.testing.assert_allclose(rnn.Recurrent('elman', H).apply(variables, x, None, h0)[0],
                             bptt.forward(params, x, h0)[0], rtol=1e-6, atol=1e-6)


def test_bptt_equals_autodiff_in_float64():
  result = subprocess_util.run_python('''
      import json
      import jax, jax.numpy as jnp, numpy as np
      from models.sequence import bptt
      from tests.models import test_bptt as t
      params, x, targets, h0, weights = t.problem(3)
      cast = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)
      params, x, targets, h0, weights = cast((params, x, targets, h0, weights))
      expected, expected_h0 = jax.grad(t.scan_loss, argnums=(0, 1))(params, h0, x, targets, weights)
      _, grads = bptt.value_and_grad(params, x, targets, h0, weights)
      expected['h0'] = expected_h0
      rel = {k: float(np.max(np.abs(grads[k] - expected[k])) / np.max(np.abs(expected[k])))
             for k in expected}
      # Without h0 (a zero state of the inputs' dtype): the forward pass and the gradients.
      _, zero_state_grads = bptt.value_and_grad(params, x, targets, None, weights)
      zero_state_h = bptt.forward(params, x)[0]
      dtypes = {str(zero_state_grads['W_hh'].dtype), str(zero_state_h.dtype)}
      print(json.dumps({'dtype': str(grads['W_hh'].dtype), 'rel': rel,
                        'zero_state_dtypes': sorted(dtypes)}))
  ''', env={'JAX_ENABLE_X64': '1'})
  assert result['dtype'] == 'float64' and result['zero_state_dtypes'] == ['float64']
  assert set(result['rel']) == {'W_xh', 'W_hh', 'b_h', 'W_hy', 'b_y', 'h0'}
  # Measured ≤ 4e-16: the two differ only by rounding.
  assert max(result['rel'].values()) < 1e-12, result


def test_init_params_scales_the_recurrence_by_its_singular_values():
  """W_hh = s·Q with Q orthogonal: every singular value is the recurrent scale s, which is what
  sets the growth or decay of δ per step back (a Gaussian W_hh of the same variance would
  spread them over [0, 2s]). W_xh ~ N(0, input_scale²/C), W_hy ~ N(0, 1/H), zero biases."""
  params = bptt.init_params(jax.random.PRNGKey(3), 32, 64, 16, recurrent_scale=1.5,
                            input_scale=2.0)
  np.testing.assert_allclose(np.linalg.svd(np.asarray(params['W_hh']), compute_uv=False), 1.5,
                             rtol=1e-5)
  assert params['W_xh'].shape == (64, 32) and params['W_hy'].shape == (16, 64)
  # 2,048 and 1,024 entries: standard errors of the standard deviation ≈ 1.6 % and 2.2 %.
  np.testing.assert_allclose(np.std(params['W_xh']), 2.0 / np.sqrt(32), rtol=0.08)
  np.testing.assert_allclose(np.std(params['W_hy']), 1 / np.sqrt(64), rtol=0.1)
  for name in ('b_h', 'b_y'):
    np.testing.assert_array_equal(params[name], 0.0)
  # Independent draws (one key each): a reused key made W_hy the first entries of W_xh.
  w_xh, w_hy = np.ravel(params['W_xh'])[:1024], np.ravel(params['W_hy'])
  assert abs(np.corrcoef(w_xh, w_hy)[0, 1]) < 0.15  # ≈ 0.03 standard error


def test_default_initial_state_is_zero_and_a_carried_state_continues_the_sequence():
  """forward/loss without h0 start from h_0 = 0 (the hand loop below); running the second
  half of a sequence from the first half's last state gives the states of one pass."""
  params, x, targets, _, _ = problem(4)
  h = np.zeros((B, H))
  expected_BxTxH = []
  for t in range(T):  # h_t = tanh(W_xh x_t + W_hh h_{t−1} + b_h), h_0 = 0
    h = np.tanh(np.asarray(x[:, t]) @ np.asarray(params['W_xh']).T
                + h @ np.asarray(params['W_hh']).T + np.asarray(params['b_h']))
    expected_BxTxH.append(h)
  expected_BxTxH = np.stack(expected_BxTxH, 1)

  @jax.jit  # one compilation for all
  def run(params, x, targets):
    first_BxSxH, _ = bptt.forward(params, x[:, :4])
    rest_BxSxH, _ = bptt.forward(params, x[:, 4:], first_BxSxH[:, -1])
    return (bptt.forward(params, x)[0], jnp.concatenate([first_BxSxH, rest_BxSxH], 1),
            bptt.loss(params, x, targets), scan_loss(params, jnp.zeros((B, H)), x, targets, None))

  h_BxTxH, carried_BxTxH, value, expected_value = run(params, x, targets)
  np.testing.assert_allclose(h_BxTxH, expected_BxTxH, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carried_BxTxH, expected_BxTxH, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)


def test_from_simple_cell_also_takes_the_params_collection_alone():
  params, *_ = problem(5)
  variables = bptt.to_simple_cell(params)
  assert_grads_close(bptt.from_simple_cell(variables['params']),
                     {k: params[k] for k in ('W_xh', 'W_hh', 'b_h')}, rtol=0, atol=0)
