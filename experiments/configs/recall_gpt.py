r"""Associative recall at context 2,048: which attention kinds retrieve a far token.

Data: `associative_recall` (data/builders/associative_recall.py), 1,023
key-value pairs, a query marker and a query key; the only scored target is the
query key's value, so `accuracy` is the recall accuracy (chance 1/64). The
value lies 2 to 2,046 tokens back, uniformly over the pairs (mean 1,024).

Model: a GPT (models/transformer/gpt.py) of 2 pre-LN layers, width 128,
4 heads, rotary positions (Su et al. 2021), no dropout; `model.attention`
picks the attention kind and nothing else changes between runs:

  python -m experiments.main --config=experiments/configs/recall_gpt.py \
      --workdir=workdirs/recall_gpt_exact --config.model.attention=exact

and likewise with attention chunked, linear, performer, local, strided and
fixed (workdirs/recall_gpt_<kind>). `--config.data.options.length=64` runs the
same task at context 64 (31 pairs; `model.max_length` follows the length).

Budget: with exact attention a training step of 4 examples takes about 3.4 s
on this 2-core CPU (1.1 examples/s) and an evaluation of the 500 validation
examples about 2 minutes, so 200 steps and two evaluations take about
15 minutes. That is 800 examples, 4% of the train split: enough to compare
what the kinds cost at this length, far too few to learn the task. At context
64, 3,000 steps of 32 examples reach 22% train but 3.2% validation accuracy:
with one answer per example, the model memorises the 20,000 training examples
before it learns to recall.
"""

import ml_collections

from experiments.configs import default

LENGTH = 2048


def get_config():
  config = default.get_config()
  config.data.name = 'associative_recall'
  config.data.options = ml_collections.ConfigDict({'length': LENGTH})
  # The records are the windows and the data set brings its vocabulary (data/text.py).
  config.data.tokenizer = 'dataset'
  config.data.eval_split = 'validation'
  config.task = ml_collections.ConfigDict({'name': 'language_model', 'sample_length': 0})
  config.model = ml_collections.ConfigDict({
      'name': 'gpt', 'num_layers': 2, 'features': 128, 'num_heads': 4, 'mlp_dim': 512,
      'max_length': config.data.options.get_ref('length'), 'positions': 'rotary',
      'attention': 'exact', 'attention_options': (), 'dropout_rate': 0.0, 'pre_norm': True,
      'tie_embeddings': True, 'use_bias': True, 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.01
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.warmup_steps = 20
  config.optimizer.grad_clip_norm = 1.0
  config.global_batch_size = 4
  config.eval_batch_size = 10
  config.num_train_steps = 200
  config.log_every_steps = 10
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  return config
