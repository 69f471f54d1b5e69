"""Defining properties of the augmentations in data/augment.py."""

import functools
import inspect

import jax
import jax.numpy as jnp
import matplotlib.colors
import ml_collections
import numpy as np
import pytest
from scipy import special

from data import augment


def _rgb(seed=0, shape=(12, 12, 3), low=0.0, high=1.0):
  return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _shifted(image, dy, dx, fill=0.0):
  """Brute-force reference: content moved by (dy, dx) pixels, vacated pixels filled."""
  out = np.full_like(image, fill)
  height, width = image.shape[:2]
  for i in range(height):
    for j in range(width):
      if 0 <= i - dy < height and 0 <= j - dx < width:
        out[i, j] = image[i - dy, j - dx]
  return out


def _keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def _per_example_batches(name, image_HxWxC, batches=19):
  """`name`, with its default parameters, on `batches` jitted batches of 16 copies of `image`.

  For a 12 x 12 x 3 image this is test_per_example_keys_under_jit's program, compiled once.
  """
  transform = augment.TRANSFORMS[name]
  apply = jax.jit(functools.partial(augment.apply_per_example, transform.fn, p=transform.p))
  images = np.broadcast_to(image_HxWxC, (16,) + image_HxWxC.shape)
  return np.concatenate([apply(_keys(16, seed), images) for seed in range(batches)])


# Geometry.


@pytest.mark.parametrize('name', ['horizontal_flip', 'vertical_flip'])
def test_flipping_twice_is_identity_and_once_is_not(name):
  image = _rgb()
  flip = augment.TRANSFORMS[name].fn
  once = flip(jax.random.key(0), image)
  assert not np.allclose(once, image)
  np.testing.assert_array_equal(flip(jax.random.key(1), once), image)


def test_horizontal_flip_mirrors_columns():
  image = _rgb(shape=(5, 7, 3))
  flipped = np.asarray(augment.horizontal_flip(jax.random.key(0), image))
  for j in range(7):
    np.testing.assert_array_equal(flipped[:, j], image[:, 6 - j])


def test_vertical_flip_mirrors_rows():
  image = _rgb(shape=(5, 7, 3))
  flipped = np.asarray(augment.vertical_flip(jax.random.key(0), image))
  assert flipped.shape == image.shape
  for i in range(5):
    np.testing.assert_array_equal(flipped[i], image[4 - i])


def test_neutral_affine_parameters_are_identity():
  image = _rgb(shape=(9, 14, 3))
  np.testing.assert_allclose(
      augment.warp_affine(image, degrees=0.0, shift_y=0.0, shift_x=0.0, scale=1.0,
                          shear_degrees=0.0), image, atol=1e-6)


@pytest.mark.parametrize('name, params', [
    ('rotation', {'max_degrees': 0.0}),
    ('translation', {'max_fraction': 0.0}),
    ('zoom', {'scale': (1.0, 1.0)}),
    ('affine', {'max_degrees': 0.0, 'max_fraction': 0.0, 'scale': (1.0, 1.0),
                'max_shear_degrees': 0.0}),
    ('random_crop', {'padding': 0}),
    ('elastic', {'alpha': 0.0}),
])
def test_zero_magnitude_geometric_transforms_are_identity(name, params):
  image = _rgb(shape=(10, 13, 3))
  out = augment.TRANSFORMS[name].fn(jax.random.key(3), image, **params)
  np.testing.assert_allclose(out, image, atol=1e-6)


@pytest.mark.parametrize('degrees, quarter_turns', [(90, 1), (-90, -1), (180, 2), (270, 3)])
def test_rotation_by_right_angles_equals_rot90(degrees, quarter_turns):
  image = _rgb(shape=(11, 11, 3))
  np.testing.assert_allclose(augment.warp_affine(image, degrees=degrees),
                             np.rot90(image, quarter_turns), atol=1e-5)


@pytest.mark.parametrize('dy, dx', [(2, -3), (-4, 0), (0, 5), (13, 1)])
def test_integer_translation_equals_shift_with_zero_fill(dy, dx):
  image = _rgb(shape=(12, 10, 3))
  np.testing.assert_allclose(augment.warp_affine(image, shift_y=dy, shift_x=dx),
                             _shifted(image, dy, dx), atol=1e-6)


def test_integer_translation_fills_vacated_pixels_with_fill():
  image = _rgb(shape=(9, 8, 3))
  np.testing.assert_allclose(augment.warp_affine(image, shift_y=-3, shift_x=2, fill=0.3),
                             _shifted(image, -3, 2, fill=0.3), atol=1e-6)


@pytest.mark.parametrize('name, params', [
    ('rotation', {'max_degrees': 60.0}),
    ('translation', {'max_fraction': 0.5}),
    ('zoom', {'scale': (0.5, 0.6)}),
    ('random_crop', {'padding': 3}),
    ('affine', {'scale': (0.5, 0.6)}),
    ('elastic', {'alpha': 34.0, 'sigma': 1.0}),
])
def test_geometric_transforms_read_fill_outside_the_image(name, params):
  # On a zero image each pixel is fill times the share of its read that falls outside: in
  # [0, fill], and fill itself where the read lies wholly outside (some pixel of 8 draws does).
  fill = 0.6
  draw = jax.vmap(lambda key: augment.TRANSFORMS[name].fn(key, jnp.zeros((10, 10, 1)), fill=fill,
                                                          **params))
  out = np.asarray(draw(_keys(8)))
  assert out.min() >= 0 and out.max() <= fill + 1e-6
  assert np.isclose(out, fill, atol=1e-6).any()


def test_affine_moves_a_linear_image_by_the_documented_map():
  # Bilinear resampling reproduces a linear image exactly wherever the source lies inside.
  height, width = 16, 20
  rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  linear = lambda r, c: 0.1 + 0.01 * r + 0.02 * c
  image = linear(rows, cols)[..., None].astype(np.float32)
  degrees, shear, scale, shift_y, shift_x = 30.0, 20.0, 1.3, 1.5, -2.0
  theta, phi = np.deg2rad(degrees), np.deg2rad(shear)
  forward = (np.array([[np.cos(theta), np.sin(theta)], [-np.sin(theta), np.cos(theta)]])
             @ np.array([[1, np.tan(phi)], [0, 1]]) * scale)
  centre = np.array([(width - 1) / 2, (height - 1) / 2])
  out = np.asarray(augment.warp_affine(image, degrees=degrees, shear_degrees=shear, scale=scale,
                                       shift_y=shift_y, shift_x=shift_x))
  checked = 0
  for i in range(height):
    for j in range(width):
      source_x, source_y = centre + np.linalg.solve(
          forward, np.array([j, i]) - centre - np.array([shift_x, shift_y]))
      if 0 <= source_y <= height - 1 and 0 <= source_x <= width - 1:
        np.testing.assert_allclose(out[i, j, 0], linear(source_y, source_x), atol=1e-5)
        checked += 1
  assert checked > height * width // 3


def test_random_crop_is_an_integer_shift_within_the_padding():
  image = _rgb(shape=(8, 8, 1), low=0.1)
  padding = 2
  seen = set()
  for key in _keys(12):
    out = np.asarray(augment.random_crop(key, image, padding=padding))
    shifts = range(-padding, padding + 1)
    matches = [(dy, dx) for dy in shifts for dx in shifts
               if np.array_equal(out, _shifted(image, dy, dx))]
    assert len(matches) == 1
    seen.add(matches[0])
  assert len(seen) > 1


def _coordinate_image(height, width):
  """Channels x / W, y / H and 1: a warped copy tells where each of its pixels was read from."""
  rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  return np.stack([cols / width, rows / height, np.ones((height, width))], -1).astype(np.float32)


