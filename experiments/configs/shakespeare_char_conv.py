r"""Character-level causal dilated convolution LM (WaveNet-style) on Tiny Shakespeare.

Two stacks of dilations 1, 2, …, 64 with kernel size 2 see the last 255
characters (van den Oord et al. 2016); windows of 256 characters, batch 32,
AdamW with warmup and cosine decay. Reports validation loss, perplexity and
bits per character over every validation character, and samples from "ROMEO:"
after every evaluation. input.txt is read from $TINY_SHAKESPEARE_DIR.

  python -m experiments.main --config=experiments/configs/shakespeare_char_conv.py \
      --workdir=workdirs/shakespeare_char_conv
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'tiny_shakespeare'
  config.data.train_split = 'train'
  config.data.eval_split = 'validation'
  config.data.tokenizer = 'char'
  config.data.window = 256
  config.task = ml_collections.ConfigDict({
      'name': 'language_model', 'prompt': 'ROMEO:', 'sample_length': 300, 'temperature': 0.8,
      'top_k': 0, 'top_p': 1.0, 'num_samples': 1})
  config.model = ml_collections.ConfigDict({
      'name': 'causal_conv_lm', 'channels': 128, 'kernel_size': 2,
      'dilations': (1, 2, 4, 8, 16, 32, 64), 'num_stacks': 2, 'dropout_rate': 0.1,
      'dtype': 'float32'})
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 200
  config.optimizer.weight_decay = 0.01
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.final_lr_fraction = 0.05
  config.global_batch_size = 32
  config.eval_batch_size = 64
  config.num_train_steps = 3000
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 500
  return config
