r"""Vanishing and exploding gradients in recurrent networks, and gradient clipping.

Back-propagated through time (Werbos 1990), the gradient reaching step t
from step T is multiplied by the Jacobian ∂s_T/∂s_t = J_T J_{T−1} ⋯ J_{t+1}, one
J_k = ∂s_k/∂s_{k−1} per step (for the Elman RNN J_k = diag(1 − h_k²) W_hh), so it
shrinks or grows exponentially in the distance T − t (Bengio et al. 1994; Pascanu et
al. 2013, "On the difficulty of training recurrent neural networks"). The script draws:

(a, b) the spectral norm ‖∂s_T/∂s_t‖₂ (the largest singular value: the most a gradient
    can be amplified) against T − t, the geometric mean over `--samples` random input
    sequences, for (a) the Elman RNN with W_hh = scale · Q (Q a random orthogonal
    matrix) at several scales, and the linear RNN, where it is exactly scale^(T−t);
    (b) the LSTM and GRU, with their default initialisation and with a positive bias
    on the gate that keeps the carry (the LSTM's forget gate, the GRU's update gate).
    s is the cell's carry: h for Elman and GRU, (c, h) for the LSTM. Each J_k comes
    from `jax.jacrev` of one cell step; the product is accumulated from J_T backwards
    and renormalised at every step (its logarithm is kept), so neither 0.5¹⁰⁰ nor 3¹⁰⁰
    leaves the float32 range.
(c, d) plain SGD on a long-sequence regression task (the target is the input `--delay`
    steps earlier, at every step of T = `--train_length`) with an Elman RNN whose
    gradients explode, computed by the hand-written BPTT of models/sequence/bptt.py,
    with and without `optax.clip_by_global_norm` (Pascanu et al. 2013,
    Algorithm 1: ĝ ← threshold · ĝ / ‖ĝ‖ when ‖ĝ‖ > threshold): loss and gradient norm per step,
    same batches for both.

Prints the norms at distances 1, 10 and 50, the final losses and the largest gradient
norms, and writes the figure:

  python -m experiments.vanishing_gradients --output=docs/figures/vanishing_gradients.png
"""

import functools
import os
import time

from absl import app
from absl import flags
from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax

matplotlib.use('Agg')  # Files only; no display is needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from experiments import command_line  # pylint: disable=g-import-not-at-top
from models.sequence import bptt  # pylint: disable=g-import-not-at-top
from models.sequence import rnn

FLAGS = flags.FLAGS

REPORTED_DISTANCES = (1, 10, 50)


# --- (a, b) Jacobian norms ---------------------------------------------------------------------


def cell_of(kind: str, features: int) -> nn.RNNCellBase:
  """'elman', 'lstm', 'gru' (`rnn.make_cell`) or 'linear' (h_t = W_hh h_{t−1} + W_xh x_t + b)."""
  if kind == 'linear':
    return nn.SimpleCell(features, activation_fn=lambda a: a)
  return rnn.make_cell(kind, features)


def make_cell(kind: str, features: int, in_features: int, key, scale: float | None = None,
              gate_bias: float = 0.0):
  """(cell, variables) of one model of panel (a), with the default initialisation except:

  scale ('elman', 'linear'): W_hh = scale · Q with Q a random orthogonal matrix.
  gate_bias ('lstm', 'gru'): added to the bias of the gate that keeps the carry, the LSTM's
    forget gate f (Gers et al. 2000; Jozefowicz et al. 2015 recommend 1) or the GRU's
    update gate z (h_t = z ⊙ h_{t−1} + (1 − z) ⊙ h̃_t).
  """
  cell = cell_of(kind, features)
  key_init, key_q = jax.random.split(key)
  variables = cell.init(key_init, cell.initialize_carry(key_init, (1, in_features)),
                        jnp.zeros((1, in_features)))
  variables = jax.tree.map(lambda a: a, variables)  # a copy to modify
  params = variables['params']
  if scale is not None:
    if kind not in ('elman', 'linear'):
      raise ValueError(f'A recurrent scale is for the Elman and linear RNNs, not {kind!r}.')
    params['h']['kernel'] = scale * jax.nn.initializers.orthogonal()(key_q, (features, features))
  if gate_bias:
    if kind == 'lstm':
      params['hf']['bias'] = params['hf']['bias'] + gate_bias
    elif kind == 'gru':  # rnn.GRUCell's 'input' bias is [b_r | b_z | b_h].
      params['input']['bias'] = params['input']['bias'].at[features:2 * features].add(gate_bias)
    else:
      raise ValueError(f'A gate bias is for the LSTM and GRU, not {kind!r}.')
  return cell, variables