def _drawn_geometry(warped_HxWx3):
  """The affine parameters that turned `_coordinate_image` into `warped`, by least squares.

  Bilinear resampling reproduces a linear image exactly where the source lies inside, which is
  where the constant channel is still 1; there the first two channels give the source
  s = c + A⁻¹ (p - c - t) of each pixel p. The documented A = R(degrees) Sh(shear) scale splits
  like a QR factorisation: A's first column is scale (cos, -sin), Rᵀ A = scale [[1, tan], [0, 1]].
  """
  height, width, _ = warped_HxWx3.shape
  rows, cols = np.nonzero(np.abs(warped_HxWx3[..., 2] - 1) < 1e-5)
  assert len(rows) >= 3, 'too few pixels come from inside the image to recover the warp'
  centre = np.array([(width - 1) / 2, (height - 1) / 2])
  target_Nx2 = np.stack([cols, rows], axis=1) - centre
  source_Nx2 = np.stack([warped_HxWx3[rows, cols, 0] * width,
                         warped_HxWx3[rows, cols, 1] * height], axis=1) - centre
  design_Nx3 = np.concatenate([target_Nx2, np.ones((len(rows), 1))], axis=1)
  solution_3x2 = np.linalg.lstsq(design_Nx3, source_Nx2, rcond=None)[0]
  forward = np.linalg.inv(solution_3x2[:2].T)
  shift_x, shift_y = -forward @ solution_3x2[2]  # the fitted offset is -A⁻¹ t
  scale = np.hypot(forward[0, 0], forward[1, 0])
  theta = np.arctan2(-forward[1, 0], forward[0, 0])
  unrotated = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]]) @ forward
  # No vertical shear and one scale for both axes, as documented.
  np.testing.assert_allclose(unrotated[1] / scale, [0, 1], atol=1e-4)
  return {'degrees': np.rad2deg(theta), 'scale': scale,
          'shear_degrees': np.rad2deg(np.arctan(unrotated[0, 1] / scale)),
          'shift_y': shift_y, 'shift_x': shift_x}


_NEUTRAL_GEOMETRY = {'degrees': 0.0, 'scale': 1.0, 'shear_degrees': 0.0, 'shift_y': 0.0,
                     'shift_x': 0.0}
_GEOMETRY_ATOL = {'degrees': 1e-3, 'scale': 1e-5, 'shear_degrees': 1e-3, 'shift_y': 1e-3,
                  'shift_x': 1e-3}


def test_drawn_geometry_recovers_known_affine_parameters():
  params = {'degrees': -35.0, 'scale': 1.2, 'shear_degrees': 12.0, 'shift_y': 1.5, 'shift_x': -2.0}
  drawn = _drawn_geometry(np.asarray(augment.warp_affine(_coordinate_image(12, 10), **params)))
  for param, value in params.items():
    np.testing.assert_allclose(drawn[param], value, atol=_GEOMETRY_ATOL[param])


def _assert_uniform_sample(values, low, high, atol):
  """Within [low, high], near both ends, mean and variance within 5 standard errors of U's.

  For n uniform draws no value lies in a given end twentieth with probability 0.95ⁿ (2e-7 for
  n = 304). With w = high - low the variance is w²/12 and the fourth central moment w⁴/80, so
  the sample mean and variance have standard errors w / sqrt(12 n) and w² / sqrt(180 n).
  """
  width, n = high - low, len(values)
  assert low - atol <= values.min() and values.max() <= high + atol, (values.min(), values.max())
  assert values.min() < low + width / 20 and values.max() > high - width / 20
  assert abs(values.mean() - (low + high) / 2) < 5 * width / np.sqrt(12 * n)
  assert abs(values.var(ddof=1) - width ** 2 / 12) < 5 * width ** 2 / np.sqrt(180 * n)


# The defaults: max_degrees 15, max_fraction 0.1 (1.2 pixels of 12, 2 of 20: unequal, so
# swapping height and width shows), scale (0.8, 1.2) for zoom, (0.9, 1.1) and
# max_shear_degrees 10 for affine.
@pytest.mark.parametrize('name, width, ranges', [
    ('rotation', 12, {'degrees': (-15.0, 15.0)}),
    ('translation', 20, {'shift_y': (-1.2, 1.2), 'shift_x': (-2.0, 2.0)}),
    ('zoom', 12, {'scale': (0.8, 1.2)}),
    ('affine', 12, {'degrees': (-15.0, 15.0), 'shift_y': (-1.2, 1.2), 'shift_x': (-1.2, 1.2),
                    'scale': (0.9, 1.1), 'shear_degrees': (-10.0, 10.0)}),
])
def test_geometric_parameters_are_uniform_over_their_documented_ranges(name, width, ranges):
  warped = _per_example_batches(name, _coordinate_image(12, width))
  drawn = [_drawn_geometry(example) for example in warped]
  for param, neutral in _NEUTRAL_GEOMETRY.items():
    values = np.array([d[param] for d in drawn])
    if param in ranges:
      _assert_uniform_sample(values, *ranges[param], atol=_GEOMETRY_ATOL[param])
    else:
      np.testing.assert_allclose(values, neutral, atol=_GEOMETRY_ATOL[param])


def test_random_crop_offsets_are_uniform_over_the_padding():
  padding = 4  # the default
  drawn = [_drawn_geometry(example)
           for example in _per_example_batches('random_crop', _coordinate_image(12, 12))]
  for param in ('degrees', 'scale', 'shear_degrees'):
    np.testing.assert_allclose([d[param] for d in drawn], _NEUTRAL_GEOMETRY[param],
                               atol=_GEOMETRY_ATOL[param])
  for param in ('shift_y', 'shift_x'):
    shifts = np.array([d[param] for d in drawn])
    offsets = np.round(shifts)
    np.testing.assert_allclose(shifts, offsets, atol=_GEOMETRY_ATOL[param])
    assert np.all(np.abs(offsets) <= padding)
    # Each of the 2 padding + 1 offsets has probability q: Binomial(n, q) counts, 5 sd bounds.
    counts = np.bincount((offsets + padding).astype(int), minlength=2 * padding + 1)
    n, q = len(shifts), 1 / (2 * padding + 1)
    assert np.all(np.abs(counts - n * q) < 5 * np.sqrt(n * q * (1 - q))), counts


@pytest.mark.parametrize('name', ['translation', 'random_crop', 'affine'])
def test_row_and_column_shifts_are_drawn_independently(name):
  # Separate keys for the two axes: over 304 draws the sample correlation of the shifts is
  # within 4 standard errors (1 / sqrt(n)) of 0; one key for both would make it 1.
  drawn = [_drawn_geometry(example)
           for example in _per_example_batches(name, _coordinate_image(12, 12))]
  shift_y, shift_x = (np.array([d[param] for d in drawn]) for param in ('shift_y', 'shift_x'))
  assert abs(np.corrcoef(shift_y, shift_x)[0, 1]) < 4 / np.sqrt(len(drawn))


def test_affine_parameters_are_drawn_independently():
  # One key per parameter: every pair of the five is uncorrelated over 304 draws (4 standard
  # errors); two drawn from one key would have a correlation of 1.
  drawn = [_drawn_geometry(example)
           for example in _per_example_batches('affine', _coordinate_image(12, 12))]
  values_Px5 = np.array([[d[param] for param in _NEUTRAL_GEOMETRY] for d in drawn])
  correlations = np.corrcoef(values_Px5.T)[~np.eye(5, dtype=bool)]
  assert np.all(np.abs(correlations) < 4 / np.sqrt(len(drawn))), correlations


