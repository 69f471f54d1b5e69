r"""A score model of a 2-D Gaussian mixture checked against the mixture's exact density.

  python -m experiments.mixture_diffusion --workdir=workdirs/mixture_score_sde \
      [--num_samples=2000 --seed=0 --figure=PATH]

Reads a `score_sde` run of the `gaussian_mixture` data (its `config.json` and newest
checkpoint, the parameter EMA when the run kept one) and compares, against the mixture p
of data/toy2d.py whose density and score are known in closed form:

1. Unadjusted Langevin dynamics x ← x + (η/2) ∇ log p(x) + √η z (Roberts & Tweedie 1996)
   with the exact score, no network, from x₀ ~ N(E[x], Cov[x]): sample mean and covariance
   against the analytic ones, and the energy-distance two-sample p-value (Székely & Rizzo
   2004) against exact draws. A single chain does not cross between the modes; on the
   equal-weight ring the weights come out right only because that start is isotropic.
2. Samples of the learned score s_θ(x, t) and, for comparison, of the exact score of the
   diffused data. The forward SDE's kernel is N(a(t) x₀, std(t)² I) (`sde.marginal`; for
   the VE SDE a = 1 and std(t)² = σ(t)² − σ_min²), so p_t is the mixture with means a μ_k
   and covariances a² Σ_k + std(t)² I and its score is exact too. Samplers: predictor–
   corrector (reverse diffusion + Langevin, Song et al. 2021b, Algorithm 1), the
   probability-flow ODE (eq. 13, RK4) and, for the VE SDE, annealed Langevin dynamics
   (Song & Ermon 2019, Algorithm 1) on σ_1 = σ_max > … > σ_L = σ_min geometric, where the
   level σ is the time with std(t) = σ,

     t(σ) = ½ log(1 + σ²/σ_min²) / log(σ_max/σ_min),

   so that p_t(σ) = p ∗ N(0, σ² I) is the density Song & Ermon perturb. Each: the p-value
   against the run's test points, the mean and covariance errors and the wall time.
3. log p(x) of the test points along the probability-flow ODE (Song et al. 2021b, App. D.2)
   with the exact divergence and with Hutchinson's estimator, as a mean NLL in nats, against
   the exact −log p(x). With the exact score the gap is the ODE solver's error plus the
   prior mismatch E[log p_T(x(T)) − log π(x(T))] = KL(p_T ‖ π), estimated here by Monte
   Carlo; the kernel at t = ε = 1e-5 (std ≤ 1e-3 against the components' 0.2) is negligible.
   Divergences are keyed 'exact_trace' and 'hutchinson', scores 'learned' and 'exact'.

Prints a table and appends the report, with its settings (--num_samples, --seed and the
steps of each sampler), the checkpoint step and the SDE, as one line to
`<workdir>/mixture_diffusion.jsonl` (so a rerun with other settings keeps the earlier lines; a
`mixture_diffusion.json` written before is left as it is) and, with --figure, draws a PNG of
the test points and the learned model's PC, ODE and annealed-Langevin samples side by side.
"""

import functools
import math
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from data import toy2d
from experiments import command_line
from models.generative import langevin
from models.generative import sde as sde_lib

FLAGS = flags.FLAGS

OUTPUT_FILE = 'mixture_diffusion.jsonl'
SAMPLERS = ('pc', 'ode', 'annealed_langevin')


def perturbed_mixture(mixture: toy2d.GaussianMixture, mean_scale,
                      std) -> toy2d.GaussianMixture:
  """The law of a x₀ + s z for x₀ ~ mixture, z ~ N(0, I): Σ_k w_k N(a μ_k, a² Σ_k + s² I)."""
  return toy2d.GaussianMixture(mixture.weights_K, mean_scale * mixture.means_KxD,
                               jnp.square(mean_scale) * mixture.covariances_KxDxD).smoothed(std)