def initial_state(cell, in_features: int) -> jnp.ndarray:
  """The cell's zero carry as one flat state vector s_0."""
  return jnp.concatenate([leaf.reshape(-1) for leaf in jax.tree.leaves(
      cell.initialize_carry(jax.random.key(0), (1, in_features)))])


def flat_step(cell, in_features: int):
  """The cell as a map of flat state vectors, s_k = f(variables, s_{k−1}, x_k) (LSTM: s = [c; h]).

  The cell sees a batch of one example (rnn.GRUCell needs a batch axis).
  """
  template = cell.initialize_carry(jax.random.key(0), (1, in_features))
  leaves, treedef = jax.tree.flatten(template)
  sizes = np.cumsum([leaf.size for leaf in leaves])[:-1]

  def step(variables, s, x_C):
    carry = jax.tree.unflatten(treedef, [part.reshape(leaf.shape) for part, leaf in
                                         zip(jnp.split(s, sizes), leaves)])
    carry, _ = cell.apply(variables, carry, x_C[None])
    return jnp.concatenate([leaf.reshape(-1) for leaf in jax.tree.leaves(carry)])

  return step


def step_jacobians(step, variables, s0, x_TxC):
  """States s_1 … s_T and the per-step Jacobians J_k = ∂s_k/∂s_{k−1} [T, S, S], each by
  `jax.jacrev` of one step at s_{k−1}."""

  def advance(s, x_C):
    return step(variables, s, x_C), s

  s_T, previous_TxS = jax.lax.scan(advance, s0, x_TxC)
  jacobians = jax.vmap(jax.jacrev(step, argnums=1), in_axes=(None, 0, 0))(
      variables, previous_TxS, x_TxC)
  states_TxS = jnp.concatenate([previous_TxS[1:], s_T[None]])
  return states_TxS, jacobians


def log10_jacobian_norms(jacobians_TxSxS):
  """log10 ‖∂s_T/∂s_{T−d}‖₂ for d = 1 … T (at index d − 1), with
  ∂s_T/∂s_{T−d} = J_T J_{T−1} ⋯ J_{T−d+1} and ‖·‖₂ the largest singular value.

  The product is kept divided by its norm and the logarithms of the norms added up,
  which is exact (‖c P J‖ = c ‖P J‖ for c > 0) and never overflows or underflows.
  """

  def back(carry, jacobian_SxS):
    direction_SxS, log_norm = carry
    product = direction_SxS @ jacobian_SxS
    norm = jnp.linalg.norm(product, ord=2)
    log_norm = log_norm + jnp.log10(norm)
    return (product / norm, log_norm), log_norm

  size = jacobians_TxSxS.shape[-1]
  _, log_norms = jax.lax.scan(back, (jnp.eye(size, dtype=jacobians_TxSxS.dtype), 0.0),
                              jacobians_TxSxS, reverse=True)
  return log_norms[::-1]  # reverse=True stacks them by t; distance d = T − t.


@functools.cache
def _norms_program(kind, features, in_features):
  """(variables, x_NxTxC) → log10 norms [N, T], compiled once per kind and size (the Elman
  scales and the gate biases share it)."""
  cell = cell_of(kind, features)
  step = flat_step(cell, in_features)
  s0 = initial_state(cell, in_features)
  one = lambda variables, x_TxC: log10_jacobian_norms(step_jacobians(step, variables, s0, x_TxC)[1])
  return jax.jit(jax.vmap(one, in_axes=(None, 0)))


