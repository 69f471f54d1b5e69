r"""Pre-LN at a high learning rate, no warmup: the stable half of Xiong et al. 2020's comparison.

dates_transformer.py (pre-LN) with the peak learning rate 10× higher, 1e-2, no
warmup (cosine decay from the first step) and a short run of 300 steps, logged
every 25. Xiong et al. 2020 ("On Layer Normalization in the Transformer
Architecture") show that the gradients of the last layers of a post-LN
Transformer are large at initialisation, so without warmup a large learning
rate derails it, while pre-LN, whose gradients are well scaled, trains;
dates_transformer_post_ln_high_lr.py is the same run with post-LN blocks.

  python -m experiments.main --config=experiments/configs/dates_transformer_high_lr.py \
      --workdir=workdirs/dates_transformer_high_lr
"""

from experiments.configs import dates_transformer


def get_config():
  config = dates_transformer.get_config()
  config.optimizer.learning_rate = 1e-2
  config.optimizer.warmup_steps = 0
  config.num_train_steps = 300
  config.log_every_steps = 25
  config.eval_every_steps = 300
  config.checkpoint_every_steps = 300
  return config
