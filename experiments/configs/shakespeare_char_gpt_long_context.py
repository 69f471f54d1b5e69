r"""Character GPT on Tiny Shakespeare at context 1,024, one run per attention kind.

The same model, data and budget for every kind; only `model.attention` changes:
2 pre-LN layers of width 128, 4 heads of width 32, rotary positions (Su et al. 2021:
with learned positions the model sat at the bigram plateau, 2.46 nats, for 900 steps), tied
embeddings, no dropout; windows of 1,024 characters, batch 2 (2,048 characters a
step: for the same compute, many small steps train this model further than few
large ones), AdamW with warmup and cosine decay, 1,000 steps (2.0M characters,
2 epochs). Validation reports bits per character over every validation window,
so the kinds compare on the same characters; the train log reports examples/s.

  python -m experiments.main --config=experiments/configs/shakespeare_char_gpt_long_context.py \
      --workdir=workdirs/long_context_exact --config.model.attention=exact

and likewise with attention chunked, linear, performer, local, strided and fixed
(Linformer cannot be causal). The sparse kinds use blocks of 128 positions:
local sees its own block and the previous one (128 to 255 characters back).
"""

import ml_collections

from experiments.configs import shakespeare_char_conv

CONTEXT = 1024


def get_config():
  config = shakespeare_char_conv.get_config()
  config.data.window = CONTEXT
  config.task.sample_length = 0
  config.model = ml_collections.ConfigDict({
      'name': 'gpt', 'num_layers': 2, 'features': 128, 'num_heads': 4, 'mlp_dim': 512,
      'max_length': CONTEXT, 'positions': 'rotary', 'attention': 'exact',
      'attention_options': (), 'dropout_rate': 0.0, 'pre_norm': True, 'tie_embeddings': True,
      'use_bias': False, 'dtype': 'float32'})
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 0.1
  config.optimizer.final_lr_fraction = 0.1
  config.global_batch_size = 2
  config.eval_batch_size = 16
  config.num_train_steps = 1000
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 250
  return config