def mean_log10_norms(kind, features, in_features, length, samples, key, scale=None, gate_bias=0.0,
                     input_std=1.0):
  """log10 ‖∂s_T/∂s_{T−d}‖₂, d = 1 … length, averaged over `samples` input sequences
  x_t ~ N(0, input_std²) (the log of their geometric mean), from a zero initial state."""
  key_model, key_x = jax.random.split(key)
  _, variables = make_cell(kind, features, in_features, key_model, scale, gate_bias)
  x_NxTxC = input_std * jax.random.normal(key_x, (samples, length, in_features))
  log10_norms = _norms_program(kind, features, in_features)(variables, x_NxTxC)
  return np.mean(np.asarray(log10_norms, np.float64), axis=0)  # float64: 10^-46 is 0 in float32


# --- (c, d) training with and without clipping -------------------------------------------------


def delay_task(key, batch, length, delay):
  """x_t ~ N(0, 1) (one channel); the target at step t is x_{t−delay} (0 before it)."""
  x_BxTx1 = jax.random.normal(key, (batch, length, 1))
  targets = jnp.concatenate([jnp.zeros((batch, delay, 1)), x_BxTx1[:, :length - delay]], axis=1)
  return x_BxTx1, targets


@functools.partial(jax.jit, static_argnames=('batch', 'length', 'delay'))
def _sgd_run(params, keys, learning_rate, clip_norm, *, batch, length, delay):
  # The threshold is an argument (∞ = no clipping), so both runs share one compilation.
  optimizer = optax.chain(optax.clip_by_global_norm(clip_norm), optax.sgd(learning_rate))

  def step(carry, key):
    params, opt_state = carry
    x, targets = delay_task(key, batch, length, delay)
    value, grads = bptt.value_and_grad(params, x, targets)
    del grads['h0']
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
    return (params, opt_state), (value / length, optax.tree.norm(grads), finite)

  (params, _), per_step = jax.lax.scan(step, (params, optimizer.init(params)), keys)
  return params, per_step


def train(params, *, steps, batch, length, delay, learning_rate, clip_norm, key):
  """Plain SGD, after `optax.clip_by_global_norm(clip_norm)` unless `clip_norm` is 0, on fresh
  batches of the delay task (the batch of step i from `jax.random.split(key, steps)[i]`).

  Returns per-step arrays: loss (mean over the T steps of the squared error), global gradient
  norm before clipping, and whether every parameter is finite after the step; and the final
  parameters.
  """
  params, (losses, grad_norms, finite) = _sgd_run(
      params, jax.random.split(key, steps), learning_rate, clip_norm or np.inf,
      batch=batch, length=length, delay=delay)
  return np.asarray(losses), np.asarray(grad_norms), np.asarray(finite), params


# --- figure ------------------------------------------------------------------------------------


def panel_a_models(scales):
  """(label, kind, scale, gate bias, line style, axis 0 or 1) of every curve of panel (a)."""
  models = [(f'Elman (tanh), W_hh = {s:g}·Q', 'elman', s, 0.0, '-', 0) for s in scales]
  models += [(f'linear, W_hh = {s:g}·Q', 'linear', s, 0.0, ':', 0) for s in (0.9, 1.1)]
  models += [('LSTM, default init (b_f = 0), s = (c, h)', 'lstm', None, 0.0, '-', 1),
             ('LSTM, b_f = 1', 'lstm', None, 1.0, '--', 1),
             ('LSTM, b_f = 3', 'lstm', None, 3.0, ':', 1),
             ('GRU, default init (b_z = 0)', 'gru', None, 0.0, '-', 1),
             ('GRU, b_z = 3', 'gru', None, 3.0, ':', 1)]
  return models


