"""Image data augmentation: the usual geometric, colour, noise, masking and mixing transforms.

Shorten & Khoshgoftaar 2019 ("A survey on image data augmentation for deep learning")
survey them; the transforms with a paper of their own cite it in their docstrings.

A transform acts on one float image in [0, 1] of shape (H, W, C) with its own
PRNG key, `fn(key, image_HxWxC, **params) -> image_HxWxC`, and is vmapped over
a batch with one key per example (`apply_per_example`). Mixup and cutmix mix
pairs of examples, so they act on the whole batch and mix the labels too:
`fn(key, images_BxHxWxC, labels_BxK, **params) -> (images, labels)`, where
labels are one-hot or soft vectors.

`build_augmentation(spec)` composes transforms from a config: a sequence of
stages, each a name, a `(name, params)` pair or a mapping (also an
`ml_collections.ConfigDict`) with a 'name' key beside the params. Every stage
also takes `p`, the probability that an example is transformed at all.

| name            | transform               | params (default)                          | p   |
| --------------- | ----------------------- | ----------------------------------------- | --- |
| horizontal_flip | Flipping                |                                           | 0.5 |
| vertical_flip   | Flipping                |                                           | 0.5 |
| rotation        | Rotation                | max_degrees (15), fill (0)                | 1   |
| translation     | Translation             | max_fraction (0.1), fill (0)              | 1   |
| zoom            | Scaling, Zooming        | scale ((0.8, 1.2)), fill (0)              | 1   |
| random_crop     | Cropping                | padding (4), fill (0)                     | 1   |
| affine          | Affine                  | max_degrees (15), max_fraction (0.1),     | 1   |
|                 |                         | scale ((0.9, 1.1)), max_shear_degrees     |     |
|                 |                         | (10), fill (0)                            |     |
| brightness      | Brightness              | max_delta (0.4)                           | 1   |
| contrast        | Contrast                | max_delta (0.4)                           | 1   |
| saturation      | Saturation              | max_delta (0.4)                           | 1   |
| hue             | Hue                     | max_delta (0.1, in turns)                 | 1   |
| color_jitter    | Color Jittering         | brightness, contrast, saturation (0.4),   | 1   |
|                 |                         | hue (0.1)                                 |     |
| grayscale       | Grayscale               |                                           | 0.1 |
| gaussian_noise  | Gaussian Noise          | std (0.05)                                | 1   |
| salt_and_pepper | Salt-and-Pepper Noise   | amount (0.05), salt_fraction (0.5)        | 1   |
| elastic         | Elastic Deformations    | alpha (34), sigma (4), fill (0)           | 1   |
| cutout          | Cutout                  | size (8), fill (0)                        | 1   |
| random_erasing  | Random Erasing          | area ((0.02, 0.33)), aspect ((0.3, 3.3)), | 1   |
|                 |                         | fill ('random')                           |     |
| mixup           | Mixup                   | alpha (0.2)                               | 1   |
| cutmix          | CutMix                  | alpha (1.0)                               | 1   |

Conventions. Rows run down and columns right; a positive angle turns the
content counter-clockwise as displayed (as `jnp.rot90` does), a positive shift
moves it down/right. Geometric transforms resample bilinearly through one
affine map about the image centre; pixels that come from outside the image take
`fill`. Colour transforms take 1 or 3 channels: luma is ITU-R BT.601
(0.299 R + 0.587 G + 0.114 B) and a 1-channel image is its own luma, so on it
grayscale and saturation are the identity and hue is the identity by
definition. Brightness, contrast and saturation scale by a factor drawn from
[max(0, 1 - max_delta), 1 + max_delta]; hue adds a shift drawn from
[-max_delta, max_delta] turns. Results of colour and noise transforms are
clipped to [0, 1], so they refuse an image that is not float (uint8 pixels would
come out as 0 and 1).
"""

import dataclasses
import functools
import math
import numbers
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.scipy import ndimage

LUMA_WEIGHTS = (0.299, 0.587, 0.114)


# Shared geometry.