def test_gaussian_smooth_of_an_impulse_is_a_unit_gaussian():
  size, sigma = 41, 3.0
  impulse = np.zeros((size, size), np.float32)
  impulse[size // 2, size // 2] = 1
  blurred = np.asarray(augment.gaussian_smooth(jnp.asarray(impulse), sigma))
  np.testing.assert_allclose(blurred.sum(), 1.0, atol=1e-5)
  offsets = np.arange(size) - size // 2
  np.testing.assert_allclose((blurred.sum(axis=1) * offsets ** 2).sum(), sigma ** 2, rtol=1e-3)
  np.testing.assert_allclose(blurred, blurred.T, atol=1e-7)


def test_gaussian_smooth_is_the_documented_sum_when_sigma_spans_the_image():
  # out[i, j] = sum over k, l of w_H(i - k) w_W(j - l) f[k, l], w_N(d) = exp(-d²/2σ²) normalised
  # over |d| < N; with sigma as wide as the image the largest offsets carry weight too.
  height, width, sigma = 5, 7, 4.0
  field = np.random.default_rng(0).uniform(-1, 1, (height, width))

  def weights(size):
    offsets = np.arange(-(size - 1), size)
    kernel = np.exp(-offsets ** 2 / (2 * sigma ** 2))
    return dict(zip(offsets, kernel / kernel.sum()))

  w_H, w_W = weights(height), weights(width)
  expected = np.zeros((height, width))
  for i in range(height):
    for j in range(width):
      for k in range(height):
        for l in range(width):
          expected[i, j] += w_H[i - k] * w_W[j - l] * field[k, l]
  blurred = augment.gaussian_smooth(jnp.asarray(field, jnp.float32), sigma)
  np.testing.assert_allclose(blurred, expected, atol=1e-6)


def test_elastic_deformation_displaces_pixels_by_alpha_times_the_smoothed_noise():
  # Where a pixel of the warped coordinate image was read from inside the image, its first
  # two channels give the source (the bilinear read of a linear image is exact), so the
  # displacement field itself is recovered and compared with the documented one:
  # alpha · gaussian_smooth(U(-1, 1), sigma), one field per axis, rows first.
  height, width, alpha, sigma = 28, 24, 34.0, 4.0
  key = jax.random.key(0)
  out = np.asarray(augment.elastic(key, jnp.asarray(_coordinate_image(height, width)),
                                   alpha=alpha, sigma=sigma))
  row_key, col_key = jax.random.split(key)
  field = lambda k: alpha * np.asarray(augment.gaussian_smooth(
      jax.random.uniform(k, (height, width), jnp.float32, -1, 1), sigma))
  inside = np.abs(out[..., 2] - 1) < 1e-5
  assert inside.mean() > 0.5
  rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  np.testing.assert_allclose((out[..., 1] * height - rows)[inside], field(row_key)[inside], atol=1e-3)
  np.testing.assert_allclose((out[..., 0] * width - cols)[inside], field(col_key)[inside], atol=1e-3)
  # Smoothing averages the noise away: Var = (1/3) Σ kernel² ≈ 1 / (12π sigma²) per axis, so
  # displacements of about 1.4 pixels here, not the alpha/√3 ≈ 20 of raw noise.
  expected_std = alpha / (np.sqrt(12 * np.pi) * sigma)
  assert 0.5 * expected_std < (out[..., 1] * height - rows)[inside].std() < 2 * expected_std


# Cutout, erasing, mixing.


def test_cutout_zeroes_exactly_its_box():
  image = _rgb(shape=(16, 16, 3), low=0.1)
  size, interior_boxes = 6, 0
  for key in _keys(40):
    out = np.asarray(augment.cutout(key, image, size=size))
    zero = np.all(out == 0, axis=-1)
    rows, cols = np.nonzero(zero)
    box = np.zeros_like(zero)
    box[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = True
    np.testing.assert_array_equal(zero, box)
    np.testing.assert_array_equal(out[~box], image[~box])
    height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
    assert height <= size and width <= size
    if rows.min() > 0 and cols.min() > 0 and rows.max() < 15 and cols.max() < 15:
      assert (height, width) == (size, size)
      interior_boxes += 1
  assert interior_boxes > 0


def test_cutout_fills_its_box_with_fill():
  # A 4 x 4 box centred on any pixel keeps at least 2 x 2 pixels inside the 10 x 10 image.
  image = _rgb(shape=(10, 10, 3), high=0.5)
  for key in _keys(5):
    out = np.asarray(augment.cutout(key, image, size=4, fill=0.75))
    filled = np.all(out == 0.75, axis=-1)
    assert 4 <= filled.sum() <= 16
    np.testing.assert_array_equal(out[~filled], image[~filled])


def test_random_erasing_fills_exactly_its_box():
  image = _rgb(shape=(20, 20, 3), low=0.6)
  area = (0.05, 0.3)
  smallest, largest = round(np.sqrt(area[0] * 400)), round(np.sqrt(area[1] * 400))
  sides = set()
  for key in _keys(30):
    out = np.asarray(augment.random_erasing(key, image, area=area, aspect=(1.0, 1.0), fill=0.5))
    erased = np.all(out == 0.5, axis=-1)
    rows, cols = np.nonzero(erased)
    box = np.zeros_like(erased)
    box[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = True
    np.testing.assert_array_equal(erased, box)
    np.testing.assert_array_equal(out[~box], image[~box])
    side = rows.max() - rows.min() + 1
    assert side == cols.max() - cols.min() + 1
    assert smallest <= side <= largest
    sides.add(side)
  assert len(sides) > 1


def test_random_erasing_box_area_is_uniform_and_its_aspect_log_uniform():
  # Area fraction a ~ U(0.05, 0.2) and height/width r with log r ~ U(0, log 4), recovered from
  # 2,048 erased boxes on 64 x 64 images (no box is clipped: its height is at most 57). The
  # bounds are 5 standard errors of the uniform laws plus an allowance for rounding the sides
  # (over 20,000 boxes the means moved by under 0.0005 in area and 0.006 in log r).
  size, area, aspect, draws = 64, (0.05, 0.2), (1.0, 4.0), 2048
  image = np.zeros((size, size, 1), np.float32)
  erase = jax.jit(jax.vmap(functools.partial(augment.random_erasing, image_HxWxC=image,
                                             area=area, aspect=aspect, fill=1.0)))
  erased = np.asarray(erase(_keys(draws)))[..., 0] == 1
  heights, widths = erased.any(axis=2).sum(axis=1), erased.any(axis=1).sum(axis=1)
  np.testing.assert_array_equal(erased.sum(axis=(1, 2)), heights * widths)  # rectangles
  fractions, log_ratios = heights * widths / size ** 2, np.log(heights / widths)
  # Rounding each side moves log r by at most 0.5/side per side (sides >= 7 here).
  log_slack = 0.5 / widths.min() + 0.5 / heights.min()
  assert log_ratios.min() >= np.log(aspect[0]) - log_slack
  assert log_ratios.max() <= np.log(aspect[1]) + log_slack
  assert log_ratios.min() < np.log(aspect[0]) + 0.1 and log_ratios.max() > np.log(aspect[1]) - 0.1
  log_span = np.log(aspect[1] / aspect[0])
  standard_error = log_span / np.sqrt(12 * draws)
  assert abs(log_ratios.mean() - np.log(aspect[0]) - log_span / 2) < 5 * standard_error + 0.01
  # The sample variance of a uniform has a relative standard error of 2.0% at 2,048 draws.
  assert abs(log_ratios.var() - log_span ** 2 / 12) < 0.12 * log_span ** 2 / 12
  area_error = (area[1] - area[0]) / np.sqrt(12 * draws)
  assert abs(fractions.mean() - np.mean(area)) < 5 * area_error + 0.001
  assert fractions.min() < area[0] + 0.02 and fractions.max() > area[1] - 0.02


def test_random_erasing_with_texture_changes_only_a_rectangle():
  image = _rgb(shape=(20, 20, 3))
  out = np.asarray(augment.random_erasing(jax.random.key(5), image, area=(0.2, 0.2)))
  changed = np.any(out != image, axis=-1)
  rows, cols = np.nonzero(changed)
  assert 0.15 * 400 <= changed.sum() <= 0.25 * 400
  outside = np.ones_like(changed)
  outside[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = False
  assert not changed[outside].any()


def _partners(labels_BxK):
  """Each example's partner index and its own label weight, read off one-hot mixes."""
  partners, weights = [], []
  for i, row in enumerate(labels_BxK):
    others = [j for j in np.nonzero(row > 1e-6)[0] if j != i]
    assert len(others) <= 1
    partners.append(others[0] if others else i)
    weights.append(row[i])
  return partners, np.array(weights)


def test_mixup_is_the_convex_combination_of_images_and_labels():
  batch_size = 8
  images = _rgb(shape=(batch_size, 6, 6, 3))
  labels = np.eye(batch_size, dtype=np.float32)
  augment_fn = jax.jit(augment.build_augmentation([('mixup', {'alpha': 1.0})]))
  out = augment_fn(jax.random.key(0), {'image': images, 'label': labels})
  out_labels = np.asarray(out['label'])
  np.testing.assert_allclose(out_labels.sum(axis=1), 1, atol=1e-6)
  partners, weights = _partners(out_labels)
  for i, (j, weight) in enumerate(zip(partners, weights)):
    np.testing.assert_allclose(out['image'][i], weight * images[i] + (1 - weight) * images[j],
                               atol=1e-5)
  assert all(j != i for i, j in enumerate(partners))
  assert len(np.unique(np.round(weights, 4))) > batch_size // 2


def test_cutmix_label_weight_is_the_pasted_area_fraction():
  batch_size, size = 8, 10
  values = (np.arange(batch_size) + 1) / (batch_size + 1)
  images = np.broadcast_to(values[:, None, None, None], (batch_size, size, size, 1))
  images = images.astype(np.float32)
  labels = np.eye(batch_size, dtype=np.float32)
  augment_fn = jax.jit(augment.build_augmentation([('cutmix', {'alpha': 1.0})]))
  out = augment_fn(jax.random.key(1), {'image': images, 'label': labels})
  out_images, out_labels = np.asarray(out['image']), np.asarray(out['label'])
  np.testing.assert_allclose(out_labels.sum(axis=1), 1, atol=1e-6)
  partners, _ = _partners(out_labels)
  mixed = 0
  for i, j in enumerate(partners):
    pasted = np.isclose(out_images[i], values[j])
    assert np.all(pasted | np.isclose(out_images[i], values[i]))
    if j != i:
      np.testing.assert_allclose(out_labels[i, j], pasted.mean(), atol=1e-6)
      mixed += pasted.any()
  assert mixed > 0


@pytest.mark.parametrize('alpha', [0.2, 2.0])
def test_mixup_weight_has_the_mean_and_variance_of_beta_alpha_alpha(alpha):
  # λ ~ Beta(α, α) has mean 1/2, variance σ² = 1/(4 (2α + 1)) and fourth central moment
  # σ⁴ (3 - 6/(2α + 3)); the bounds are 5 standard errors of the sample mean and variance.
  # 32 batches of 16, the probability test's batch, so the two share compiled code.
  batch_size = 16
  images, labels = _rgb(shape=(batch_size, 8, 8, 3)), np.eye(batch_size, dtype=np.float32)
  weights = np.concatenate([np.diag(augment.mixup(key, images, labels, alpha)[1])
                            for key in _keys(32)])  # no example is its own partner: this is λ
  variance = 1 / (4 * (2 * alpha + 1))
  fourth = variance ** 2 * (3 - 6 / (2 * alpha + 3))
  assert np.all((weights >= 0) & (weights <= 1))
  assert abs(weights.mean() - 0.5) < 5 * np.sqrt(variance / len(weights))
  assert abs(weights.var(ddof=1) - variance) < 5 * np.sqrt((fourth - variance ** 2) / len(weights))


def _cutmix_pasted_law(size, alpha):
  """Exact law of cutmix's pasted fraction on size x size images: values, probabilities.

  The box side is floor(size sqrt(u)) pixels with u = 1 - λ ~ Beta(α, α), so it is k with
  probability I(((k + 1)/size)²) - I((k/size)²), I the regularised incomplete beta function; the
  centre row and column are independent uniform pixels, and the clipped extents are counted.
  """
  fractions, probabilities = [], []
  for side in range(size + 1):
    probability = (special.betainc(alpha, alpha, min(((side + 1) / size) ** 2, 1))
                   - special.betainc(alpha, alpha, (side / size) ** 2))
    extents = np.array([len(set(range(centre - side // 2, centre - side // 2 + side))
                            & set(range(size))) for centre in range(size)])
    fraction = np.outer(extents, extents).ravel() / size ** 2
    fractions.append(fraction)
    probabilities.append(np.full(fraction.size, probability / fraction.size))
  return np.concatenate(fractions), np.concatenate(probabilities)


@pytest.mark.parametrize('alpha', [0.2, 1.0, 5.0])
def test_cutmix_pasted_fraction_follows_the_documented_box_law(alpha):
  batch_size, size = 16, 8
  values = (np.arange(batch_size) + 1) / (batch_size + 1)
  images = np.broadcast_to(values[:, None, None, None], (batch_size, size, size, 1))
  images, labels = images.astype(np.float32), np.eye(batch_size, dtype=np.float32)
  pasted, own_weights = [], []
  for key in _keys(32):
    out_images, out_labels = augment.cutmix(key, images, labels, alpha)
    # Every example has its own value, so the pasted pixels are those that changed.
    pasted.append(np.mean(np.asarray(out_images) != images, axis=(1, 2, 3)))
    own_weights.append(np.diag(out_labels))
  pasted = np.concatenate(pasted)
  np.testing.assert_allclose(np.concatenate(own_weights), 1 - pasted, atol=1e-6)
  # Bounds: 5 standard errors of the sample mean and variance under the exact law.
  fractions, probabilities = _cutmix_pasted_law(size, alpha)
  mean = probabilities @ fractions
  variance = probabilities @ (fractions - mean) ** 2
  fourth = probabilities @ (fractions - mean) ** 4
  assert abs(pasted.mean() - mean) < 5 * np.sqrt(variance / len(pasted))
  assert abs(pasted.var(ddof=1) - variance) < 5 * np.sqrt((fourth - variance ** 2) / len(pasted))


def test_cutmix_covers_rows_and_columns_of_a_wide_image_as_the_box_law_says():
  # On an H x W image the box is floor(H sqrt(u)) x floor(W sqrt(u)) pixels, u = 1 - λ, with
  # its centre (top + h // 2, left + w // 2) a uniform pixel. A side k of N has probability
  # I(((k + 1)/N)²) - I((k/N)²), so row or column x is covered with probability
  # Σ_k P(k) #{centres c: c - k // 2 <= x < c - k // 2 + k} / N; 5 binomial standard errors.
  batch_size, height, width, alpha = 64, 4, 12, 1.0
  values = (np.arange(batch_size) + 1) / (batch_size + 1)
  images = np.broadcast_to(values[:, None, None, None], (batch_size, height, width, 1))
  images, labels = images.astype(np.float32), np.eye(batch_size, dtype=np.float32)
  mix = jax.jit(jax.vmap(lambda key, x, y: augment.cutmix(key, x, y, alpha)[0], (0, None, None)))
  pasted = (np.asarray(mix(_keys(16), images, labels)) != images).reshape(-1, height, width)
  for covered, size in ((pasted.any(axis=2), height), (pasted.any(axis=1), width)):
    expected = np.zeros(size)
    for side in range(size + 1):
      probability = (special.betainc(alpha, alpha, min(((side + 1) / size) ** 2, 1))
                     - special.betainc(alpha, alpha, (side / size) ** 2))
      for centre in range(size):
        start = centre - side // 2
        expected[max(start, 0):start + side] += probability / size
    n = len(covered)
    assert np.all(np.abs(covered.mean(axis=0) - expected)
                  < 5 * np.sqrt(expected * (1 - expected) / n)), (covered.mean(axis=0), expected)


# Colour.


def test_grayscale_channels_equal_the_luma_formula():
  image = _rgb(shape=(7, 9, 3))
  out = np.asarray(augment.to_grayscale(image))
  expected = 0.299 * image[..., 0] + 0.587 * image[..., 1] + 0.114 * image[..., 2]
  for channel in range(3):
    np.testing.assert_allclose(out[..., channel], expected, atol=1e-6)


@pytest.mark.parametrize('name', ['grayscale', 'saturation', 'hue'])
def test_colour_transforms_are_identity_on_one_channel(name):
  image = _rgb(shape=(7, 9, 1))
  out = augment.TRANSFORMS[name].fn(jax.random.key(0), image)
  np.testing.assert_allclose(out, image, atol=1e-6)


def test_colour_transforms_reject_two_channels():
  with pytest.raises(ValueError, match='1 or 3 channels; got 2'):
    augment.to_grayscale(jnp.zeros((4, 4, 2)))


def test_brightness_multiplies_by_a_factor_in_range():
  image = _rgb(shape=(8, 8, 3), low=0.05, high=0.7)
  np.testing.assert_allclose(augment.adjust_brightness(image, 1.3), np.clip(image * 1.3, 0, 1),
                             atol=1e-6)
  # Values above 1 / 1.8 come out as 1.
  np.testing.assert_allclose(augment.adjust_brightness(image, 1.8), np.clip(image * 1.8, 0, 1),
                             atol=1e-6)
  factors = []
  for key in _keys(10):
    ratio = np.asarray(augment.brightness(key, image, max_delta=0.3)) / image
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
    factors.append(ratio.flat[0])
  assert 0.7 <= min(factors) < max(factors) <= 1.3


def _drawn_colour_change(name, image_HxWx3, out_HxWx3):
  """The factor, or hue shift in turns, that turned `image` into `out` by the documented formula.

  Brightness, contrast and saturation scale distances from 0, the mean luma and each pixel's
  luma; the hue shift is read off matplotlib's HSV.
  """
  if name == 'hue':
    hue_in, hue_out = (matplotlib.colors.rgb_to_hsv(x)[..., 0] for x in (image_HxWx3, out_HxWx3))
    turns = np.median((hue_out - hue_in + 0.5) % 1 - 0.5)
    hsv = matplotlib.colors.rgb_to_hsv(image_HxWx3)
    hsv[..., 0] = (hsv[..., 0] + turns) % 1
    np.testing.assert_allclose(out_HxWx3, matplotlib.colors.hsv_to_rgb(hsv), atol=1e-5)
    return turns
  gray_HxWx1 = (image_HxWx3 @ np.array([0.299, 0.587, 0.114]))[..., None]
  centre = {'brightness': 0.0, 'contrast': gray_HxWx1.mean(), 'saturation': gray_HxWx1}[name]
  factor = np.sum((out_HxWx3 - centre) * (image_HxWx3 - centre)) / np.sum(
      (image_HxWx3 - centre) ** 2)
  np.testing.assert_allclose(out_HxWx3, centre + factor * (image_HxWx3 - centre), atol=1e-5)
  return factor


# With the defaults, factors are drawn from [0.6, 1.4] and hue shifts from [-0.1, 0.1] turns;
# the image's values in [0.3, 0.4] stay unclipped.
@pytest.mark.parametrize('name, low, high', [
    ('brightness', 0.6, 1.4), ('contrast', 0.6, 1.4), ('saturation', 0.6, 1.4),
    ('hue', -0.1, 0.1),
])
def test_colour_changes_are_uniform_over_their_documented_ranges(name, low, high):
  image = _rgb(shape=(12, 12, 3), low=0.3, high=0.4)
  changes = np.array([_drawn_colour_change(name, image, example)
                      for example in _per_example_batches(name, image)])
  _assert_uniform_sample(changes, low, high, atol=1e-4)


@pytest.mark.parametrize('factor', [0.0, 0.5, 1.7])
def test_contrast_scales_distances_from_mean_luma(factor):
  image = _rgb(shape=(8, 8, 3))
  mean = (0.299 * image[..., 0] + 0.587 * image[..., 1] + 0.114 * image[..., 2]).mean()
  np.testing.assert_allclose(augment.adjust_contrast(image, factor),
                             np.clip(mean + factor * (image - mean), 0, 1), atol=1e-6)


@pytest.mark.parametrize('factor', [0.0, 0.5, 1.7])
def test_saturation_scales_distances_from_pixel_luma(factor):
  image = _rgb(shape=(8, 8, 3))
  gray = (0.299 * image[..., 0] + 0.587 * image[..., 1] + 0.114 * image[..., 2])[..., None]
  np.testing.assert_allclose(augment.adjust_saturation(image, factor),
                             np.clip(gray + factor * (image - gray), 0, 1), atol=1e-6)


def test_hsv_conversion_matches_matplotlib_and_round_trips():
  image = _rgb(shape=(16, 16, 3))
  image[0, :4] = [[0, 0, 0], [1, 1, 1], [0.5, 0.5, 0.5], [1, 0, 0]]
  hsv = np.asarray(augment.rgb_to_hsv(image))
  np.testing.assert_allclose(hsv, matplotlib.colors.rgb_to_hsv(image), atol=1e-6)
  np.testing.assert_allclose(augment.hsv_to_rgb(hsv), image, atol=1e-6)


def test_hsv_to_rgb_takes_the_hue_modulo_one_turn():
  # -1e-8 turns is 1.0 after a float32 mod, the seventh sixth: it must wrap round to red.
  hues = np.array([-1e-8, -1.0, 1.0, 2.25, -0.6])
  hsv = np.stack([hues, np.full(5, 0.8), np.full(5, 0.9)], axis=-1)
  expected = matplotlib.colors.hsv_to_rgb(np.stack([hues % 1, hsv[:, 1], hsv[:, 2]], axis=-1))
  np.testing.assert_allclose(augment.hsv_to_rgb(jnp.asarray(hsv[None], jnp.float32))[0],
                             expected, atol=1e-6)


@pytest.mark.parametrize('delta', [0.0, 1.0, -1.0])
def test_hue_shift_by_whole_turns_is_identity(delta):
  image = _rgb(shape=(10, 10, 3))
  np.testing.assert_allclose(augment.adjust_hue(image, delta), image, atol=1e-5)


@pytest.mark.parametrize('delta', [0.25, -0.4])
def test_hue_shift_matches_matplotlib_hsv(delta):
  image = _rgb(shape=(10, 10, 3))
  hsv = matplotlib.colors.rgb_to_hsv(image)
  hsv[..., 0] = (hsv[..., 0] + delta) % 1
  np.testing.assert_allclose(augment.adjust_hue(image, delta),
                             matplotlib.colors.hsv_to_rgb(hsv), atol=1e-5)


def test_color_jitter_with_zero_strengths_is_identity():
  image = _rgb(shape=(6, 6, 3))
  out = augment.color_jitter(jax.random.key(0), image, brightness=0.0, contrast=0.0,
                             saturation=0.0, hue=0.0)
  np.testing.assert_allclose(out, image, atol=1e-5)


def _hue_shifted(image_HxWx3, turns):
  hsv = matplotlib.colors.rgb_to_hsv(image_HxWx3)
  hsv[..., 0] = (hsv[..., 0] + turns) % 1
  return matplotlib.colors.hsv_to_rgb(hsv)


def _contrast(image_HxWx3, factor):
  mean = (image_HxWx3 @ np.array([0.299, 0.587, 0.114])).mean()
  return mean + factor * (image_HxWx3 - mean)


def test_color_jitter_draws_its_order_and_factors_per_key():
  # Only contrast and hue are on. A hue shift keeps each pixel's max and min but moves the mean
  # luma, so the two orders give different images: contrast about the shifted image's mean luma
  # or about the input's. Both are an offset plus c times the hue-shifted input, so the shift d
  # is the change of every pixel's hue and c the slope of the output against the shifted input.
  # The reddish image stays inside [0, 1] for c in [0.6, 1.4] and any d, so nothing clips.
  rng = np.random.default_rng(0)
  image = np.clip([0.6, 0.3, 0.35] + rng.uniform(-0.05, 0.05, (8, 8, 3)), 0, 1)
  image = image.astype(np.float32)
  count = 64
  jitter = jax.jit(jax.vmap(lambda key: augment.color_jitter(
      key, image, brightness=0.0, contrast=0.4, saturation=0.0, hue=0.5)))
  outputs = np.asarray(jitter(_keys(count))).astype(np.float64)
  hue_in = matplotlib.colors.rgb_to_hsv(image)[..., 0]
  factors, turns, hue_first = [], [], []
  for out in outputs:
    change = matplotlib.colors.rgb_to_hsv(out)[..., 0] - hue_in
    d = np.angle(np.mean(np.exp(2j * np.pi * change))) / (2 * np.pi)
    shifted = _hue_shifted(image, d)
    c = np.polyfit(shifted.ravel(), out.ravel(), 1)[0]
    hue_then_contrast = _contrast(shifted, c)
    contrast_then_hue = _hue_shifted(_contrast(image, c), d)
    errors = [np.abs(out - reference).max() for reference in (hue_then_contrast,
                                                               contrast_then_hue)]
    assert min(errors) < 1e-5, errors
    if max(errors) > 1e-4:  # Otherwise c is too close to 1, or d to 0, to tell the orders apart.
      hue_first.append(errors[0] < errors[1])
    factors.append(c)
    turns.append(d)
  # Hue comes before contrast in half of the 24 orders of the four adjustments.
  assert len(hue_first) > count // 2
  assert abs(sum(hue_first) - len(hue_first) / 2) < 4 * np.sqrt(len(hue_first) / 4)
  assert 0 < sum(hue_first) < len(hue_first)
  factors, turns = np.array(factors), np.array(turns)
  assert 0.6 - 1e-5 <= factors.min() < 0.8 and 1.2 < factors.max() <= 1.4 + 1e-5
  assert -0.5 <= turns.min() < -0.3 and 0.3 < turns.max() <= 0.5
  assert len(np.unique(np.round(factors, 4))) == count
  # Independent draws are uncorrelated: 4 standard errors of the sample correlation.
  assert abs(np.corrcoef(factors, turns)[0, 1]) < 4 / np.sqrt(count)


def test_color_jitter_draws_brightness_contrast_and_saturation_by_their_own_strengths_and_keys():
  # Without hue the three commute: with g each pixel's luma and m their mean, the output is
  # b m + b c (g - m) + b c s (x - g) in any order, so a least-squares fit of it on 1, g - m and
  # x - g gives the factors b, c and s. Each lies in its own strength's range, and independent
  # draws are uncorrelated (4 standard errors of the sample correlation).
  image = _rgb(shape=(6, 6, 3), low=0.3, high=0.4).astype(np.float64)
  strengths = {'brightness': 0.1, 'contrast': 0.3, 'saturation': 0.5}
  count = 64
  jitter = jax.jit(jax.vmap(lambda key: augment.color_jitter(
      key, image.astype(np.float32), hue=0.0, **strengths)))
  outputs = np.asarray(jitter(_keys(count))).astype(np.float64)
  gray = (image @ np.array([0.299, 0.587, 0.114]))[..., None]
  mean = gray.mean()
  design = np.stack([np.ones(image.shape), np.broadcast_to(gray - mean, image.shape),
                     image - gray], axis=-1).reshape(-1, 3)
  factors = []
  for out in outputs:
    (offset, gray_slope, colour_slope), *_ = np.linalg.lstsq(design, out.ravel(), rcond=None)
    np.testing.assert_allclose(design @ [offset, gray_slope, colour_slope], out.ravel(),
                               atol=1e-5)
    b = offset / mean
    factors.append([b, gray_slope / b, colour_slope / gray_slope])
  for values, strength in zip(np.array(factors).T, strengths.values()):
    low, high = 1 - strength, 1 + strength
    assert low - 1e-4 <= values.min() < low + strength / 2, (strength, values.min())
    assert high - strength / 2 < values.max() <= high + 1e-4, (strength, values.max())
  correlations = np.corrcoef(np.array(factors).T)[~np.eye(3, dtype=bool)]
  assert np.all(np.abs(correlations) < 4 / np.sqrt(count)), correlations


# Noise.


def test_salt_and_pepper_fraction_matches_amount():
  image = np.full((128, 128, 3), 0.5, np.float32)
  amount = 0.1
  out = np.asarray(augment.salt_and_pepper(jax.random.key(0), image, amount=amount))
  hit = np.any(out != 0.5, axis=-1)
  assert np.all(out[hit] == out[hit][:, :1]) and np.all(np.isin(out[hit], [0.0, 1.0]))
  n = hit.size
  assert abs(hit.sum() - amount * n) < 4 * np.sqrt(n * amount * (1 - amount))
  salt = out[hit][:, 0] == 1
  assert abs(salt.sum() - 0.5 * hit.sum()) < 4 * np.sqrt(hit.sum() * 0.25)


@pytest.mark.parametrize('salt_fraction', [0.0, 0.8, 1.0])
def test_salt_fraction_is_the_share_of_hits_set_to_one(salt_fraction):
  image = np.full((64, 64, 1), 0.5, np.float32)
  out = np.asarray(augment.salt_and_pepper(jax.random.key(1), image, amount=0.5,
                                           salt_fraction=salt_fraction))
  hits = out[out != 0.5]
  q, n = salt_fraction, len(hits)
  assert n > 1000 and np.all(np.isin(hits, [0.0, 1.0]))
  assert abs(np.mean(hits == 1) - q) <= 4 * np.sqrt(q * (1 - q) / n)


def test_gaussian_noise_has_the_requested_std():
  image = np.full((128, 128, 1), 0.5, np.float32)
  std = 0.05
  noise = np.asarray(augment.gaussian_noise(jax.random.key(0), image, std=std)) - 0.5
  n = noise.size
  assert abs(noise.mean()) < 4 * std / np.sqrt(n)
  assert abs(noise.std() - std) < 4 * std / np.sqrt(2 * n)


def test_gaussian_noise_is_clipped_to_the_unit_interval():
  # Values 0.02 and 0.98 with std 0.2 leave [0, 1] with probability Φ(-0.1) = 0.460 each, and
  # those values come out as exactly 0 and 1; 4 standard errors of the binomial fraction.
  half = (64, 128, 1)
  image = np.concatenate([np.full(half, 0.02, np.float32), np.full(half, 0.98, np.float32)])
  out = np.asarray(augment.gaussian_noise(jax.random.key(0), image, std=0.2))
  assert out.min() == 0 and out.max() == 1
  n, q = 64 * 128, special.ndtr(-0.1)
  for values, bound in ((out[:64], 0.0), (out[64:], 1.0)):
    assert abs(np.mean(values == bound) - q) < 4 * np.sqrt(q * (1 - q) / n)


# Batching, keys, jit and configuration.


_PER_EXAMPLE = [name for name, t in augment.TRANSFORMS.items() if not t.mixes_batch]


@pytest.mark.parametrize('name', _PER_EXAMPLE)
def test_per_example_keys_under_jit(name):
  transform = augment.TRANSFORMS[name]
  images = np.broadcast_to(_rgb(shape=(12, 12, 3), low=0.1, high=0.9), (16, 12, 12, 3))
  apply = jax.jit(functools.partial(augment.apply_per_example, transform.fn, p=transform.p))
  different = np.asarray(apply(_keys(16), images))
  same = np.asarray(apply(jnp.stack([jax.random.key(7)] * 16), images))
  assert len({example.tobytes() for example in different}) > 1
  assert len({example.tobytes() for example in same}) == 1


@pytest.mark.parametrize('name', ['rotation', 'mixup'])
def test_probability_keeps_each_example_or_transforms_it_as_with_p_one(name):
  batch = {'image': _rgb(shape=(16, 8, 8, 3)), 'label': np.eye(16, dtype=np.float32)}
  key = jax.random.key(0)
  always = augment.build_augmentation([(name, {'p': 1.0})])(key, batch)
  sometimes = augment.build_augmentation([(name, {'p': 0.5})])(key, batch)
  never = augment.build_augmentation([(name, {'p': 0.0})])(key, batch)
  kept = 0
  for i in range(16):
    for field in ('image', 'label'):
      np.testing.assert_array_equal(never[field][i], batch[field][i])
    if np.array_equal(sometimes['image'][i], batch['image'][i]):
      np.testing.assert_array_equal(sometimes['label'][i], batch['label'][i])
      kept += 1
    else:
      np.testing.assert_allclose(sometimes['image'][i], always['image'][i], atol=1e-6)
      np.testing.assert_allclose(sometimes['label'][i], always['label'][i], atol=1e-6)
  assert 0 < kept < 16


def test_the_gate_is_independent_of_the_transform_parameters():
  # With p = 0.5 the rotated examples draw their angles from the whole documented range, as
  # with p = 1; a gate drawn from the angle's key would tie the two (only small angles kept).
  apply = jax.jit(functools.partial(augment.apply_per_example, augment.rotation, p=0.5))
  images = np.broadcast_to(_coordinate_image(12, 12), (16, 12, 12, 3))
  warped = np.concatenate([apply(_keys(16, seed), images) for seed in range(38)])
  rotated = [example for example in warped if not np.array_equal(example, images[0])]
  n, p = len(warped), 0.5
  assert abs(len(rotated) - n * p) < 5 * np.sqrt(n * p * (1 - p))
  angles = np.array([_drawn_geometry(example)['degrees'] for example in rotated])
  _assert_uniform_sample(angles, -15.0, 15.0, atol=_GEOMETRY_ATOL['degrees'])


def test_each_stage_draws_from_its_own_key():
  # Hue, then brightness: a hue shift keeps each pixel's largest channel, so the brightness
  # factor is the ratio of the output's largest channel to the input's, and the hue shift is
  # read off the output divided by it. Independent draws are uncorrelated (4 standard errors);
  # stages sharing a key would draw both from the same uniform number, a correlation of 1.
  image = _rgb(shape=(6, 6, 3), low=0.3, high=0.4)
  count = 64
  augment_fn = jax.jit(augment.build_augmentation([('hue', {'max_delta': 0.25}),
                                                   ('brightness', {'max_delta': 0.5})]))
  outputs = np.asarray(augment_fn(jax.random.key(0), {
      'image': np.broadcast_to(image, (count,) + image.shape)})['image']).astype(np.float64)
  factors, turns = [], []
  for out in outputs:
    ratio = out.max(axis=-1) / image.max(axis=-1)
    np.testing.assert_allclose(ratio, ratio.mean(), rtol=1e-5)
    factors.append(ratio.mean())
    turns.append(_drawn_colour_change('hue', image, out / ratio.mean()))
  assert 0.5 - 1e-5 <= min(factors) and max(factors) <= 1.5 + 1e-5
  assert len(np.unique(np.round(factors, 4))) == count
  assert abs(np.corrcoef(factors, turns)[0, 1]) < 4 / np.sqrt(count)


def test_flip_probability_matches_p():
  batch_size, p = 400, 0.3
  images = np.broadcast_to(_rgb(shape=(3, 4, 1)), (batch_size, 3, 4, 1))
  out = augment.build_augmentation([('horizontal_flip', {'p': p})])(
      jax.random.key(0), {'image': images})
  flipped = sum(not np.array_equal(example, images[0]) for example in np.asarray(out['image']))
  assert abs(flipped - p * batch_size) < 4 * np.sqrt(batch_size * p * (1 - p))


def test_pipeline_keeps_other_entries_and_config_forms_agree():
  batch = {'image': _rgb(shape=(4, 8, 8, 3)), 'label': np.eye(4, dtype=np.float32),
           'index': np.arange(4)}
  stages = [('rotation', {'max_degrees': 20.0}), ('cutout', {'size': 3, 'p': 0.5})]
  config = ml_collections.ConfigDict({'augmentation': [
      ml_collections.ConfigDict({'name': 'rotation', 'max_degrees': 20.0}),
      {'name': 'cutout', 'size': 3, 'p': 0.5}]})
  key = jax.random.key(4)
  from_pairs = augment.build_augmentation(stages)(key, batch)
  from_config = jax.jit(augment.build_augmentation(config.augmentation))(key, batch)
  np.testing.assert_allclose(from_pairs['image'], from_config['image'], atol=1e-6)
  np.testing.assert_array_equal(from_config['index'], batch['index'])
  assert not np.allclose(from_pairs['image'], batch['image'])


def test_registered_parameters_match_the_functions():
  for name, transform in augment.TRANSFORMS.items():
    signature = inspect.signature(transform.fn).parameters
    assert set(list(signature)[3 if transform.mixes_batch else 2:]) == set(transform.params), name


@pytest.mark.parametrize('spec, message', [
    (['blur'], "Unknown augmentation 'blur'; allowed: horizontal_flip, vertical_flip, rotation"),
    ([('rotation', {'degrees': 3})],
     "Unknown parameter 'degrees' .* allowed: max_degrees, fill, p"),
    ([('rotation', {'max_degrees': -1})], r'max_degrees=-1; it must be a number >= 0'),
    ([('zoom', {'scale': (1.2, 0.8)})], r'scale=\(1.2, 0.8\); it must be a pair'),
    ([('cutout', {'p': 1.5})], r'p=1.5; it must be a number in \[0, 1\]'),
    ([('random_erasing', {'fill': 'blue'})], "fill='blue'; it must be 'random' or a number"),
    ([('mixup', {'alpha': 0})], r'alpha=0; it must be a number > 0'),
    ([42], 'must be a name, a \\(name, params\\) pair or a mapping'),
    ('rotation', 'must be a sequence of stages'),
])
def test_bad_specs_raise_clear_errors(spec, message):
  with pytest.raises(ValueError, match=message):
    augment.build_augmentation(spec)


def test_bad_batches_raise_clear_errors():
  key = jax.random.key(0)
  images = _rgb(shape=(2, 4, 4, 3))
  with pytest.raises(ValueError, match=r'mixup needs float one-hot or soft labels .* got \(2,\)'):
    augment.build_augmentation(['mixup'])(key, {'image': images, 'label': np.arange(2)})
  with pytest.raises(ValueError, match='float images of shape'):
    augment.build_augmentation(['rotation'])(key, {'image': np.zeros((2, 4, 4, 3), np.uint8)})


# Placement and defaults.


def test_random_erasing_box_lies_anywhere_inside_with_uniform_offsets():
  # A quarter of an 8 x 8 image with aspect 1 is a 4 x 4 box: its top and left take each of
  # the 5 values 0..4 with probability 1/5 (the box may touch the last row and column).
  size, side, draws = 8, 4, 500
  erase = jax.jit(jax.vmap(functools.partial(
      augment.random_erasing, image_HxWxC=np.zeros((size, size, 1), np.float32),
      area=(0.25, 0.25), aspect=(1.0, 1.0), fill=1.0)))
  erased = np.asarray(erase(_keys(draws)))[..., 0] == 1
  np.testing.assert_array_equal(erased.sum(axis=(1, 2)), side * side)
  for axis in (1, 2):  # rows, then columns
    covered = erased.any(axis=3 - axis)
    first = covered.argmax(axis=1)
    counts = np.bincount(first, minlength=size)
    n, q = draws, 1 / (size - side + 1)
    assert np.all(counts[size - side + 1:] == 0), counts
    assert np.all(np.abs(counts[:size - side + 1] - n * q) < 5 * np.sqrt(n * q * (1 - q))), counts


def test_random_erasing_box_sides_follow_area_and_aspect_on_a_wide_image():
  # An 8 x 32 image, area fraction 1/8 (32 pixels) and height/width 1/8: sides sqrt(32 / 8) = 2
  # and sqrt(32 * 8) = 16, wider than the image is tall.
  erase = jax.jit(jax.vmap(functools.partial(
      augment.random_erasing, image_HxWxC=np.zeros((8, 32, 1), np.float32),
      area=(0.125, 0.125), aspect=(0.125, 0.125), fill=1.0)))
  erased = np.asarray(erase(_keys(20)))[..., 0] == 1
  np.testing.assert_array_equal(erased.any(axis=2).sum(axis=1), 2)
  np.testing.assert_array_equal(erased.any(axis=1).sum(axis=1), 16)
  np.testing.assert_array_equal(erased.sum(axis=(1, 2)), 32)


def test_random_erasing_box_sides_are_at_least_one_pixel():
  # 1% of a 4 x 4 image is 0.16 pixels: sides round to 0, clipped to 1, so one pixel is erased.
  erase = jax.jit(jax.vmap(functools.partial(
      augment.random_erasing, image_HxWxC=np.zeros((4, 4, 1), np.float32), area=(0.01, 0.01),
      aspect=(1.0, 1.0), fill=1.0)))
  np.testing.assert_array_equal(np.asarray(erase(_keys(4))).sum(axis=(1, 2, 3)), 1)


def _box_corners(masks_NxHxW):
  """Top row and left column of each mask's box."""
  return masks_NxHxW.any(axis=2).argmax(axis=1), masks_NxHxW.any(axis=1).argmax(axis=1)


def test_box_rows_and_columns_are_drawn_independently():
  # Cutout's centre and random erasing's top-left corner: sample correlations of the row and
  # the column within 4 standard errors of 0 over 500 draws.
  size, draws = 8, 500
  image = np.full((size, size, 1), 0.5, np.float32)
  cut = jax.jit(jax.vmap(functools.partial(augment.cutout, image_HxWxC=image, size=1)))
  erase = jax.jit(jax.vmap(functools.partial(augment.random_erasing, image_HxWxC=image,
                                             area=(0.25, 0.25), aspect=(1.0, 1.0), fill=1.0)))
  for masks in (np.asarray(cut(_keys(draws)))[..., 0] == 0,
                np.asarray(erase(_keys(draws)))[..., 0] == 1):
    rows, cols = _box_corners(masks)
    assert masks.any(axis=(1, 2)).all()
    assert abs(np.corrcoef(rows, cols)[0, 1]) < 4 / np.sqrt(draws)


def test_cutout_centre_is_uniform_over_every_pixel():
  # With size 2 the box covers rows centre - 1 and centre (clipped), so its last row is the
  # centre; the centre is a uniform pixel, the last row and column included. The image is
  # wider than tall, so a column drawn like a row would miss the last columns.
  height, width, draws = 6, 9, 600
  image = np.full((height, width, 1), 0.5, np.float32)
  cut = jax.jit(jax.vmap(functools.partial(augment.cutout, image_HxWxC=image, size=2)))
  masked = np.asarray(cut(_keys(draws)))[..., 0] == 0
  for axis, size in ((1, height), (2, width)):
    covered = masked.any(axis=3 - axis)
    last = size - 1 - covered[:, ::-1].argmax(axis=1)
    counts = np.bincount(last, minlength=size)
    n, q = draws, 1 / size
    assert np.all(np.abs(counts - n * q) < 5 * np.sqrt(n * q * (1 - q))), counts


def test_factor_range_starts_at_zero_when_max_delta_exceeds_one():
  # max_delta 1.5 draws brightness factors from [max(0, -0.5), 2.5] = [0, 2.5]; values up to
  # 0.35 stay unclipped at 2.5, so a negative factor would show as clipped zeros.
  image = _rgb(shape=(4, 4, 3), low=0.2, high=0.35)
  draw = jax.jit(jax.vmap(lambda key: augment.brightness(key, image, max_delta=1.5)))
  outputs = np.asarray(draw(_keys(400)))
  factors = np.array([_drawn_colour_change('brightness', image, out) for out in outputs])
  _assert_uniform_sample(factors, 0.0, 2.5, atol=1e-4)


@pytest.mark.parametrize('name, p', [('horizontal_flip', 0.5), ('vertical_flip', 0.5),
                                     ('grayscale', 0.1)])
def test_stages_without_p_use_the_documented_default_probability(name, p):
  batch_size = 400
  images = np.broadcast_to(_rgb(shape=(3, 4, 3)), (batch_size, 3, 4, 3))
  out = augment.build_augmentation([name])(jax.random.key(1), {'image': images})
  changed = sum(not np.array_equal(example, images[0]) for example in np.asarray(out['image']))
  assert abs(changed - p * batch_size) < 4 * np.sqrt(batch_size * p * (1 - p))


@pytest.mark.parametrize('spec', [
    [('zoom', {'scale': (1.0, 1.0)})],
    [('hue', {'max_delta': 0.5})],
    [('affine', {'max_shear_degrees': 89})],
    [('salt_and_pepper', {'amount': 1.0, 'salt_fraction': 0.0})],
])
def test_specs_at_the_edge_of_their_ranges_are_accepted(spec):
  augment.build_augmentation(spec)


@pytest.mark.parametrize('spec, message', [
    ([('hue', {'max_delta': 0.6})], r'max_delta=0.6; it must be a number in \[0, 0.5\]'),
    ([('color_jitter', {'hue': 0.75})], r'hue=0.75; it must be a number in \[0, 0.5\]'),
    ([('affine', {'max_shear_degrees': 90})], r'it must be a number in \[0, 89\]'),
    ([('translation', {'max_fraction': 1.5})], r'it must be a number in \[0, 1\]'),
    ([('random_erasing', {'area': (0.0, 0.5)})], r'it must be a pair .* each a number in \(0, 1\]'),
    ([('random_crop', {'padding': 2.0})], 'it must be an integer >= 0'),
    ([('horizontal_flip', {'p': True})], r'p=True; it must be a number in \[0, 1\]'),
])
def test_out_of_range_parameters_are_refused(spec, message):
  with pytest.raises(ValueError, match=message):
    augment.build_augmentation(spec)


@pytest.mark.parametrize('name, function', [
    ('adjust_brightness', 'brightness'), ('adjust_contrast', 'contrast'),
    ('adjust_saturation', 'saturation'), ('adjust_hue', 'hue'),
    ('adjust_brightness', 'color_jitter'), ('to_grayscale', 'grayscale'),
    ('gaussian_noise', 'gaussian_noise'), ('salt_and_pepper', 'salt_and_pepper'),
    ('random_erasing', 'random_erasing')])
def test_colour_and_noise_transforms_refuse_integer_images(name, function):
  # They clip to [0, 1]: uint8 pixels came out as 0 and 1 (brightness, contrast), all 0
  # (grayscale's weights cast to uint8) or raised deep inside jax.random.
  image_u8 = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
  with pytest.raises(ValueError, match=f'{name} needs a float image with values in '
                                       r'\[0, 1\], got uint8; convert it first'):
    getattr(augment, function)(jax.random.PRNGKey(0), image_u8)
  out = getattr(augment, function)(jax.random.PRNGKey(0), image_u8 / np.float32(255))
  assert out.dtype == jnp.float32 and out.shape == (4, 4, 3)


def test_geometric_transforms_keep_integer_images():
  image_u8 = np.arange(6 * 6, dtype=np.uint8).reshape(6, 6, 1) * 7
  out = augment.random_crop(jax.random.PRNGKey(0), image_u8, padding=0)
  np.testing.assert_array_equal(out, image_u8)