def run(output, *, features=64, in_features=8, length=100, samples=5, scales=(0.5, 1.0, 1.5, 3.0),
        steps=300, batch=32, train_length=100, delay=3, train_scales=(1.5, 3.0),
        learning_rate=0.03, clip_norm=1.0, seed=0, log=print):
  """Computes both panels, prints the numbers and writes the figure to `output`; returns them."""
  key_a, key_b, key_params = jax.random.split(jax.random.key(seed), 3)
  curves = []
  for label, kind, scale, gate_bias, style, axis in panel_a_models(scales):
    # One key for all: every model reads the same inputs, and the Elman scales share Q.
    log10_norms = mean_log10_norms(kind, features, in_features, length, samples, key_a, scale,
                                   gate_bias)
    curves.append((label, style, axis, log10_norms))
    at = '  '.join(f'd={d}: {10.0 ** log10_norms[d - 1]:.3g}' for d in REPORTED_DISTANCES
                   if d <= length)
    log(f'{label:<42} ‖∂s_T/∂s_(T−d)‖₂  {at}')

  training = {}
  for scale in train_scales:
    # The same initial parameters up to the scale of W_hh, and the same batches, for every run.
    params = bptt.init_params(key_params, 1, features, 1, recurrent_scale=scale)
    for clip in (0.0, clip_norm):
      losses, grad_norms, finite, _ = train(params, steps=steps, batch=batch, length=train_length,
                                            delay=delay, learning_rate=learning_rate,
                                            clip_norm=clip, key=key_b)
      name = f'W_hh = {scale:g}·Q, ' + (f'clipped at {clip:g}' if clip else 'no clipping')
      training[name] = (losses, grad_norms, finite)
      first_bad = int(np.argmin(finite)) + 1 if not finite.all() else None
      log(f'SGD {name:<30} final loss {losses[-1]:.4g} (first {losses[0]:.4g}, min '
          f'{np.nanmin(losses):.4g}, max {np.nanmax(losses):.4g} at step '
          f'{int(np.nanargmax(losses)) + 1}); gradient norm first {grad_norms[0]:.3g}, max '
          f'{np.nanmax(grad_norms):.3g}'
          + (f'; parameters not finite after step {first_bad}' if first_bad else ''))

  fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
  distances = np.arange(1, length + 1)
  for label, style, axis, log10_norms in curves:
    axes[0, axis].plot(distances, 10.0 ** log10_norms, style, label=label)
  titles = ('(a) Elman and linear RNN', '(b) LSTM and GRU, default init and gate biases')
  for ax, title in zip(axes[0], titles):
    ax.set_yscale('log')
    ax.set_xlabel('distance T − t')
    ax.set_ylabel('‖∂s_T / ∂s_t‖₂ (geometric mean)')
    ax.set_title(f'{title}\nH = {features}, {samples} input sequences x_t ~ N(0, I_{in_features})',
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which='major', alpha=0.3)
  ax_loss, ax_norm = axes[1]
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for i, (name, (losses, grad_norms, _)) in enumerate(training.items()):
    style = dict(color=colors[i // 2 % len(colors)], linestyle='--' if i % 2 == 0 else '-')
    ax_loss.plot(np.arange(1, steps + 1), losses, label=name, **style)
    ax_norm.plot(np.arange(1, steps + 1), grad_norms, label=name, **style)
  # Runs that blow up leave the frame at the top; a note says where they went.
  top = 100 * max(losses[0] for losses, _, _ in training.values())
  bottom = 0.5 * min(np.nanmin(np.where(np.isfinite(losses), losses, np.nan))
                     for losses, _, _ in training.values())
  notes = []
  for name, (losses, _, finite) in training.items():
    if np.nanmax(losses) > top:
      step = int(np.nanargmax(losses)) + 1
      notes.append(f'{name}: loss {np.nanmax(losses):.2g} at step {step}'
                   + (f', parameters not finite after step {int(np.argmin(finite)) + 1}'
                      if not finite.all() else ''))
  if notes:
    ax_loss.text(0.98, 0.55, '\n'.join(notes), transform=ax_loss.transAxes, ha='right', fontsize=8,
                 bbox=dict(facecolor='white', alpha=0.8, edgecolor='0.8'))
  ax_loss.set_ylabel('loss (squared error per step)')
  ax_loss.set_title(f'(c) SGD, lr {learning_rate:g}, batch {batch}: Elman, H = {features}, '
                    f'target x_(t−{delay}), T = {train_length}', fontsize=10)
  ax_norm.set_ylabel('global gradient norm (before clipping)')
  ax_norm.set_title('(d) gradient norm of the same runs (ends: parameters not finite)', fontsize=10)
  for ax in axes[1]:
    ax.set_yscale('log')
    ax.set_xlabel('SGD step')
  ax_loss.set_ylim(bottom, top)
  for ax in axes[1]:
    ax.legend(fontsize=8)
    ax.grid(True, which='major', alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=100)
  plt.close(fig)
  return curves, training


def _positive_numbers(values: list[str]) -> bool:
  try:
    return bool(values) and all(0 < float(v) < float('inf') for v in values)
  except ValueError:
    return False


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  # Called only when run as a script (or by a test, with its own FlagValues), so that
  # importing the module defines no flags.
  kw = dict(flag_values=flag_values)
  # No default: a default path in the repository would overwrite its committed figure.
  flags.DEFINE_string('output', None, 'PNG to write (required).', **kw)
  flags.DEFINE_integer('features', 64, 'Hidden units H of every model.', lower_bound=1, **kw)
  flags.DEFINE_integer('length', 100, 'Sequence length T of panels (a, b).', lower_bound=1, **kw)
  flags.DEFINE_integer('samples', 5, 'Random input sequences averaged in panels (a, b).',
                       lower_bound=1, **kw)
  flags.DEFINE_list('scales', ['0.5', '1.0', '1.5', '3.0'], 'Elman recurrent scales of panel (a).', **kw)
  flags.DEFINE_integer('steps', 300, 'SGD steps of each run of panels (c, d).', lower_bound=1, **kw)
  flags.DEFINE_integer('batch', 32, 'Sequences per SGD step.', lower_bound=1, **kw)
  flags.DEFINE_integer('train_length', 100, 'Sequence length of the training task.', lower_bound=1,
                       **kw)
  flags.DEFINE_integer('delay', 3, 'The target at step t is the input at t − delay.', lower_bound=0,
                       **kw)
  flags.DEFINE_list('train_scales', ['1.5', '3.0'], 'W_hh = scale · Q of the trained Elman RNNs.', **kw)
  flags.DEFINE_float('learning_rate', 0.03, 'SGD learning rate of every run.', **kw)
  flags.DEFINE_float('clip_norm', 1.0, 'Global-norm threshold of the clipped run.', **kw)
  flags.DEFINE_integer('seed', 0, 'Seed of parameters and inputs.', **kw)
  for name in ('scales', 'train_scales'):
    flags.register_validator(name, _positive_numbers, f'--{name} must be positive numbers, '
                             'not infinite.', **kw)
  for name in ('learning_rate', 'clip_norm'):
    flags.register_validator(name, lambda v: 0 < v < float('inf'),
                             f'--{name} must be positive and finite.', **kw)
  flags.register_multi_flags_validator(
      ['delay', 'train_length'], lambda f: f['delay'] < f['train_length'],
      '--delay must be less than --train_length (the target is an input of the same sequence).',
      **kw)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  if FLAGS.output is None:
    raise app.UsageError('--output is required: the PNG to write, e.g. '
                         '--output=docs/figures/vanishing_gradients.png.')
  command_line.output_file(FLAGS.output, 'output')
  start = time.time()
  run(FLAGS.output, features=FLAGS.features, length=FLAGS.length, samples=FLAGS.samples,
      scales=tuple(float(s) for s in FLAGS.scales), steps=FLAGS.steps, batch=FLAGS.batch,
      train_length=FLAGS.train_length, delay=FLAGS.delay,
      train_scales=tuple(float(s) for s in FLAGS.train_scales),
      learning_rate=FLAGS.learning_rate, clip_norm=FLAGS.clip_norm, seed=FLAGS.seed)
  print(f'written to {FLAGS.output} ({time.time() - start:.0f} s)')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
