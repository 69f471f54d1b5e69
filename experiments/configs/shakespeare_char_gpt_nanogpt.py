r"""nanoGPT's "baby GPT" on character-level Tiny Shakespeare, for an accelerator.

The published reference configuration (Karpathy, nanoGPT,
config/train_shakespeare_char.py): 6 layers, 6 heads, width 384, context 256,
dropout 0.2, batch 64, AdamW (β₂ = 0.99, weight decay 0.1, learning rate 1e-3
with 100 warmup steps and cosine decay to 1e-4 at step 5,000), gradients
clipped to norm 1, no biases, tied embeddings. nanoGPT reports a validation
loss of 1.4697 after 5,000 steps on one GPU, on its own validation split (the
last 10% of the characters; ours is TFDS's 5% validation piece, so the two
losses are not the same measurement). On this CPU a step takes too long for 5,000
steps in an hour; shakespeare_char_gpt.py is the budgeted version.

  python -m experiments.main --config=experiments/configs/shakespeare_char_gpt_nanogpt.py \
      --workdir=workdirs/shakespeare_char_gpt_nanogpt
"""

import ml_collections

from experiments.configs import shakespeare_char_conv


def get_config():
  config = shakespeare_char_conv.get_config()
  config.data.window = 256
  config.model = ml_collections.ConfigDict({
      'name': 'gpt', 'num_layers': 6, 'features': 384, 'num_heads': 6, 'max_length': 256,
      'positions': 'learned', 'dropout_rate': 0.2, 'pre_norm': True, 'tie_embeddings': True,
      'use_bias': False, 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.b2 = 0.99
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 0.1
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.final_lr_fraction = 0.1
  config.global_batch_size = 64
  config.eval_batch_size = 64
  config.num_train_steps = 5000
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 250
  return config
