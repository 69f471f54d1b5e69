r"""Character GPT on Tiny Shakespeare within 60 minutes of this 2-core CPU.

nanoGPT's baby GPT (shakespeare_char_gpt_nanogpt.py, 6 × 384, context 256,
batch 64) takes about 17 s per step here, 200 steps an hour. This version keeps
its recipe (pre-LN, learned positions, tied embeddings, no biases, AdamW with
β₂ = 0.99 and weight decay 0.1, warmup and cosine decay, clipping) at 4 layers,
4 heads, width 256, context 128 and batch 32, sized so that its steps fill
about 60 minutes; dropout 0.1 as the model is smaller and trains for fewer
tokens.

  python -m experiments.main --config=experiments/configs/shakespeare_char_gpt.py \
      --workdir=workdirs/shakespeare_char_gpt
"""

from experiments.configs import shakespeare_char_gpt_nanogpt


def get_config():
  config = shakespeare_char_gpt_nanogpt.get_config()
  config.data.window = 128
  config.model.update({'num_layers': 4, 'features': 256, 'num_heads': 4, 'max_length': 128,
                       'dropout_rate': 0.1})
  config.optimizer.learning_rate = 2e-3
  config.global_batch_size = 32
  config.eval_batch_size = 128
  config.num_train_steps = 3000
  config.eval_every_steps = 500
  return config
