r"""Dates → ISO 8601 with the Transformer encoder–decoder's original post-LN blocks.

As dates_transformer.py (same data, model size, optimiser and warmup), but each
sub-layer is LayerNorm(x + f(x)) as in Vaswani et al. 2017, with no final
LayerNorm on either stack.

  python -m experiments.main --config=experiments/configs/dates_transformer_post_ln.py \
      --workdir=workdirs/dates_transformer_post_ln
"""

from experiments.configs import dates_transformer


def get_config():
  config = dates_transformer.get_config()
  config.model.pre_norm = False
  return config