def resample(image_HxWxC: jax.Array, rows_HxW: jax.Array, cols_HxW: jax.Array,
             fill: float = 0.0) -> jax.Array:
  """Reads `image` bilinearly at fractional (row, col); outside the image reads `fill`."""
  def one_channel(channel_HxW):
    return ndimage.map_coordinates(channel_HxW, [rows_HxW, cols_HxW], order=1, mode='constant',
                                   cval=fill)
  return jax.vmap(one_channel, in_axes=2, out_axes=2)(image_HxWxC)


def pixel_grid(height: int, width: int) -> tuple[jax.Array, jax.Array]:
  """Row and column index of every pixel, as float arrays of shape (H, W)."""
  return jnp.meshgrid(jnp.arange(height, dtype=jnp.float32), jnp.arange(width, dtype=jnp.float32),
                      indexing='ij')


def warp_affine(image_HxWxC: jax.Array, *, degrees=0.0, shift_y=0.0, shift_x=0.0, scale=1.0,
                shear_degrees=0.0, fill: float = 0.0) -> jax.Array:
  """Affine: scale, then shear along x, then rotate about the centre, then shift.

  The content at p moves to c + R(degrees) Sh(shear) s (p - c) + (shift_x, shift_y),
  with c the image centre, (x, y) = (column, row), R = [[cos, sin], [-sin, cos]]
  (counter-clockwise as displayed, rows running down) and Sh = [[1, tan], [0, 1]].
  """
  height, width, _ = image_HxWxC.shape
  centre_y, centre_x = (height - 1) / 2, (width - 1) / 2
  theta = jnp.deg2rad(jnp.asarray(degrees, jnp.float32))
  cos, sin = jnp.cos(theta), jnp.sin(theta)
  tan_shear = jnp.tan(jnp.deg2rad(jnp.asarray(shear_degrees, jnp.float32)))
  rows, cols = pixel_grid(height, width)
  # Each output pixel looks up its source: the inverse map (1/s) Sh⁻¹ Rᵀ.
  dx = cols - centre_x - shift_x
  dy = rows - centre_y - shift_y
  unrotated_x = cos * dx - sin * dy
  unrotated_y = sin * dx + cos * dy
  source_x = centre_x + (unrotated_x - tan_shear * unrotated_y) / scale
  source_y = centre_y + unrotated_y / scale
  return resample(image_HxWxC, source_y, source_x, fill)


def box_mask(height: int, width: int, top, left, box_height, box_width) -> jax.Array:
  """Boolean (H, W) mask of the rectangle clipped to the image; corners may lie outside."""
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  return (rows >= top) & (rows < top + box_height) & (cols >= left) & (cols < left + box_width)


# Shared colour maths.


def _check_float(image_HxWxC: jax.Array, transform: str) -> None:
  """Colour and noise transforms clip to [0, 1], so an integer image would come out all 0 and 1."""
  if not jnp.issubdtype(jnp.result_type(image_HxWxC), jnp.floating):
    raise ValueError(f'{transform} needs a float image with values in [0, 1], got '
                     f'{jnp.result_type(image_HxWxC)}; convert it first (e.g. image / 255).')


def _colour_channels(image_HxWxC: jax.Array) -> int:
  channels = image_HxWxC.shape[-1]
  if channels not in (1, 3):
    raise ValueError(f'Colour transforms need 1 or 3 channels; got {channels}.')
  return channels


def luma(image_HxWxC: jax.Array) -> jax.Array:
  """BT.601 luma of shape (H, W, 1); a 1-channel image is its own luma."""
  _check_float(image_HxWxC, 'luma')
  if _colour_channels(image_HxWxC) == 1:
    return image_HxWxC
  return image_HxWxC @ jnp.asarray(LUMA_WEIGHTS, image_HxWxC.dtype)[:, None]


