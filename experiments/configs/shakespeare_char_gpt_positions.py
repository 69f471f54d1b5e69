r"""A short character GPT run for comparing position schemes (Tiny Shakespeare, context 64).

Two pre-LN layers of width 128 and 4 heads, trained on windows of 64
characters for 1,500 steps of batch 32; only `model.positions` changes between
the four runs. `experiments/evaluate.py` then scores each on validation
windows of 64 and of 128 characters: learned positions have no embedding past
the trained length, sinusoidal ones have one but were never trained on it,
while ALiBi and rotary positions only see distances (Press et al. 2022).

  python -m experiments.main --config=experiments/configs/shakespeare_char_gpt_positions.py \
      --workdir=workdirs/gpt_positions_learned --config.model.positions=learned
  python -m experiments.evaluate --workdir=workdirs/gpt_positions_learned --window=128

(and likewise with positions sinusoidal, alibi and rotary). Sinusoidal positions of
amplitude 1 drown token embeddings initialised at std 0.02; `--config.model.scale_embeddings=True`
multiplies the tokens by √D first, as Vaswani et al. do.
"""

from experiments.configs import shakespeare_char_gpt


def get_config():
  config = shakespeare_char_gpt.get_config()
  config.data.window = 64
  config.model.update({'num_layers': 2, 'features': 128, 'num_heads': 4, 'max_length': 64,
                       'dropout_rate': 0.0, 'scale_embeddings': False})
  config.optimizer.learning_rate = 3e-3
  config.global_batch_size = 32
  config.num_train_steps = 1500
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.task.sample_length = 200
  return config
