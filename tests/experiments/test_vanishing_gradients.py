"""The Jacobian norms of the vanishing-gradients figure against an explicit product of the
Elman step Jacobians diag(1 − h_k²) W_hh, against `jax.jacrev` of the whole unrolled map from
s_t to s_T (LSTM and GRU), and against scale^d for the linear RNN; the script writes its PNG."""

import os
import re

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import vanishing_gradients as vg
from tests.messages import assert_one_sentence

H, C, T = 6, 3, 12


def _model(kind, scale=None, seed=0):
  cell, variables = vg.make_cell(kind, H, C, jax.random.key(seed), scale)
  x_TxC = jax.random.normal(jax.random.key(seed + 1), (T, C))
  # A non-zero start, so the first step's Jacobian is not a special case.
  s0 = 0.3 * jax.random.normal(jax.random.key(seed + 2), vg.initial_state(cell, C).shape)
  return variables, vg.flat_step(cell, C), s0, x_TxC


def test_elman_norms_equal_the_explicit_product_of_step_jacobians():
  variables, step, s0, x_TxC = _model('elman', scale=1.3)
  states, jacobians = jax.jit(vg.step_jacobians, static_argnums=0)(step, variables, s0, x_TxC)
  log10_norms = np.asarray(jax.jit(vg.log10_jacobian_norms)(jacobians))
  # h_k = tanh(x_k W_i + h_{k−1} K_h + b) with Flax's kernels K = Wᵀ, so
  # ∂h_k/∂h_{k−1} = diag(1 − h_k²) K_hᵀ = diag(1 − h_k²) W_hh, in float64.
  kernel_h = np.asarray(variables['params']['h']['kernel'], np.float64)
  kernel_i = np.asarray(variables['params']['i']['kernel'], np.float64)
  bias = np.asarray(variables['params']['i']['bias'], np.float64)
  h, hs = np.asarray(s0, np.float64), []
  for x in np.asarray(x_TxC, np.float64):
    h = np.tanh(x @ kernel_i + h @ kernel_h + bias)
    hs.append(h)
  np.testing.assert_allclose(states, hs, rtol=1e-5, atol=1e-6)
  explicit = [np.diag(1 - h_k ** 2) @ kernel_h.T for h_k in hs]
  np.testing.assert_allclose(jacobians, explicit, rtol=1e-5, atol=1e-6)
  product, expected = np.eye(H), []
  for d in range(1, T + 1):
    product = product @ explicit[T - d]  # J_T J_{T−1} ⋯ J_{T−d+1}
    expected.append(np.log10(np.linalg.norm(product, ord=2)))
  np.testing.assert_allclose(log10_norms, expected, rtol=0, atol=1e-5)
  assert expected[-1] < expected[0] - 0.5  # it does change with the distance


@pytest.mark.parametrize('kind', ['lstm', 'gru'])
def test_gated_cell_norms_equal_jacobians_of_the_unrolled_map(kind):
  """Brute force: ∂s_T/∂s_t for every t at once, as ∂s_T/∂e_t of the unrolled forward pass
  with a perturbation e_t added to each state s_t (at e = 0)."""
  variables, step, s0, x_TxC = _model(kind, seed=3)

  def final_state(e_TxS):
    step_perturbed = lambda s, inputs: (step(variables, s + inputs[0], inputs[1]), None)
    return jax.lax.scan(step_perturbed, s0, (e_TxS, x_TxC))[0]

  size = s0.shape[0]
  brute_SxTxS = np.asarray(jax.jit(jax.jacrev(final_state))(jnp.zeros((T, size))), np.float64)
  expected = [np.log10(np.linalg.norm(brute_SxTxS[:, T - d], ord=2)) for d in range(1, T + 1)]

  def norms(variables, x_TxC):
    return vg.log10_jacobian_norms(vg.step_jacobians(step, variables, s0, x_TxC)[1])

  np.testing.assert_allclose(jax.jit(norms)(variables, x_TxC), expected, rtol=0, atol=1e-5)
  assert size == (2 * H if kind == 'lstm' else H)  # the LSTM's state is (c, h)