def rgb_to_hsv(rgb_HxWx3: jax.Array) -> jax.Array:
  """RGB in [0, 1] to hue (in turns, [0, 1)), saturation and value."""
  red_HxW, green_HxW, blue_HxW = rgb_HxWx3[..., 0], rgb_HxWx3[..., 1], rgb_HxWx3[..., 2]
  value_HxW = jnp.max(rgb_HxWx3, axis=-1)
  chroma_HxW = value_HxW - jnp.min(rgb_HxWx3, axis=-1)
  saturation_HxW = jnp.where(value_HxW > 0,
                             chroma_HxW / jnp.where(value_HxW > 0, value_HxW, 1), 0)
  safe_chroma_HxW = jnp.where(chroma_HxW > 0, chroma_HxW, 1)
  sixths_HxW = jnp.where(
      value_HxW == red_HxW, jnp.mod((green_HxW - blue_HxW) / safe_chroma_HxW, 6),
      jnp.where(value_HxW == green_HxW, (blue_HxW - red_HxW) / safe_chroma_HxW + 2,
                (red_HxW - green_HxW) / safe_chroma_HxW + 4))
  hue_HxW = jnp.where(chroma_HxW > 0, sixths_HxW / 6, 0)
  return jnp.stack([hue_HxW, saturation_HxW, value_HxW], axis=-1)


def hsv_to_rgb(hsv_HxWx3: jax.Array) -> jax.Array:
  """Inverse of `rgb_to_hsv`; hue is taken modulo one turn."""
  hue_HxW, saturation_HxW, value_HxW = hsv_HxWx3[..., 0], hsv_HxWx3[..., 1], hsv_HxWx3[..., 2]
  sixths_HxW = jnp.mod(hue_HxW, 1) * 6
  sector_HxW = jnp.floor(sixths_HxW)
  fraction_HxW = sixths_HxW - sector_HxW
  sector_HxW = sector_HxW.astype(jnp.int32) % 6
  low = value_HxW * (1 - saturation_HxW)
  falling = value_HxW * (1 - saturation_HxW * fraction_HxW)
  rising = value_HxW * (1 - saturation_HxW * (1 - fraction_HxW))
  # Each sixth of the hue circle orders value/rising/falling/low differently.
  table = {
      0: (value_HxW, rising, low), 1: (falling, value_HxW, low), 2: (low, value_HxW, rising),
      3: (low, falling, value_HxW), 4: (rising, low, value_HxW), 5: (value_HxW, low, falling),
  }
  conditions = [sector_HxW == s for s in range(6)]
  return jnp.stack([jnp.select(conditions, [table[s][channel] for s in range(6)])
                    for channel in range(3)], axis=-1)


def adjust_brightness(image_HxWxC: jax.Array, factor) -> jax.Array:
  """Brightness: every value times `factor`."""
  _check_float(image_HxWxC, 'adjust_brightness')
  return jnp.clip(image_HxWxC * factor, 0, 1)


def adjust_contrast(image_HxWxC: jax.Array, factor) -> jax.Array:
  """Contrast: distances from the mean luma times `factor`."""
  _check_float(image_HxWxC, 'adjust_contrast')
  mean = jnp.mean(luma(image_HxWxC))
  return jnp.clip(mean + factor * (image_HxWxC - mean), 0, 1)


def adjust_saturation(image_HxWxC: jax.Array, factor) -> jax.Array:
  """Saturation: distances from each pixel's luma times `factor`."""
  _check_float(image_HxWxC, 'adjust_saturation')
  gray = luma(image_HxWxC)
  return jnp.clip(gray + factor * (image_HxWxC - gray), 0, 1)


def adjust_hue(image_HxWxC: jax.Array, delta) -> jax.Array:
  """Hue: turns the HSV hue by `delta` turns; identity on 1 channel."""
  _check_float(image_HxWxC, 'adjust_hue')
  if _colour_channels(image_HxWxC) == 1:
    return image_HxWxC
  hsv = rgb_to_hsv(image_HxWxC)
  hsv = hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + delta, 1))
  return jnp.clip(hsv_to_rgb(hsv), 0, 1)


def to_grayscale(image_HxWxC: jax.Array) -> jax.Array:
  """Grayscale: every channel set to the luma, so C is kept."""
  _check_float(image_HxWxC, 'to_grayscale')
  return jnp.broadcast_to(luma(image_HxWxC), image_HxWxC.shape)


