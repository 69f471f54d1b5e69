"""The mixture-diffusion report with the exact score of the diffused mixture (no network): that
score against central differences of the diffused density written out in float64 numpy, the
noise-level times against the SDE's kernel, the ODE likelihood against the exact NLL, the
samplers' two-sample p-values and moments, the command's one line per run appended to
mixture_diffusion.jsonl, and the one-sentence errors of unusable runs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data import toy2d
from experiments import mixture_diffusion as md
from models.generative import sde as sde_lib

RUN_CONFIG = {'task': {'name': 'diffusion', 'objective': 'score_sde', 'sde': 've',
                       'input_key': 'x'},
              'data': {'name': 'gaussian_mixture', 'options': {'mixture': 'ring'}}}


def _kernel(sde, t):
  """(a(t), std(t)) of Song et al. 2021b, App. B, written out for each SDE."""
  if isinstance(sde, sde_lib.VESDE):
    return 1.0, sde.sigma_min * np.sqrt((sde.sigma_max / sde.sigma_min)**(2 * t) - 1)
  big_b = sde.beta_min * t + 0.5 * t**2 * (sde.beta_max - sde.beta_min)
  one_minus_decay = 1 - np.exp(-big_b)  # the VP variance and the sub-VP std
  return np.exp(-big_b / 2), (one_minus_decay if isinstance(sde, sde_lib.SubVPSDE)
                              else np.sqrt(one_minus_decay))


def _log_density(x_D, mixture, a, s):
  """log Σ_k w_k N(x; a μ_k, a² Σ_k + s² I) by a loop over components, float64."""
  total = 0.0
  for w, mu, cov in zip(*(np.asarray(v, np.float64) for v in mixture)):
    c = a**2 * cov + s**2 * np.eye(len(x_D))
    d = x_D - a * mu
    total += w * np.exp(-0.5 * d @ np.linalg.solve(c, d)) / np.sqrt(np.linalg.det(2 * np.pi * c))
  return np.log(total)


def _scores(mixture, sde, x_BxD, t_B):
  """(exact_score_fn's scores in float32, central differences of `_log_density` in float64)."""
  score_BxD = np.asarray(jax.jit(md.exact_score_fn(mixture, sde))(
      jnp.asarray(x_BxD, jnp.float32), jnp.asarray(t_B, jnp.float32)))
  h = 1e-6
  expected = [[(_log_density(x + h * e, mixture, *_kernel(sde, t))
                - _log_density(x - h * e, mixture, *_kernel(sde, t))) / (2 * h)
               for e in np.eye(len(x))] for x, t in zip(x_BxD, t_B)]
  return score_BxD, expected


@pytest.mark.parametrize('sde', [sde_lib.VESDE(), sde_lib.VPSDE(), sde_lib.SubVPSDE()],
                         ids=['ve', 'vp', 'subvp'])
def test_exact_score_is_the_gradient_of_the_diffused_density(sde):
  # Narrow, tilted, unequally weighted components, so that a wrong std(t) (e.g. σ(t) for the
  # VE SDE) or a missing a(t) changes the score by far more than the tolerance.
  rotation = np.array([[np.cos(0.6), -np.sin(0.6)], [np.sin(0.6), np.cos(0.6)]])
  mixture = toy2d.gaussian_mixture(
      [0.5, 0.3, 0.2], [[0.0, 0.0], [0.3, 0.1], [-0.2, 0.25]],
      [np.diag([0.05**2, 0.02**2]), rotation @ np.diag([0.04**2, 0.01**2]) @ rotation.T,
       np.diag([0.03**2, 0.06**2])])
  t_B = np.array([0.003, 0.02, 0.1, 0.4, 0.9])
  x_BxD = np.array([[0.02, -0.01], [0.25, 0.12], [-0.1, 0.2], [0.3, -0.4], [2.0, -1.0]])
  score_BxD, expected = _scores(mixture, sde, x_BxD, t_B)
  # Measured: relative error ≤ 6e-7 (float32). σ(t) in place of std(t) (VE) gives 0.75, a
  # missing a(t) (VP, sub-VP) 0.16.
  np.testing.assert_allclose(score_BxD, expected, rtol=1e-5, atol=1e-6)


def test_exact_score_in_three_dimensions_rotates_into_and_out_of_each_eigenbasis():
  # In 2-D `eigh` returns symmetric eigenvector matrices (reflections), so U and Uᵀ coincide
  # there; a tilted 3-D covariance tells them apart.
  a_1 = np.array([[0.0, -0.8, 0.6], [1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
  mixture = toy2d.gaussian_mixture(
      [0.6, 0.4], [[0.0, 0.0, 0.0], [0.3, -0.2, 0.1]],
      [a_1 @ np.diag([0.01, 0.04, 0.09]) @ a_1.T, np.diag([0.02, 0.05, 0.03])])
  sde = sde_lib.VPSDE()
  t_B, x_BxD = np.array([0.01, 0.2]), np.array([[0.1, 0.2, -0.1], [0.4, -0.1, 0.3]])
  score_BxD, expected = _scores(mixture, sde, x_BxD, t_B)
  np.testing.assert_allclose(score_BxD, expected, rtol=1e-5, atol=1e-5)


def test_annealed_langevin_runs_only_for_the_ve_sde():
  # It anneals σ_max > … > σ_min, which only the VE SDE has.
  steps = dict(pc_steps=1, ode_steps=1, annealed_levels=2, annealed_steps_per_level=1,
               annealed_epsilon=1e-3)
  for sde, names in ((sde_lib.VESDE(), md.SAMPLERS), (sde_lib.VPSDE(), ('pc', 'ode')),
                     (sde_lib.SubVPSDE(), ('pc', 'ode'))):
    assert tuple(md.samplers(None, sde, 4, **steps)) == names


def test_noise_level_times_have_kernel_std_sigma():
  sde = sde_lib.VESDE()
  sigmas = np.array([50.0, 3.0, 0.2, 0.05, 0.01, 0.002])
  times = np.asarray(md.noise_level_times(sde, sigmas), np.float64)
  _, stds = _kernel(sde, times)
  # Measured relative error 3e-7 (the float32 times).
  np.testing.assert_allclose(stds, sigmas, rtol=1e-5)
  assert times[0] <= sde.T and np.all(np.diff(times) < 0)


def test_report_with_the_exact_score_matches_the_mixture_and_a_rerun_appends_its_own(
    tmp_path, monkeypatch, capsys):
  # The command, with the exact score standing in for the run's.
  mixture, sde = toy2d.ring(), sde_lib.VESDE()
  test_points = toy2d.dataset('ring', num_train=1, num_test=300)['test']
  monkeypatch.setattr(md, '_load', lambda workdir: {
      'score_fn': md.exact_score_fn(mixture, sde), 'sde': sde, 'mixture': mixture,
      'test_points': test_points, 'step': 7})
  reports, report = [], md.report
  monkeypatch.setattr(md, 'report', lambda *a, **k: reports.append(dict(report(*a, **k)))
                      or dict(reports[-1]))
  (tmp_path / 'mixture_diffusion.json').write_text('{"an": "earlier report"}\n')
  settings = dict(num_samples=300, langevin_steps=300, langevin_step_size=3e-3, pc_steps=100,
                  ode_steps=30, annealed_levels=30, annealed_steps_per_level=5,
                  annealed_epsilon=2e-4, likelihood_steps=30, num_permutations=100,
                  compare_with_exact=False)
  result = md.run(str(tmp_path), seed=0, **settings)
  samples = reports[0]['samples']
  assert sorted(samples) == sorted(md.SAMPLERS) and samples['pc'].shape == (300, 2)
  # One line: the report the run returned, with its settings, the checkpoint step and the SDE.
  path = tmp_path / md.OUTPUT_FILE
  written = path.read_bytes()
  assert written.endswith(b'\n') and written.count(b'\n') == 1 and json.loads(written) == result
  assert (result['seed'], result['settings']['num_samples'], result['settings']['pc_steps'],
          result['step'], result['sde']) == (0, 300, 100, 7, 'VESDE')

  # A rerun with another seed (the same shapes: nothing is compiled again) appends its report
  # after the first, which stays byte for byte (it was written over), and leaves a
  # mixture_diffusion.json of the earlier format as it was.
  rerun = md.run(str(tmp_path), seed=1, **settings)
  both = path.read_bytes()
  assert both.startswith(written) and both[len(written):].count(b'\n') == 1
  assert json.loads(both[len(written):]) == rerun
  assert (rerun['seed'], rerun['step']) == (1, 7) and rerun['langevin'] != result['langevin']
  out = capsys.readouterr().out
  assert f'{tmp_path}, step 7, VESDE, 300 samples, seed 0\n' in out
  assert f'{tmp_path}, step 7, VESDE, 300 samples, seed 1\n' in out
  assert (tmp_path / 'mixture_diffusion.json').read_text() == '{"an": "earlier report"}\n'

  likelihood = result['likelihood']
  exact, hutchinson = likelihood['learned']['exact_trace'], likelihood['learned']['hutchinson']
  # The exact NLL written out by a loop over points and components (measured difference 8e-8).
  nll = -np.mean([_log_density(x, mixture, 1.0, 0.0) for x in np.asarray(test_points, np.float64)])
  assert likelihood['mixture_nll'] == pytest.approx(nll, abs=1e-5)
  # With the exact score only the RK4 error (30 steps) and KL(p_T ‖ prior) ≈ 1e-6 remain.
  # Measured: mean gap −3.5e-4, largest |gap| of a point 2.8e-3, KL 2e-6 ± 6e-6.
  assert abs(exact['gap']) < 2e-3 and exact['max_abs_gap'] < 5e-3
  assert abs(likelihood['prior_kl']) < 1e-4
  # Hutchinson is unbiased: its gap is the exact one plus probe noise. Measured: −0.157,
  # 2.9 standard errors of 0.054 (over 20 probe seeds the z-scores had mean 0.0, std 0.9).
  assert abs(hutchinson['gap'] - exact['gap']) < 4 * hutchinson['gap_se']

  rows = [result['langevin']] + list(result['samplers']['learned'].values())
  # Measured p-values 0.20 (Langevin), 0.72 (PC), 0.52 (ODE), 0.44 (annealed Langevin).
  assert all(row['p_value'] > 0.01 for row in rows), [row['p_value'] for row in rows]
  # Measured: mean errors ≤ 0.75 and covariance errors ≤ 1.63 root-mean-square errors.
  assert all(row['mean_error'] < 4 * row['mean_se'] for row in rows)
  assert all(row['cov_error'] < 4 * row['cov_se'] for row in rows)


def test_moment_errors_are_the_written_out_norms_and_standard_errors():
  x = np.random.default_rng(3).normal(size=(50, 2)) @ np.array([[1.0, 0.5], [0.0, 2.0]]) + [1, -1]
  mean, cov = np.array([0.9, -1.2]), np.array([[1.2, 0.3], [0.3, 3.5]])
  errors = md.moment_errors(x, mean, cov)
  assert errors['mean_error'] == pytest.approx(np.hypot(*(x.mean(0) - mean)), rel=1e-12)
  assert errors['mean_se'] == pytest.approx(np.sqrt((1.2 + 3.5) / 50), rel=1e-12)
  assert errors['cov_error'] == pytest.approx(np.sqrt(((np.cov(x.T) - cov) ** 2).sum()), rel=1e-12)
  # The spread of each centred product (x_i − x̄_i)(x_j − x̄_j) over the 50 samples, summed over
  # the four (i, j), divided by N.
  centred = x - x.mean(0)
  spread = sum(np.var([c[i] * c[j] for c in centred]) for i in range(2) for j in range(2))
  assert errors['cov_se'] == pytest.approx(np.sqrt(spread / 50), rel=1e-12)


def test_settings_and_unusable_runs_are_one_sentence(tmp_path):
  mixture, sde = toy2d.ring(), sde_lib.VESDE()
  with pytest.raises(ValueError, match=r'^pc_steps=0 must be a positive integer\.$'):
    md.report(None, sde, mixture, np.zeros((5, 2)), jax.random.PRNGKey(0), pc_steps=0)
  with pytest.raises(ValueError, match=r'^test_points of shape \(5, 3\) must be \[N, 2\]'):
    md.report(None, sde, mixture, np.zeros((5, 3)), jax.random.PRNGKey(0))

  missing = str(tmp_path / 'missing')
  with pytest.raises(FileNotFoundError, match=r'^The work directory .*missing\' does not exist\.$'):
    md.learned_score_fn(missing)
  with pytest.raises(SystemExit, match=r'^error: The work directory .*missing\' does not exist\.$'):
    md.run(missing)
  # A figure that cannot be written is refused before the run is read, so an earlier record
  # stays as it was.
  (tmp_path / md.OUTPUT_FILE).write_text('an earlier record')
  with pytest.raises(SystemExit, match=r'^error: --figure=.*samples\.pngg must end in a figure '):
    md.run(str(tmp_path), figure=str(tmp_path / 'samples.pngg'))
  assert (tmp_path / md.OUTPUT_FILE).read_text() == 'an earlier record'
  for name, change, message in (
      ('ddpm', {'task': {**RUN_CONFIG['task'], 'objective': 'ddpm'}},
       r"trains task 'diffusion' with objective 'ddpm'; this script needs task 'diffusion' with "
       r"objective 'score_sde'\.$"),
      ('mnist', {'data': {'name': 'mnist', 'options': {}}},
       r"reads data set 'mnist', not the 2-D points of 'gaussian_mixture' whose exact density "
       r"this script compares against\.$")):
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / 'config.json').write_text(json.dumps({**RUN_CONFIG, **change}))
    with pytest.raises(ValueError, match=r'^The run in .*' + message):
      md.learned_score_fn(str(workdir))
    assert os.listdir(workdir) == ['config.json']


@pytest.mark.parametrize('sde', [sde_lib.VESDE(), sde_lib.VPSDE()], ids=['ve', 'vp'])
def test_prior_mismatch_is_the_kl_of_two_gaussians(sde):
  # One isotropic component N(μ, s² I) diffuses to N(a μ, (a² s² + std²) I) at t = T; against
  # the prior N(0, v I) (v = σ_max² for VE, 1 for VP) KL = ½ (D u/v + ‖a μ‖²/v − D + D log(v/u))
  # in D = 2 dimensions, u the diffused variance. The mean is far out, so the KL is about 2;
  # for VP, a² s² = 1 is half of u, so scaling Σ by a instead of a² would show.
  a, std = _kernel(sde, sde.T)
  mu = np.array([100.0, 0.0]) if isinstance(sde, sde_lib.VESDE) else np.array([2.0, 0.0]) / a
  s = 5.0 if isinstance(sde, sde_lib.VESDE) else 1 / a
  mixture = toy2d.gaussian_mixture([1.0], [mu], [s ** 2 * np.eye(2)])
  u, v = a ** 2 * s ** 2 + std ** 2, (sde.sigma_max ** 2 if isinstance(sde, sde_lib.VESDE) else 1)
  kl = 0.5 * (2 * u / v + np.sum((a * mu) ** 2) / v - 2 + 2 * np.log(v / u))
  estimate, se = (float(x) for x in md.prior_mismatch(mixture, sde, jax.random.PRNGKey(0)))
  assert 1 < kl < 3
  assert 0 < se < 0.03 and abs(estimate - kl) < 4 * se, (estimate, se, kl)


def test_each_panel_counts_the_samples_outside_the_square_it_shows(tmp_path, monkeypatch):
  # The panels are limited to the test points' square and titled with the sample count only:
  # samples of an untrained score that landed beyond it (or were not finite) were not drawn,
  # and the figure showed empty panels titled '(50)'.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  figures = []
  monkeypatch.setattr(plt, 'close', figures.append)
  test_points = np.array([[1.0, -2.0], [0.5, 0.5]])  # the square: |x|, |y| ≤ 2.5
  samples = {'pc': np.array([[0.0, 0.0], [2.5, -2.5], [2.6, 0.0], [0.0, -30.0], [np.nan, 0]]),
             'ode': np.array([[1.0, 1.0], [-2.0, 2.0]])}
  md.plot(test_points, samples, str(tmp_path / 'samples.png'), 'title')
  titles = [ax.get_title() for ax in figures[0].axes]
  assert titles == ['test points (2)', 'pc (5, 3 outside the square shown)', 'ode (2)',
                    'annealed_langevin']
  assert os.path.getsize(tmp_path / 'samples.png') > 1000


def test_a_report_file_that_is_a_folder_is_refused_before_the_run_is_read(tmp_path,
                                                                         monkeypatch):
  # It was an IsADirectoryError traceback after every sampler and likelihood had run.
  (tmp_path / md.OUTPUT_FILE).mkdir()
  monkeypatch.setattr(md, '_load', lambda *a, **k: pytest.fail('read'))
  with pytest.raises(SystemExit) as info:
    md.run(str(tmp_path))
  assert info.value.code == (f"error: '{tmp_path / md.OUTPUT_FILE}', the file the report is "
                             'appended to, is a folder.')


def test_report_passes_each_setting_on_and_sums_up_each_samplers_own_draws(monkeypatch):
  # Stand-ins for the samplers, the likelihood and the two-sample test: fixed draws per sampler,
  # fixed log-likelihoods per divergence, and as the "test" the numbers of points compared.
  mixture, sde = toy2d.ring(), sde_lib.VESDE()
  rng = np.random.default_rng(0)
  draws = {name: rng.normal(size=(4, 2)) for name in ('langevin', *md.SAMPLERS)}
  test_points = rng.normal(size=(5, 2)) + [2.0, 0.0]
  log_likelihoods = {'exact': rng.normal(size=5) - 3, 'hutchinson': rng.normal(size=5) - 3}
  calls = {}

  def fake(name, result):
    def call(*args, **kwargs):
      calls[name] = (args, kwargs)
      return jnp.asarray(result(kwargs) if callable(result) else result, jnp.float32)
    return call

  monkeypatch.setattr(md.langevin, 'langevin_sample', fake('langevin', draws['langevin']))
  monkeypatch.setattr(md.langevin, 'annealed_langevin_sample',
                      fake('annealed_langevin', draws['annealed_langevin']))
  monkeypatch.setattr(md.sde_lib, 'pc_sample', fake('pc', draws['pc']))
  monkeypatch.setattr(md.sde_lib, 'ode_sample', fake('ode', draws['ode']))
  monkeypatch.setattr(md.sde_lib, 'ode_log_likelihood',
                      fake('likelihood', lambda kwargs: log_likelihoods[kwargs['divergence']]))
  monkeypatch.setattr(md.langevin, 'two_sample_test',
                      lambda x, y, key, num: (y.shape[0] + 0.0, jnp.sum(x)))
  monkeypatch.setattr(md, 'prior_mismatch', lambda *args: (0.0, 0.0))  # 20,000 draws
  learned = lambda x_BxD, t_B: -x_BxD
  result = md.report(learned, sde, mixture, test_points, jax.random.PRNGKey(0), num_samples=4,
                     langevin_steps=11, langevin_step_size=0.03, pc_steps=12, ode_steps=13,
                     annealed_levels=14, annealed_steps_per_level=15, annealed_epsilon=0.02,
                     likelihood_steps=16, ode_method='heun', compare_with_exact=False)
  assert calls['langevin'][0][3:] == (0.03, 11)
  assert calls['pc'][1] == {'num_steps': 12}
  assert calls['ode'][1] == {'num_steps': 13, 'method': 'heun'}
  # The annealed levels σ_1 … σ_L (traced here: only their number is known).
  assert calls['annealed_langevin'][0][3].shape == (14,)
  assert calls['annealed_langevin'][0][4:] == (0.02, 15)
  assert calls['likelihood'][1]['num_steps'] == 16 and calls['likelihood'][1]['method'] == 'heun'
  assert all(calls[name][0][1] is learned for name in ('pc', 'ode', 'likelihood'))

  # Langevin against `num_samples` exact draws, the samplers against the 5 test points; the
  # moments of each row are those of its own draws (the ring's mean is 0).
  rows = {'langevin': result['langevin'], **result['samplers']['learned']}
  assert {name: row['energy_distance'] for name, row in rows.items()} == {
      'langevin': 4, 'pc': 5, 'ode': 5, 'annealed_langevin': 5}
  for name, row in rows.items():
    assert row['p_value'] == pytest.approx(draws[name].sum(), abs=1e-5)
    assert row['mean_error'] == pytest.approx(np.hypot(*draws[name].mean(0)), rel=1e-6)
  for name in md.SAMPLERS:
    np.testing.assert_allclose(result['samples'][name], draws[name], rtol=1e-6)

  # NLL −log p and its gap to the exact NLL of each test point, written out by a loop.
  exact_nll = -np.array([_log_density(x, mixture, 1.0, 0.0) for x in test_points])
  for divergence, name in (('exact', 'exact_trace'), ('hutchinson', 'hutchinson')):
    numbers = result['likelihood']['learned'][name]
    gap = -log_likelihoods[divergence] - exact_nll
    assert numbers['nll'] == pytest.approx(-log_likelihoods[divergence].mean(), rel=1e-5)
    assert numbers['gap'] == pytest.approx(gap.mean(), rel=1e-4)
    assert numbers['gap_se'] == pytest.approx(gap.std() / np.sqrt(5), rel=1e-4)
    assert numbers['max_abs_gap'] == pytest.approx(np.abs(gap).max(), rel=1e-4)
