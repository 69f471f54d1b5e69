r"""Character-level LSTM language model on Tiny Shakespeare (Karpathy 2015, "char-rnn").

One LSTM layer of 512 units over 64-dimensional character embeddings, with
dropout on the embeddings and before the output (Zaremba et al. 2014); windows
of 128 characters, batch 32, AdamW with warmup and cosine decay, gradients
clipped to global norm 1; the scan is unrolled 8 steps per loop iteration,
as the README's run was (a first, short measurement favoured it; the sweep in
the README's benchmarks found unroll 1 as fast, 4,478 vs 4,153 tokens/s). Trained by the language-model task like the WaveNet-style
conv LM (shakespeare_char_conv.py), so the validation bits per character are
comparable with it and with the n-gram baselines (README). Samples from
"ROMEO:" after every evaluation use the LSTM's carry as a decoding cache.

  python -m experiments.main --config=experiments/configs/shakespeare_char_lstm.py \
      --workdir=workdirs/shakespeare_char_lstm
"""

import ml_collections

from experiments.configs import shakespeare_char_conv


def get_config():
  config = shakespeare_char_conv.get_config()
  config.data.window = 128
  config.model = ml_collections.ConfigDict({
      'name': 'rnn_lm', 'cell': 'lstm', 'features': 512, 'num_layers': 1, 'embed_dim': 64,
      'dropout_rate': 0.2, 'unroll': 8, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 0.01
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.final_lr_fraction = 0.05
  config.global_batch_size = 32
  config.eval_batch_size = 128
  config.num_train_steps = 2500
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 250
  return config