def gaussian_smooth(field_HxW: jax.Array, sigma: float) -> jax.Array:
  """Gaussian blur with standard deviation `sigma` pixels, the field being zero outside.

  Weights exp(-d²/2σ²) are normalised over every offset d that can reach the
  image, so the blur is one (H, H) and one (W, W) matrix product at any size.
  """
  if sigma == 0:
    return field_HxW

  def blur_matrix(size):
    offsets = jnp.arange(-(size - 1), size, dtype=jnp.float32)
    weights = jnp.exp(-0.5 * (offsets / sigma) ** 2)
    weights = weights / jnp.sum(weights)
    index = jnp.arange(size)
    return weights[index[:, None] - index[None, :] + size - 1]

  height, width = field_HxW.shape
  return blur_matrix(height) @ field_HxW @ blur_matrix(width).T


# Per-example random transforms: fn(key, image_HxWxC, **params).


def _uniform(key, low, high):
  return jax.random.uniform(key, (), jnp.float32, low, high)


def _factor(key, max_delta):
  return _uniform(key, max(0.0, 1.0 - max_delta), 1.0 + max_delta)


def horizontal_flip(key, image_HxWxC):
  """Mirrors left-right; the stage probability `p` makes it random."""
  del key
  return jnp.flip(image_HxWxC, axis=1)


def vertical_flip(key, image_HxWxC):
  """Mirrors top-bottom; the stage probability `p` makes it random."""
  del key
  return jnp.flip(image_HxWxC, axis=0)


def rotation(key, image_HxWxC, max_degrees=15.0, fill=0.0):
  """Rotates by an angle uniform in [-max_degrees, max_degrees]."""
  return warp_affine(image_HxWxC, degrees=_uniform(key, -max_degrees, max_degrees), fill=fill)


def _shifts(key, image_HxWxC, max_fraction):
  height, width, _ = image_HxWxC.shape
  row_key, col_key = jax.random.split(key)
  return (_uniform(row_key, -max_fraction * height, max_fraction * height),
          _uniform(col_key, -max_fraction * width, max_fraction * width))


def translation(key, image_HxWxC, max_fraction=0.1, fill=0.0):
  """Shifts by up to `max_fraction` of the height and of the width."""
  shift_y, shift_x = _shifts(key, image_HxWxC, max_fraction)
  return warp_affine(image_HxWxC, shift_y=shift_y, shift_x=shift_x, fill=fill)


def zoom(key, image_HxWxC, scale=(0.8, 1.2), fill=0.0):
  """Scales about the centre by one factor for both axes, keeping the aspect ratio."""
  return warp_affine(image_HxWxC, scale=_uniform(key, *scale), fill=fill)


def random_crop(key, image_HxWxC, padding=4, fill=0.0):
  """Pads by `padding` pixels of `fill` and crops a random window of the original size."""
  height, width, channels = image_HxWxC.shape
  padded = jnp.pad(image_HxWxC, ((padding, padding), (padding, padding), (0, 0)),
                   constant_values=fill)
  row_key, col_key = jax.random.split(key)
  top = jax.random.randint(row_key, (), 0, 2 * padding + 1)
  left = jax.random.randint(col_key, (), 0, 2 * padding + 1)
  return jax.lax.dynamic_slice(padded, (top, left, 0), (height, width, channels))


def affine(key, image_HxWxC, max_degrees=15.0, max_fraction=0.1, scale=(0.9, 1.1),
           max_shear_degrees=10.0, fill=0.0):
  """Rotation, translation, zoom and horizontal shear, each drawn uniformly."""
  rotate_key, shift_key, scale_key, shear_key = jax.random.split(key, 4)
  shift_y, shift_x = _shifts(shift_key, image_HxWxC, max_fraction)
  return warp_affine(image_HxWxC, degrees=_uniform(rotate_key, -max_degrees, max_degrees),
                     shift_y=shift_y, shift_x=shift_x, scale=_uniform(scale_key, *scale),
                     shear_degrees=_uniform(shear_key, -max_shear_degrees, max_shear_degrees),
                     fill=fill)


def brightness(key, image_HxWxC, max_delta=0.4):
  """Brightness factor uniform in [max(0, 1 - max_delta), 1 + max_delta]."""
  return adjust_brightness(image_HxWxC, _factor(key, max_delta))


