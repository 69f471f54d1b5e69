r"""Post-LN at a high learning rate, no warmup: the unstable half of Xiong et al. 2020's comparison.

dates_transformer_high_lr.py (peak learning rate 1e-2, no warmup, 300 steps)
with the post-LN blocks of Vaswani et al. 2017, LayerNorm(x + f(x)); Xiong et
al. 2020 report that post-LN needs the warmup that pre-LN can do without.

  python -m experiments.main --config=experiments/configs/dates_transformer_post_ln_high_lr.py \
      --workdir=workdirs/dates_transformer_post_ln_high_lr
"""

from experiments.configs import dates_transformer_high_lr


def get_config():
  config = dates_transformer_high_lr.get_config()
  config.model.pre_norm = False
  return config