def exact_score_fn(mixture: toy2d.GaussianMixture, sde: sde_lib.SDE) -> sde_lib.ScoreFn:
  """score_fn(x_BxD, t_B) = ∇ₓ log p_t(x) for p_t the law of a(t) x₀ + std(t) z (`sde`'s
  kernel) with x₀ ~ mixture, t per example. In each component's eigenbasis Σ_k = U_k
  diag(λ_k) U_kᵀ the diffused covariance a² Σ_k + std² I is U_k diag(v_k) U_kᵀ with
  v_k = a² λ_k + std², so no matrix is factorised per time: with y_k = U_kᵀ (x − a μ_k),

    log r_k(x) = log w_k − ½ Σ_d (y_kd² / v_kd + log v_kd) + const   (softmax-normalised),
    ∇ₓ log p_t(x) = −Σ_k r_k(x) U_k (y_k / v_k)."""
  eigenvalues_KxD, eigenvectors_KxDxD = jnp.linalg.eigh(mixture.covariances_KxDxD)

  def score_fn(x_BxD, t_B):
    mean_scale_Bx1, std_Bx1 = sde.marginal(jnp.ones_like(x_BxD[:, :1]), t_B)
    diffs_BxKxD = x_BxD[:, None] - mean_scale_Bx1[:, :, None] * mixture.means_KxD
    y_BxKxD = jnp.einsum('kde,bkd->bke', eigenvectors_KxDxD, diffs_BxKxD)
    variances_BxKxD = (jnp.square(mean_scale_Bx1[:, :, None]) * eigenvalues_KxD
                       + jnp.square(std_Bx1[:, :, None]))
    responsibilities_BxK = jax.nn.softmax(
        jnp.log(mixture.weights_K)
        - 0.5 * jnp.sum(jnp.square(y_BxKxD) / variances_BxKxD + jnp.log(variances_BxKxD), -1),
        axis=-1)
    return -jnp.einsum('bk,kde,bke->bd', responsibilities_BxK, eigenvectors_KxDxD,
                       y_BxKxD / variances_BxKxD)

  return score_fn


def noise_level_times(sde: sde_lib.VESDE, sigmas) -> jax.Array:
  """The VE times whose kernel std √(σ(t)² − σ_min²) is σ: t = ½ log(1 + σ²/σ_min²) /
  log(σ_max/σ_min), at most T."""
  times = (0.5 * jnp.log1p(jnp.square(jnp.asarray(sigmas, jnp.float32) / sde.sigma_min))
           / math.log(sde.sigma_max / sde.sigma_min))
  return jnp.minimum(times, sde.T)


def prior_mismatch(mixture: toy2d.GaussianMixture, sde: sde_lib.SDE, key, num: int = 20_000):
  """KL(p_T ‖ π) = E_{x ~ p_T}[log p_T(x) − log π(x)] in nats, p_T the diffused mixture at
  t = T and π the SDE's prior, by Monte Carlo: (estimate, standard error)."""
  mean_scale, std = (v[0, 0] for v in sde.marginal(jnp.ones((1, 1)), jnp.full((1,), sde.T)))
  p_T = perturbed_mixture(mixture, mean_scale, std)
  x_NxD = p_T.sample(key, num)
  log_ratio_N = p_T.log_prob(x_NxD) - sde.prior_log_prob(x_NxD)
  return jnp.mean(log_ratio_N), jnp.std(log_ratio_N) / math.sqrt(num)


def moment_errors(samples_NxD, mean_D, covariance_DxD) -> dict:
  """‖x̄ − E[x]‖ and ‖Ĉov − Cov[x]‖_F against the exact moments E[x], Cov[x], each with the
  root-mean-square error of exact i.i.d. samples: √(tr Cov / N), and from the samples'
  own spread √(Σ_ij Var[(x_i − x̄_i)(x_j − x̄_j)] / N)."""
  x_NxD = np.asarray(samples_NxD, np.float64)
  num = x_NxD.shape[0]
  covariance_DxD = np.asarray(covariance_DxD, np.float64)
  centred_NxD = x_NxD - x_NxD.mean(axis=0)
  products_NxDxD = centred_NxD[:, :, None] * centred_NxD[:, None, :]
  return {
      'mean_error': float(np.linalg.norm(x_NxD.mean(axis=0) - np.asarray(mean_D, np.float64))),
      'mean_se': float(np.sqrt(np.trace(covariance_DxD) / num)),
      'cov_error': float(np.linalg.norm(products_NxDxD.sum(axis=0) / (num - 1)
                                        - covariance_DxD)),
      'cov_se': float(np.sqrt(products_NxDxD.var(axis=0).sum() / num)),
  }