def contrast(key, image_HxWxC, max_delta=0.4):
  """Contrast factor uniform in [max(0, 1 - max_delta), 1 + max_delta]."""
  return adjust_contrast(image_HxWxC, _factor(key, max_delta))


def saturation(key, image_HxWxC, max_delta=0.4):
  """Saturation factor uniform in [max(0, 1 - max_delta), 1 + max_delta]."""
  return adjust_saturation(image_HxWxC, _factor(key, max_delta))


def hue(key, image_HxWxC, max_delta=0.1):
  """Hue shift uniform in [-max_delta, max_delta] turns."""
  return adjust_hue(image_HxWxC, _uniform(key, -max_delta, max_delta))


def color_jitter(key, image_HxWxC, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1):
  """Brightness, contrast, saturation and hue adjustments in a random order."""
  order_key, *keys = jax.random.split(key, 5)
  adjustments = [
      functools.partial(adjust_brightness, factor=_factor(keys[0], brightness)),
      functools.partial(adjust_contrast, factor=_factor(keys[1], contrast)),
      functools.partial(adjust_saturation, factor=_factor(keys[2], saturation)),
      functools.partial(adjust_hue, delta=_uniform(keys[3], -hue, hue)),
  ]
  order = jax.random.permutation(order_key, len(adjustments))
  for step in range(len(adjustments)):
    image_HxWxC = jax.lax.switch(order[step], adjustments, image_HxWxC)
  return image_HxWxC


def grayscale(key, image_HxWxC):
  """Grayscale; the stage probability `p` makes it random."""
  del key
  return to_grayscale(image_HxWxC)


def gaussian_noise(key, image_HxWxC, std=0.05):
  """Adds independent N(0, std²) noise to every value."""
  _check_float(image_HxWxC, 'gaussian_noise')
  noise = std * jax.random.normal(key, image_HxWxC.shape, image_HxWxC.dtype)
  return jnp.clip(image_HxWxC + noise, 0, 1)


def salt_and_pepper(key, image_HxWxC, amount=0.05, salt_fraction=0.5):
  """Sets each pixel (all channels) with probability `amount` to 1 (salt) or 0 (pepper)."""
  _check_float(image_HxWxC, 'salt_and_pepper')
  hit_key, salt_key = jax.random.split(key)
  shape_HxWx1 = image_HxWxC.shape[:2] + (1,)
  hit = jax.random.bernoulli(hit_key, amount, shape_HxWx1)
  salt = jax.random.bernoulli(salt_key, salt_fraction, shape_HxWx1).astype(image_HxWxC.dtype)
  return jnp.where(hit, salt, image_HxWxC)


def elastic(key, image_HxWxC, alpha=34.0, sigma=4.0, fill=0.0):
  """Elastic deformation (Simard et al., 2003).

  Each pixel is displaced by `alpha` times a field of U(-1, 1) noise smoothed by
  a Gaussian of `sigma` pixels, one field per axis.
  """
  height, width, _ = image_HxWxC.shape
  rows, cols = pixel_grid(height, width)
  row_key, col_key = jax.random.split(key)
  noise = lambda k: jax.random.uniform(k, (height, width), jnp.float32, -1, 1)
  return resample(image_HxWxC, rows + alpha * gaussian_smooth(noise(row_key), sigma),
                  cols + alpha * gaussian_smooth(noise(col_key), sigma), fill)


def cutout(key, image_HxWxC, size=8, fill=0.0):
  """Cutout (DeVries & Taylor, 2017): masks a size x size square centred on a uniform pixel.

  The square is clipped to the image, so near a border less is masked.
  """
  height, width, _ = image_HxWxC.shape
  row_key, col_key = jax.random.split(key)
  top = jax.random.randint(row_key, (), 0, height) - size // 2
  left = jax.random.randint(col_key, (), 0, width) - size // 2
  mask = box_mask(height, width, top, left, size, size)
  return jnp.where(mask[..., None], jnp.asarray(fill, image_HxWxC.dtype), image_HxWxC)


