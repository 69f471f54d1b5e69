"""benchmarks/hlo_dots.py reads every matrix product, with its FLOPs, from compiled HLO."""

import re

import jax
import jax.numpy as jnp

from benchmarks import hlo_dots
from benchmarks.hlo_dots import Dot


def _loss(x_MxK, w_KxF, q_BxTxH, k_BxSxH):
  scores_BxTxS = jnp.einsum('bth,bsh->bts', q_BxTxH, k_BxSxH)
  return jnp.tanh(x_MxK @ w_KxF).sum() + jnp.sin(scores_BxTxS).sum()


def test_every_product_of_a_gradient_is_found_with_its_flops_and_batch_dimensions():
  M, K, F, B, T, S, H = 32, 16, 24, 3, 5, 7, 8
  args = [jnp.ones(shape) for shape in ((M, K), (K, F), (B, T, H), (B, S, H))]
  compiled = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1, 2, 3))).lower(*args).compile()
  text = compiled.as_text()
  dots = hlo_dots.dot_flops(text)
  # Forward x w and its two gradients x-side and w-side, each 2·M·K·F; the scores and their
  # two gradients, each 2·B·T·S·H with batch dimensions.
  assert sorted(dots.values()) == sorted([Dot(2 * M * K * F, False)] * 3 +
                                         [Dot(2 * B * T * S * H, True)] * 3)
  entry = text[text.index('ENTRY'):]
  for name in dots:  # top-level operations (what a profiler trace names), not fused inner dots
    assert re.search(rf'%{re.escape(name)} = ', entry), name