def _timed(fn, *args):
  """(fn(*args) as NumPy, compile seconds, run seconds) of jit(fn)."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compiled_at = time.perf_counter()
  out = jax.tree.map(np.asarray, jax.block_until_ready(compiled(*args)))
  return out, compiled_at - start, time.perf_counter() - compiled_at


@functools.partial(jax.jit, static_argnums=(1, 4))
def exact_references(mixture: toy2d.GaussianMixture, sde: sde_lib.SDE, test_points_NxD, key,
                     num: int) -> dict:
  """What the mixture gives with no sampler: 'mean' and 'covariance', `num` exact 'draws',
  the 'nll' −log p(x) of the test points [N], and 'prior_kl' KL(p_T ‖ π) ± 'prior_kl_se'."""
  draw_key, prior_key = jax.random.split(key)
  prior_kl, prior_kl_se = prior_mismatch(mixture, sde, prior_key)
  return {'mean': mixture.mean(), 'covariance': mixture.covariance(),
          'draws': mixture.sample(draw_key, num), 'nll': -mixture.log_prob(test_points_NxD),
          'prior_kl': prior_kl, 'prior_kl_se': prior_kl_se}


def _two_sample(x_NxD, y_MxD, key, num_permutations):
  statistic, p_value = jax.jit(langevin.two_sample_test, static_argnums=3)(
      x_NxD, y_MxD, key, num_permutations)
  return {'energy_distance': float(statistic), 'p_value': float(p_value)}


def _check_settings(test_points, mixture, **settings):
  for name, value in settings.items():
    if name.endswith(('step_size', 'epsilon')):
      if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f'{name}={value!r} must be a positive number.')
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{name}={value!r} must be a positive integer.')
  if settings['num_samples'] < 2:
    raise ValueError(f'num_samples={settings["num_samples"]} must be at least 2.')
  dims = mixture.means_KxD.shape[-1]
  if np.ndim(test_points) != 2 or np.shape(test_points)[1] != dims or len(test_points) < 2:
    raise ValueError(f'test_points of shape {np.shape(test_points)} must be [N, {dims}] with '
                     'N >= 2, points of the mixture.')


def samplers(score_fn: sde_lib.ScoreFn, sde: sde_lib.SDE, num_samples: int, *, pc_steps: int,
             ode_steps: int, annealed_levels: int, annealed_steps_per_level: int,
             annealed_epsilon: float, ode_method: str = 'rk4', dims: int = 2) -> dict:
  """{name: key → samples [num_samples, dims]} of the samplers of item 2 (module doc);
  annealed Langevin only for the VE SDE, whose noise levels it anneals."""
  shape = (num_samples, dims)
  fns = {
      'pc': lambda key: sde_lib.pc_sample(sde, score_fn, shape, key, num_steps=pc_steps),
      'ode': lambda key: sde_lib.ode_sample(sde, score_fn, shape, key, num_steps=ode_steps,
                                            method=ode_method),
  }
  if isinstance(sde, sde_lib.VESDE):
    level_score_fn = lambda x, sigma_B: score_fn(x, noise_level_times(sde, sigma_B))

    def annealed(key):
      start_key, chain_key = jax.random.split(key)
      sigmas_L = langevin.geometric_sigmas(sde.sigma_max, sde.sigma_min, annealed_levels)
      return langevin.annealed_langevin_sample(
          level_score_fn, sde.prior_sample(start_key, shape), chain_key, sigmas_L,
          annealed_epsilon, annealed_steps_per_level)
    fns['annealed_langevin'] = annealed
  return fns


def report(score_fn: sde_lib.ScoreFn, sde: sde_lib.SDE, mixture: toy2d.GaussianMixture,
           test_points, key, *, num_samples: int = 2000, langevin_steps: int = 1000,
           langevin_step_size: float = 1e-3, pc_steps: int = 1000, ode_steps: int = 100,
           annealed_levels: int = 100, annealed_steps_per_level: int = 10,
           annealed_epsilon: float = 2e-5, likelihood_steps: int = 100,
           ode_method: str = 'rk4', num_permutations: int = 200,
           compare_with_exact: bool = True) -> dict:
  """Items 1–3 of the module doc for `score_fn` (named 'learned') and, if
  `compare_with_exact`, for the exact score of the diffused mixture ('exact'). Returns
  {'settings', 'langevin', 'samplers': {score: {sampler: …}}, 'likelihood', 'samples'}; all
  but 'samples' (the first score's draws, NumPy [num_samples, D] per sampler) is JSON-ready.
  Bad settings raise ValueError in one sentence before anything is compiled."""
  settings = dict(num_samples=num_samples, langevin_steps=langevin_steps,
                  langevin_step_size=langevin_step_size, pc_steps=pc_steps, ode_steps=ode_steps,
                  annealed_levels=annealed_levels,
                  annealed_steps_per_level=annealed_steps_per_level,
                  annealed_epsilon=annealed_epsilon, likelihood_steps=likelihood_steps,
                  num_permutations=num_permutations)
  if ode_method not in sde_lib.ODE_METHODS:
    raise ValueError(f'ode_method={ode_method!r}; allowed: {", ".join(sde_lib.ODE_METHODS)}.')
  _check_settings(test_points, mixture, **settings)
  settings['ode_method'] = ode_method
  test_points_NxD = jnp.asarray(test_points, jnp.float32)
  dims = test_points_NxD.shape[1]
  keys = dict(zip(('chain', 'reference', 'test', 'samplers', 'probes'), jax.random.split(key, 5)))
  result = {'settings': settings}

  exact = jax.tree.map(np.asarray, exact_references(mixture, sde, test_points_NxD,
                                                    keys['reference'], num_samples))
  moments = lambda samples_NxD: moment_errors(samples_NxD, exact['mean'], exact['covariance'])

  # 1. Langevin dynamics with the exact score of the mixture itself.
  def langevin_chains(key):
    start_key, chain_key = jax.random.split(key)
    start_NxD = mixture.mean() + jax.random.normal(start_key, (num_samples, dims)) @ (
        jnp.linalg.cholesky(mixture.covariance()).T)
    return langevin.langevin_sample(mixture.score, start_NxD, chain_key, langevin_step_size,
                                    langevin_steps)

  chains, compile_seconds, seconds = _timed(langevin_chains, keys['chain'])
  result['langevin'] = {**_two_sample(chains, exact['draws'], keys['test'], num_permutations),
                        **moments(chains), 'seconds': seconds, 'compile_seconds': compile_seconds}

  # 2. Samplers of the diffusion model, on the same keys for both scores.
  score_fns = {'learned': score_fn}
  if compare_with_exact:
    score_fns['exact'] = exact_score_fn(mixture, sde)
  result['samplers'], samples = {}, {}
  for score_name, fn in score_fns.items():
    result['samplers'][score_name] = {}
    for sampler_name, sample in samplers(
        fn, sde, num_samples, pc_steps=pc_steps, ode_steps=ode_steps,
        annealed_levels=annealed_levels, annealed_steps_per_level=annealed_steps_per_level,
        annealed_epsilon=annealed_epsilon, ode_method=ode_method, dims=dims).items():
      draws, compile_seconds, seconds = _timed(sample, keys['samplers'])
      if score_name == 'learned':
        samples[sampler_name] = draws
      result['samplers'][score_name][sampler_name] = {
          **_two_sample(draws, test_points_NxD, keys['test'], num_permutations),
          **moments(draws), 'seconds': seconds, 'compile_seconds': compile_seconds}

  # 3. Probability-flow ODE likelihood of the test points.
  exact_nll_N = np.asarray(exact['nll'], np.float64)
  likelihood = {'mixture_nll': float(exact_nll_N.mean()), 'prior_kl': float(exact['prior_kl']),
                'prior_kl_se': float(exact['prior_kl_se']), 'steps': likelihood_steps,
                'method': ode_method}
  for score_name, fn in score_fns.items():
    likelihood[score_name] = {}
    for divergence in sde_lib.DIVERGENCES:
      name = 'exact_trace' if divergence == 'exact' else divergence
      nll_N, compile_seconds, seconds = _timed(
          lambda x, k, fn=fn, divergence=divergence: -sde_lib.ode_log_likelihood(
              sde, fn, x, k, num_steps=likelihood_steps, divergence=divergence,
              method=ode_method),
          test_points_NxD, keys['probes'])
      gap_N = np.asarray(nll_N, np.float64) - exact_nll_N
      likelihood[score_name][name] = {
          'nll': float(np.mean(nll_N)), 'gap': float(gap_N.mean()),
          'gap_se': float(gap_N.std() / math.sqrt(gap_N.size)),
          'max_abs_gap': float(np.abs(gap_N).max()), 'seconds': seconds,
          'compile_seconds': compile_seconds}
  result['likelihood'] = likelihood
  result['samples'] = samples
  return result


def format_table(result: dict) -> str:
  """The report as lines of text."""
  row = '{:<18} {:<8} {:>8} {:>20} {:>20} {:>8}'
  lines = [row.format('sampler', 'score', 'p-value', '|mean err| (s.e.)', '|cov err|_F (s.e.)',
                      'seconds')]
  entries = [('langevin', 'exact', result['langevin'])] + [
      (sampler, score, numbers) for score, by_sampler in result['samplers'].items()
      for sampler, numbers in by_sampler.items()]
  for sampler, score, numbers in entries:
    lines.append(row.format(
        sampler, score, f'{numbers["p_value"]:.3f}',
        f'{numbers["mean_error"]:.4f} ({numbers["mean_se"]:.4f})',
        f'{numbers["cov_error"]:.4f} ({numbers["cov_se"]:.4f})', f'{numbers["seconds"]:.2f}'))
  lines.append(f'(p-values of the energy distance against exact draws (langevin) or the test '
               f'points, at least 1/(1 + {result["settings"]["num_permutations"]}); errors with '
               'the root-mean-square error of exact samples in brackets)')
  likelihood = result['likelihood']
  lines.append(f'mean NLL of the test points (nats): exact mixture '
               f'{likelihood["mixture_nll"]:.4f}; '
               f'prior mismatch KL(p_T || prior) = {likelihood["prior_kl"]:.2e} '
               f'± {likelihood["prior_kl_se"]:.1e}')
  for score in result['samplers']:
    parts = [f'{name} {numbers["nll"]:.4f} (gap {numbers["gap"]:+.4f} ± '
             f'{numbers["gap_se"]:.4f}, {numbers["seconds"]:.2f} s)'
             for name, numbers in likelihood[score].items()]
    lines.append(f'  ODE, {score} score, {likelihood["steps"]} {likelihood["method"]} steps: '
                 + '; '.join(parts))
  return '\n'.join(lines)


def plot(test_points, samples: dict, path: str, title: str) -> None:
  """A 1 × 4 scatter figure: the test points and the PC, ODE and annealed-Langevin samples, on
  the square of 1.25 times the test points' largest coordinate; each title counts the points
  and those outside that square."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # Files only; no display is needed.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  points = np.asarray(test_points)
  limit = 1.25 * float(np.abs(points).max())
  panels = [('test points', points)] + [(name, samples.get(name)) for name in SAMPLERS]
  fig, axes = plt.subplots(1, 4, figsize=(16, 4.3))
  for ax, (name, xy) in zip(axes, panels):
    if xy is None:
      ax.text(0.5, 0.5, 'not run for this SDE', ha='center', transform=ax.transAxes)
      ax.set_title(name)
    else:
      ax.scatter(xy[:, 0], xy[:, 1], s=2, alpha=0.5)
      # The square is the test points'; a sample beyond it (or not finite) is not drawn.
      outside = int(np.sum(~np.all(np.abs(np.asarray(xy)) <= limit, axis=-1)))
      ax.set_title(f'{name} ({len(xy)}' + (f', {outside} outside the square shown)'
                                           if outside else ')'))
    ax.set_xlim(-limit, limit)
    ax.set_ylim(-limit, limit)
    ax.set_aspect('equal')
  fig.suptitle(title)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100, bbox_inches='tight')
  plt.close(fig)