def random_erasing(key, image_HxWxC, area=(0.02, 0.33), aspect=(0.3, 3.3), fill='random'):
  """Random erasing (Zhong et al., 2020): overwrites a random rectangle.

  Its area is a uniform fraction in `area` of the image, its height/width ratio
  log-uniform in `aspect`; sides are rounded and clipped to the image. `fill`
  is 'random' (uniform noise texture) or one value (a flat colour).
  """
  _check_float(image_HxWxC, 'random_erasing')
  height, width, _ = image_HxWxC.shape
  area_key, aspect_key, top_key, left_key, fill_key = jax.random.split(key, 5)
  box_area = _uniform(area_key, *area) * height * width
  ratio = jnp.exp(_uniform(aspect_key, math.log(aspect[0]), math.log(aspect[1])))
  box_height = jnp.clip(jnp.round(jnp.sqrt(box_area * ratio)), 1, height).astype(jnp.int32)
  box_width = jnp.clip(jnp.round(jnp.sqrt(box_area / ratio)), 1, width).astype(jnp.int32)
  top = jax.random.randint(top_key, (), 0, height - box_height + 1)
  left = jax.random.randint(left_key, (), 0, width - box_width + 1)
  mask = box_mask(height, width, top, left, box_height, box_width)
  if isinstance(fill, str):
    values = jax.random.uniform(fill_key, image_HxWxC.shape, image_HxWxC.dtype)
  else:
    values = jnp.asarray(fill, image_HxWxC.dtype)
  return jnp.where(mask[..., None], values, image_HxWxC)


# Batch transforms: fn(key, images_BxHxWxC, labels_BxK, **params).


def _partners(key, batch_size):
  """Each example's partner: the next one in a random cyclic order, never itself if B >= 2."""
  order_B = jax.random.permutation(key, batch_size)
  return jnp.zeros(batch_size, jnp.int32).at[order_B].set(jnp.roll(order_B, -1))


def mixup(key, images_BxHxWxC, labels_BxK, alpha=0.2):
  """Mixup (Zhang et al., 2018): λ x_i + (1 - λ) x_j and the same for labels.

  λ ~ Beta(alpha, alpha) per example; j follows i in a random cyclic order of
  the batch (never i itself when B ≥ 2).
  """
  batch_size = images_BxHxWxC.shape[0]
  partner_key, weight_key = jax.random.split(key)
  partner_B = _partners(partner_key, batch_size)
  weight_B = jax.vmap(lambda k: jax.random.beta(k, alpha, alpha))(
      jax.random.split(weight_key, batch_size))
  mix = lambda x, w: w * x + (1 - w) * x[partner_B]
  return (mix(images_BxHxWxC, weight_B[:, None, None, None]),
          mix(labels_BxK, weight_B[:, None]))


def cutmix(key, images_BxHxWxC, labels_BxK, alpha=1.0):
  """CutMix (Yun et al., 2019): pastes a box of a partner image; labels weigh by area.

  The box has sides sqrt(1 - λ) of the image's, λ ~ Beta(alpha, alpha), centred
  on a uniform pixel and clipped, so the partner's label weight is the pasted
  fraction of the image.
  """
  batch_size, height, width, _ = images_BxHxWxC.shape
  partner_key, box_key = jax.random.split(key)
  partner_B = _partners(partner_key, batch_size)

  def one_box(k):
    weight_key, row_key, col_key = jax.random.split(k, 3)
    side = jnp.sqrt(1 - jax.random.beta(weight_key, alpha, alpha))
    box_height = jnp.floor(height * side).astype(jnp.int32)
    box_width = jnp.floor(width * side).astype(jnp.int32)
    top = jax.random.randint(row_key, (), 0, height) - box_height // 2
    left = jax.random.randint(col_key, (), 0, width) - box_width // 2
    return box_mask(height, width, top, left, box_height, box_width)

  mask_BxHxW = jax.vmap(one_box)(jax.random.split(box_key, batch_size))
  pasted_B = jnp.mean(mask_BxHxW, axis=(1, 2), dtype=labels_BxK.dtype)
  images = jnp.where(mask_BxHxW[..., None], images_BxHxWxC[partner_B], images_BxHxWxC)
  labels = (1 - pasted_B)[:, None] * labels_BxK + pasted_B[:, None] * labels_BxK[partner_B]
  return images, labels