def test_linear_rnn_norms_are_the_scale_to_the_distance():
  # W_hh = s·Q with Q orthogonal, so ∂h_T/∂h_t = (s Q)^(T−t) has spectral norm s^(T−t).
  for scale in (0.5, 1.7):
    log10_norms = vg.mean_log10_norms('linear', H, C, T, 2, jax.random.key(4), scale)
    np.testing.assert_allclose(log10_norms, np.arange(1, T + 1) * np.log10(scale), atol=1e-4)


def test_clipping_bounds_the_update():
  """One SGD step (lr 1) on the same batch without clipping (0 = off) and clipped at 0.5:
  the update is −g, then 0.5 · (−g / ‖g‖), and the reported norm is ‖g‖ before clipping."""
  params = vg.bptt.init_params(jax.random.key(5), 1, H, 1, recurrent_scale=3.0)
  kwargs = dict(steps=1, batch=4, length=20, delay=2, learning_rate=1.0, key=jax.random.key(6))
  _, norms, finite, unclipped = vg.train(params, clip_norm=0.0, **kwargs)
  _, clipped_norms, _, clipped = vg.train(params, clip_norm=0.5, **kwargs)
  assert norms[0] > 1 and finite.all()
  np.testing.assert_allclose(clipped_norms, norms, rtol=1e-6)
  minus_g = jax.tree.map(jnp.subtract, unclipped, params)
  np.testing.assert_allclose(optax.tree.norm(minus_g), norms[0], rtol=1e-5)
  change = jax.tree.map(jnp.subtract, clipped, params)
  np.testing.assert_allclose(optax.tree.norm(change), 0.5, rtol=1e-5)
  jax.tree.map(lambda c, g: np.testing.assert_allclose(c, 0.5 * g / norms[0], rtol=1e-4, atol=1e-7),
               change, minus_g)


def test_the_script_writes_its_figure(tmp_path, monkeypatch, capsys):
  """`main` with its own flags (parsed into a fresh FlagValues, not the process-wide one)."""
  flag_values = flags.FlagValues()
  vg.define_flags(flag_values)
  output = tmp_path / 'figures' / 'vanishing.png'
  flag_values(['vanishing_gradients', f'--output={output}', '--features=4', '--length=12',
               '--samples=1', '--scales=2', '--steps=2', '--batch=2', '--train_length=12'])
  monkeypatch.setattr(vg, 'FLAGS', flag_values)
  vg.main(['vanishing_gradients'])
  assert os.path.getsize(output) > 10_000
  lines = capsys.readouterr().out.splitlines()
  # 1 Elman scale, 2 linear, 3 LSTM and 2 GRU curves; distance 50 is beyond --length=12.
  norms = [line for line in lines if '‖∂s_T/∂s_(T−d)‖₂  d=1: ' in line]
  assert len(norms) == 8 and all('d=10: ' in line and 'd=50' not in line for line in norms)
  assert norms[0].startswith('Elman (tanh), W_hh = 2·Q ')
  for scale in ('1.5', '3'):
    assert any(line.startswith(f'SGD W_hh = {scale}·Q, no clipping ') for line in lines)
    assert any(line.startswith(f'SGD W_hh = {scale}·Q, clipped at 1 ') for line in lines)
  assert lines[-1].startswith(f'written to {output}')


@pytest.mark.parametrize('flag, message', [
    ('--features=0', 'flag --features=0: 0 is not a positive integer'),
    ('--steps=0', 'flag --steps=0: 0 is not a positive integer'),
    ('--delay=-1', 'flag --delay=-1: -1 is not a non-negative integer'),
    ('--scales=', '--scales must be positive numbers'),
    ('--scales=1,a', '--scales must be positive numbers'),
    ('--train_scales=0', '--train_scales must be positive numbers'),
    ('--learning_rate=0', '--learning_rate must be positive'),
    ('--clip_norm=-1', '--clip_norm must be positive'),
    # An infinite learning rate or scale trained (or drew) NaNs without a word against it.
    ('--learning_rate=inf', '--learning_rate must be positive and finite'),
    ('--clip_norm=inf', '--clip_norm must be positive and finite'),
    ('--scales=1,inf', '--scales must be positive numbers, not infinite'),
    ('--train_scales=inf', '--train_scales must be positive numbers, not infinite'),
    ('--delay=12', 'delay=12, train_length=12: --delay must be less than --train_length'),
])
def test_bad_flags_are_refused_when_parsed(flag, message):
  # Unchecked, a zero scale gave log10(0) curves, a delay beyond the sequence a shape error
  # after panels (a, b), and a zero learning rate a flat "training" run.
  def parse(*args):
    flag_values = flags.FlagValues()
    vg.define_flags(flag_values)
    flag_values(['vanishing_gradients', '--train_length=12', *args])
    return flag_values

  with pytest.raises(flags.IllegalFlagValueError, match=re.escape(message)):
    parse(flag)
  assert parse('--delay=11', '--scales=0.5,3').delay == 11  # the largest delay; scales parse
  assert parse('--delay=0').delay == 0  # the target is the input of the same step