def _checked_config(workdir: str):
  """The run's config, or one sentence saying why this script cannot use the run."""
  from train import loop  # pylint: disable=g-import-not-at-top

  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'The work directory {workdir!r} does not exist.')
  config = loop.read_config(workdir)
  task = config.get('task') or {}
  name, objective = task.get('name'), task.get('objective')
  if (name, objective) != ('diffusion', 'score_sde'):
    with_objective = f' with objective {objective!r}' if objective else ''
    raise ValueError(f'The run in {workdir!r} trains task {name!r}{with_objective}; this script '
                     "needs task 'diffusion' with objective 'score_sde'.")
  data_name = config.data.get('name')
  if data_name != 'gaussian_mixture':
    raise ValueError(f'The run in {workdir!r} reads data set {data_name!r}, not the 2-D points '
                     "of 'gaussian_mixture' whose exact density this script compares against.")
  return config


def _load(workdir: str) -> dict:
  """{'score_fn', 'sde', 'mixture', 'test_points', 'step'} of the run in `workdir`."""
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top
  from train.tasks import diffusion  # pylint: disable=g-import-not-at-top
  from data import pipeline  # pylint: disable=g-import-not-at-top

  config = _checked_config(workdir)
  _, eval_source, meta, task, model = loop.build_parts(config, workdir)
  shape = tuple(meta['shapes'][task.input_key])
  if shape != (2,):
    raise ValueError(f'The run in {workdir!r} has points of shape {shape}, not 2-D points.')
  saved = checkpoint.restore_arrays(workdir)
  variables = jax.device_put(checkpoint.eval_variables(saved))
  # The task's own reading of the network output (score = −o/std(t) for score_sde).
  apply = lambda x, t_B: model.apply(variables, x, t_B)
  score_fn = task.model_fn(apply)
  records = pipeline.read_batch(eval_source, np.arange(len(eval_source)))
  return {'score_fn': score_fn, 'sde': diffusion.SDES[task.sde](),
          'mixture': toy2d.MIXTURES[config.data.options.get('mixture', 'ring')](),
          'test_points': task.preprocess(records)['x0'], 'step': int(saved['step'])}