# Configuration.


def _is_real(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _number(low=-math.inf, high=math.inf, *, open_low=False):
  bound = '>' if open_low else '>='
  if high == math.inf:
    text = f'a number {bound} {low}'
  else:
    text = f'a number in {"(" if open_low else "["}{low}, {high}]'
  above = (lambda v: v > low) if open_low else (lambda v: v >= low)
  return (lambda v: _is_real(v) and above(v) and v <= high), text


def _pair(low=-math.inf, high=math.inf, *, open_low=False):
  check, text = _number(low, high, open_low=open_low)
  return ((lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(map(check, v))
           and v[0] <= v[1]), f'a pair (low, high) with low <= high, each {text}')


_NON_NEGATIVE_INT = ((lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)
                      and v >= 0), 'an integer >= 0')
_FILL = _number(0, 1)
_ERASE_FILL = ((lambda v: v == 'random' or _FILL[0](v)), "'random' or a number in [0, 1]")
_PROBABILITY = _number(0, 1)


@dataclasses.dataclass(frozen=True)
class Transform:
  """A registered transform: its function, parameter checks and default probability."""
  fn: Callable
  params: Mapping[str, tuple[Callable[[Any], bool], str]]
  p: float = 1.0
  mixes_batch: bool = False


TRANSFORMS: dict[str, Transform] = {
    'horizontal_flip': Transform(horizontal_flip, {}, p=0.5),
    'vertical_flip': Transform(vertical_flip, {}, p=0.5),
    'rotation': Transform(rotation, {'max_degrees': _number(0), 'fill': _FILL}),
    'translation': Transform(translation, {'max_fraction': _number(0, 1), 'fill': _FILL}),
    'zoom': Transform(zoom, {'scale': _pair(0, open_low=True), 'fill': _FILL}),
    'random_crop': Transform(random_crop, {'padding': _NON_NEGATIVE_INT, 'fill': _FILL}),
    'affine': Transform(affine, {
        'max_degrees': _number(0), 'max_fraction': _number(0, 1),
        'scale': _pair(0, open_low=True), 'max_shear_degrees': _number(0, 89), 'fill': _FILL}),
    'brightness': Transform(brightness, {'max_delta': _number(0)}),
    'contrast': Transform(contrast, {'max_delta': _number(0)}),
    'saturation': Transform(saturation, {'max_delta': _number(0)}),
    'hue': Transform(hue, {'max_delta': _number(0, 0.5)}),
    'color_jitter': Transform(color_jitter, {
        'brightness': _number(0), 'contrast': _number(0), 'saturation': _number(0),
        'hue': _number(0, 0.5)}),
    'grayscale': Transform(grayscale, {}, p=0.1),
    'gaussian_noise': Transform(gaussian_noise, {'std': _number(0)}),
    'salt_and_pepper': Transform(salt_and_pepper, {
        'amount': _PROBABILITY, 'salt_fraction': _PROBABILITY}),
    'elastic': Transform(elastic, {'alpha': _number(0), 'sigma': _number(0), 'fill': _FILL}),
    'cutout': Transform(cutout, {'size': _NON_NEGATIVE_INT, 'fill': _FILL}),
    'random_erasing': Transform(random_erasing, {
        'area': _pair(0, 1, open_low=True), 'aspect': _pair(0, open_low=True),
        'fill': _ERASE_FILL}),
    'mixup': Transform(mixup, {'alpha': _number(0, open_low=True)}, mixes_batch=True),
    'cutmix': Transform(cutmix, {'alpha': _number(0, open_low=True)}, mixes_batch=True),
}


def apply_per_example(fn: Callable, keys_B: jax.Array, images_BxHxWxC: jax.Array, *,
                      p: float = 1.0, **params) -> jax.Array:
  """Applies `fn(key, image, **params)` to each example with its own key and probability p."""
  def one(key, image_HxWxC):
    gate_key, fn_key = jax.random.split(key)
    transformed = fn(fn_key, image_HxWxC, **params)
    if p == 1:
      return transformed
    return jnp.where(jax.random.bernoulli(gate_key, p), transformed, image_HxWxC)
  return jax.vmap(one)(keys_B, images_BxHxWxC)


