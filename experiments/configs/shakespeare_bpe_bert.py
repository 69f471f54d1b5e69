r"""BERT masked-language-model pre-training on Tiny Shakespeare, byte-level BPE, in ~20 minutes.

A small BERT (Devlin et al. 2019): 4 layers, width 256, 4 heads, learned
positions, the MLM head tied to the token embedding. The blocks are pre-LN
(Xiong et al. 2020) rather than BERT's post-LN: 800 steps leave no room for
the long warmup and small learning rate that post-LN needs. Text is cut by a
byte-level BPE of 1,024 tokens (trained on the train split) into windows of
128 tokens; each becomes [CLS] window [SEP] (130 positions), and 15% of its
tokens are chosen for prediction, 80% of them replaced by [MASK], 10% by a
random token, 10% left as they are (fresh masks every step; the same masks at
every evaluation). AdamW with BERT's β₂ = 0.999 and weight decay 0.01, linear
warmup over the first 10% of the steps, cosine decay and clipping; batch 32.

Reports the masked-token loss, perplexity and accuracy over the validation
split beside two unigram baselines from the train split's token counts
(`unigram_accuracy`: always the train split's most frequent token, newline,
right on 8.52% of the masked validation tokens; `unigram_loss`). Sized for about 20 minutes on 2 CPU cores: a step
costs about 2.1 s of CPU time, against 2.4 s for shakespeare_char_gpt.py,
whose steps take about 1.2 s of wall time. input.txt is read from
$TINY_SHAKESPEARE_DIR.

  python -m experiments.main --config=experiments/configs/shakespeare_bpe_bert.py \
      --workdir=workdirs/shakespeare_bpe_bert
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'tiny_shakespeare'
  config.data.train_split = 'train'
  config.data.eval_split = 'validation'
  config.data.tokenizer = 'byte_bpe'
  config.data.vocab_size = 1024
  config.data.window = 128
  config.task = ml_collections.ConfigDict({
      'name': 'masked_language_model', 'mask_rate': 0.15,
      'replace_probabilities': (0.8, 0.1, 0.1), 'use_cls_sep': True})
  # vocab_size comes from the tokenizer; the 4 special ids follow its 1,024.
  config.model = ml_collections.ConfigDict({
      'name': 'bert', 'num_special_tokens': 4, 'num_segments': 0, 'num_layers': 4,
      'features': 256, 'num_heads': 4, 'mlp_dim': 1024, 'max_length': 130,
      'positions': 'learned', 'dropout_rate': 0.1, 'pre_norm': True, 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.b2 = 0.999
  config.optimizer.warmup_steps = 80
  config.optimizer.weight_decay = 0.01
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.final_lr_fraction = 0.05
  config.global_batch_size = 32
  config.eval_batch_size = 128
  config.num_train_steps = 800
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 200
  return config