def learned_score_fn(workdir: str):
  """(score_fn(x_BxD, t_B), sde) of the trained score_sde run in `workdir`; a missing work
  directory, another task or data that are not the 2-D mixture raise one sentence
  (FileNotFoundError or ValueError) before anything is compiled."""
  loaded = _load(workdir)
  return loaded['score_fn'], loaded['sde']


def run(workdir: str | None, *, num_samples: int = 2000, seed: int = 0,
        figure: str | None = None, **settings) -> dict:
  """The command: reports on the run, prints the table, appends the report (and draws the
  figure); a bad input exits with status 1 and one sentence."""
  try:
    if not workdir:
      raise ValueError('--workdir must name the work directory of a trained score_sde run.')
    if figure:
      command_line.output_file(figure, 'figure')
    command_line.record_file(workdir, OUTPUT_FILE, 'the report is appended to')
    loaded = _load(workdir)
    start = time.perf_counter()
    result = report(loaded['score_fn'], loaded['sde'], loaded['mixture'], loaded['test_points'],
                    jax.random.PRNGKey(seed), num_samples=num_samples, **settings)
  except (ValueError, FileNotFoundError, app.UsageError) as e:
    sys.exit(f'error: {e}')
  samples = result.pop('samples')
  result.update(step=loaded['step'], seed=seed, sde=type(loaded['sde']).__name__,
                total_seconds=time.perf_counter() - start)
  print(f'{workdir}, step {loaded["step"]}, {type(loaded["sde"]).__name__}, '
        f'{num_samples} samples, seed {seed}')
  print(format_table(result))
  path = os.path.join(os.path.abspath(workdir), OUTPUT_FILE)
  command_line.append_record(path, result)
  print(f'appended to {path}')
  if figure:
    plot(loaded['test_points'], samples, figure,
         f'{os.path.basename(os.path.abspath(workdir))}, step {loaded["step"]}: learned score')
    print(f'figure written to {figure}')
  return result


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'Work directory of a trained score_sde run of '
                      'gaussian_mixture.', required=True)
  flags.DEFINE_integer('num_samples', 2000, 'Samples per sampler.')
  flags.DEFINE_integer('seed', 0, 'Random seed of the samplers, probes and tests.')
  flags.DEFINE_string('figure', None, 'PNG of the samples to write (default: none).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}.')
  logging.set_verbosity(logging.WARNING)
  run(FLAGS.workdir, num_samples=FLAGS.num_samples, seed=FLAGS.seed, figure=FLAGS.figure)


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