def _mix_batch(fn, key, images_BxHxWxC, labels_BxK, *, p, **params):
  """Applies a batch transform, keeping each example's original with probability 1 - p."""
  gate_key, fn_key = jax.random.split(key)
  images, labels = fn(fn_key, images_BxHxWxC, labels_BxK, **params)
  if p == 1:
    return images, labels
  keep_B = ~jax.vmap(lambda k: jax.random.bernoulli(k, p))(
      jax.random.split(gate_key, images.shape[0]))
  return (jnp.where(keep_B[:, None, None, None], images_BxHxWxC, images),
          jnp.where(keep_B[:, None], labels_BxK, labels))


def _as_dict(value):
  return value.to_dict() if hasattr(value, 'to_dict') else value


def _parse_stage(stage) -> tuple[str, dict]:
  stage = _as_dict(stage)
  if isinstance(stage, str):
    name, params = stage, {}
  elif isinstance(stage, Mapping) and 'name' in stage:
    params = dict(stage)
    name = params.pop('name')
  elif (isinstance(stage, (tuple, list)) and len(stage) == 2 and isinstance(stage[0], str)
        and isinstance(_as_dict(stage[1]), Mapping)):
    name, params = stage[0], dict(_as_dict(stage[1]))
  else:
    raise ValueError(f'Augmentation stage {stage!r} must be a name, a (name, params) pair or a '
                     "mapping with a 'name' key.")
  if name not in TRANSFORMS:
    raise ValueError(f'Unknown augmentation {name!r}; allowed: {", ".join(TRANSFORMS)}.')
  checks = dict(TRANSFORMS[name].params, p=_PROBABILITY)
  for param, value in params.items():
    if param not in checks:
      raise ValueError(f'Unknown parameter {param!r} for augmentation {name!r}; allowed: '
                       f'{", ".join(checks)}.')
    check, allowed = checks[param]
    if not check(value):
      raise ValueError(f'Augmentation {name!r} got {param}={value!r}; it must be {allowed}.')
  params.setdefault('p', TRANSFORMS[name].p)
  return name, params


def build_augmentation(spec: Sequence) -> Callable[[jax.Array, dict], dict]:
  """Composes the stages of `spec` into a jittable `augment(key, batch) -> batch`.

  `batch` is a dict with 'image' (float (B, H, W, C) in [0, 1]) and, for mixup
  and cutmix, 'label' as one-hot or soft vectors (B, K); other entries pass
  through. Stages run in order, each with its own key.
  """
  if isinstance(spec, (str, Mapping)) or hasattr(spec, 'to_dict'):
    raise ValueError(f'Augmentation spec {spec!r} must be a sequence of stages.')
  stages = [_parse_stage(stage) for stage in spec]

  def augment(key: jax.Array, batch: dict) -> dict:
    images, labels = batch['image'], batch.get('label')
    if images.ndim != 4 or not jnp.issubdtype(images.dtype, jnp.floating):
      raise ValueError(f'Augmentation needs float images of shape (B, H, W, C) in [0, 1]; got '
                       f'{images.dtype} images of shape {images.shape}.')
    for (name, params), stage_key in zip(stages, jax.random.split(key, max(len(stages), 1))):
      transform = TRANSFORMS[name]
      if transform.mixes_batch:
        if labels is None or labels.ndim != 2 or not jnp.issubdtype(labels.dtype, jnp.floating):
          shape = None if labels is None else labels.shape
          raise ValueError(f'{name} needs float one-hot or soft labels of shape (B, K) under '
                           f"'label'; got {shape}.")
        images, labels = _mix_batch(transform.fn, stage_key, images, labels, **params)
      else:
        keys_B = jax.random.split(stage_key, images.shape[0])
        images = apply_per_example(transform.fn, keys_B, images, **params)
    out = dict(batch, image=images)
    if labels is not None:
      out['label'] = labels
    return out

  return augment