@pytest.mark.parametrize('name, message', [
    ('folder', 'is a folder; give the file to write in it.'),
    ('norms.txt', 'must end in a figure format: '),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                     name, message):
  # A folder made matplotlib write <folder>.png while the script named the folder, and .txt
  # failed in savefig after every panel was computed.
  (tmp_path / 'folder').mkdir()
  flag_values = flags.FlagValues()
  vg.define_flags(flag_values)
  flag_values(['vanishing_gradients', f'--output={tmp_path / name}'])
  monkeypatch.setattr(vg, 'FLAGS', flag_values)
  monkeypatch.setattr(vg, 'run', lambda *a, **k: pytest.fail('the panels were computed'))
  with pytest.raises(app.UsageError) as info:
    vg.main(['vanishing_gradients'])
  assert_one_sentence(str(info.value), f'--output={tmp_path / name} {message}')
  assert not os.path.exists(f'{tmp_path / "folder"}.png')


def test_output_has_no_default(monkeypatch):
  # A default of docs/figures/vanishing_gradients.png overwrote the committed figure (or, from
  # another folder, wrote a docs/ tree there) whenever the script ran without --output.
  flag_values = flags.FlagValues()
  vg.define_flags(flag_values)
  flag_values(['vanishing_gradients', '--features=4'])
  monkeypatch.setattr(vg, 'FLAGS', flag_values)
  monkeypatch.setattr(vg, 'run', lambda *a, **k: pytest.fail('the panels were computed'))
  with pytest.raises(app.UsageError) as info:
    vg.main(['vanishing_gradients'])
  assert_one_sentence(str(info.value), '--output is required: the PNG to write, e.g. '
                      '--output=docs/figures/vanishing_gradients.png.')


def test_a_large_gru_update_gate_bias_keeps_the_state():
  # h' = z ⊙ h + (1 − z) ⊙ h̃ with z = σ(… + b_z): b_z = 20 gives z ≈ 1, so ∂s_T/∂s_t ≈ I at
  # every distance (a bias added to the reset gate's slice instead would leave z ≈ ½).
  x_TxC = jax.random.normal(jax.random.key(1), (T, C))
  for bias, check in ((20.0, lambda n: np.abs(n).max() < 1e-3), (0.0, lambda n: n[-1] < -0.5)):
    cell, variables = vg.make_cell('gru', H, C, jax.random.key(0), None, bias)
    step = vg.flat_step(cell, C)
    _, jacobians = vg.step_jacobians(step, variables, vg.initial_state(cell, C), x_TxC)
    log10_norms = np.asarray(vg.log10_jacobian_norms(jacobians))
    assert check(log10_norms), (bias, log10_norms)


def test_delay_task_targets_are_the_inputs_delay_steps_back():
  x_BxTx1, targets_BxTx1 = vg.delay_task(jax.random.key(2), 3, 10, 4)
  x, targets = np.asarray(x_BxTx1), np.asarray(targets_BxTx1)
  assert x.shape == targets.shape == (3, 10, 1)
  for t in range(10):
    np.testing.assert_array_equal(targets[:, t], x[:, t - 4] if t >= 4 else 0)


def test_a_large_lstm_forget_gate_bias_keeps_the_cell():
  # c' = f ⊙ c + i ⊙ g with f = σ(… + b_f): b_f = 20 gives f ≈ 1, so ∂c_T/∂c_t ≈ I and the
  # state's Jacobian keeps a norm of at least about 1 at every distance; without it, and with
  # the bias added to the input gate instead, f ≈ ½ and the norms decay.
  x_TxC = jax.random.normal(jax.random.key(1), (T, C))
  for bias, check in ((20.0, lambda n: n.min() > -1e-3), (0.0, lambda n: n[-1] < -1)):
    cell, variables = vg.make_cell('lstm', H, C, jax.random.key(0), None, bias)
    step = vg.flat_step(cell, C)
    _, jacobians = vg.step_jacobians(step, variables, vg.initial_state(cell, C), x_TxC)
    log10_norms = np.asarray(vg.log10_jacobian_norms(jacobians))
    assert check(log10_norms), (bias, log10_norms)


def test_the_curve_is_the_geometric_mean_over_the_input_sequences(monkeypatch):
  # Per-sequence log10 norms 10⁻² and 10⁰ at d = 1 average to −1 (the geometric mean 0.1),
  # not to log10 of the arithmetic mean 0.505; the program sees [samples, length, C] inputs.
  log10_NxT = np.array([[-2.0, -4.0, -6.0], [0.0, -1.0, 1.0]])
  seen = []

  def program(kind, features, in_features):
    seen.append((kind, features, in_features))
    return lambda variables, x_NxTxC: seen.append(x_NxTxC.shape) or jnp.asarray(log10_NxT)

  monkeypatch.setattr(vg, '_norms_program', program)
  monkeypatch.setattr(vg, 'make_cell', lambda *args: (None, {}))
  curve = vg.mean_log10_norms('elman', H, C, 3, 2, jax.random.key(0), scale=1.0)
  np.testing.assert_allclose(curve, [-1.0, -2.5, -2.5], rtol=1e-6)
  assert seen == [('elman', H, C), (2, 3, C)]


def test_the_reported_loss_is_the_squared_error_per_step_and_divergence_is_flagged():
  """The batch and program of the clipping test: the loss of step 1 is that of the initial
  parameters, Σ_k (ŷ_t − y_t)² averaged over the batch and the T steps (a NumPy forward pass);
  a huge learning rate leaves some parameters infinite, which `finite` reports."""
  params = vg.bptt.init_params(jax.random.key(5), 1, H, 1, recurrent_scale=3.0)
  key = jax.random.key(6)
  kwargs = dict(steps=1, batch=4, length=20, delay=2, clip_norm=0.0, key=key)
  losses, _, finite, _ = vg.train(params, learning_rate=1.0, **kwargs)
  x, targets = (np.asarray(a, np.float64)
                for a in vg.delay_task(jax.random.split(key, 1)[0], 4, 20, 2))
  p = {name: np.asarray(value, np.float64) for name, value in params.items()}
  h, errors = np.zeros((4, H)), []
  for t in range(20):
    h = np.tanh(x[:, t] @ p['W_xh'].T + h @ p['W_hh'].T + p['b_h'])
    errors.append(np.sum((h @ p['W_hy'].T + p['b_y'] - targets[:, t]) ** 2, axis=-1))
  assert losses.shape == (1,) and finite.all()
  np.testing.assert_allclose(losses[0], np.mean(errors), rtol=1e-5)
  _, _, finite, diverged = vg.train(params, learning_rate=3e37, **kwargs)
  leaves_finite = [bool(np.all(np.isfinite(leaf))) for leaf in jax.tree.leaves(diverged)]
  assert any(leaves_finite) and not all(leaves_finite)  # |∂L/∂b_y| < 5 < |∂L/∂W_xh|
  assert finite.tolist() == [False]


def test_each_gated_curve_gets_the_gate_bias_its_label_names():
  # (label, kind, scale, gate bias, …): 'b_f = 3' must be an LSTM with forget-gate bias 3, a
  # default init a bias of 0, and the linear and Elman curves their scales.
  for label, kind, scale, gate_bias, _, axis in vg.panel_a_models((0.5, 2.0)):
    if kind in ('lstm', 'gru'):
      assert (scale, axis) == (None, 1), label
      name = 'b_f' if kind == 'lstm' else 'b_z'
      assert label.startswith('LSTM' if kind == 'lstm' else 'GRU'), label
      expected = 0.0 if 'default init' in label else float(label.split(f'{name} = ')[1])
      assert gate_bias == expected, label
    else:
      assert (gate_bias, axis) == (0.0, 0) and f'W_hh = {scale:g}·Q' in label, label
  labels = [m[0] for m in vg.panel_a_models((0.5, 2.0))]
  assert sum('b_f = ' in l for l in labels) == 3 and sum('b_z = ' in l for l in labels) == 2
