r"""Dates → ISO 8601 with a Transformer encoder–decoder (Vaswani et al. 2017), pre-LN.

The data, task and evaluation of dates_seq2seq_attention.py (20,000 training
dates in 18 formats, 2,000 test dates, teacher-forced training, greedy
decoding, `exact_match` over all ten characters and EOS), so the exact match
compares with the recurrent rows. The model (models/transformer/encoder_decoder.py)
has 2 encoder and 2 decoder blocks of width 128 with 4 heads and an FFN of 512,
sinusoidal positions, the output tied to the target embedding and dropout 0.1;
the blocks are pre-LN (x + f(LayerNorm(x)), Xiong et al. 2020), and
dates_transformer_post_ln.py is the same with the paper's post-LN blocks.
AdamW with β₂ = 0.98 (the paper's) and weight decay 0.01 on the kernels, 100
warmup steps to 1e-3 and cosine decay, gradients clipped to norm 1.

  python -m experiments.main --config=experiments/configs/dates_transformer.py \
      --workdir=workdirs/dates_transformer
"""

import ml_collections

from experiments.configs import dates_seq2seq_attention


def get_config():
  config = dates_seq2seq_attention.get_config()
  config.model = ml_collections.ConfigDict({
      'name': 'transformer_seq2seq', 'vocab_size': 128, 'num_layers': 2, 'features': 128,
      'num_heads': 4, 'mlp_dim': 512, 'max_length': 64, 'positions': 'sinusoidal',
      'dropout_rate': 0.1, 'pre_norm': True, 'tie_embeddings': True, 'use_bias': True,
      'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.b2 = 0.98
  config.optimizer.weight_decay = 0.01
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 100
  config.optimizer.grad_clip_norm = 1.0
  return config
