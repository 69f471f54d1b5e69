r"""A score-based model of a 2-D Gaussian mixture (the 8-component ring), whose exact density
and score (data/toy2d.py) check what it learns.

The VE SDE (Song et al. 2021; σ from 0.01 to 50) with
denoising score matching in continuous time; the network is a time-conditioned MLP
(models/generative/time_mlp.py, 3 × 128, time scaled by 1,000 for its embedding) whose output
o gives the score −o/σ(t). Adam 1e-3, batch 256, 20,000 steps (about 2 minutes).

Then `python -m experiments.mixture_diffusion --workdir=workdirs/mixture_score_sde` samples it
and scores its probability-flow likelihood against the exact density.

  python -m experiments.main --config=experiments/configs/mixture_score_sde.py \
      --workdir=workdirs/mixture_score_sde

`--config.task.sde=vp` trains with the VP SDE instead.
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'gaussian_mixture'
  config.data.options = ml_collections.ConfigDict({'mixture': 'ring'})
  config.task = ml_collections.ConfigDict({
      'name': 'diffusion', 'objective': 'score_sde', 'sde': 've', 'input_key': 'x',
      'num_samples': 0, 'sample_steps': 0})
  config.model = ml_collections.ConfigDict({
      'name': 'time_mlp', 'hidden': (128, 128, 128), 'embed_dim': 32, 'time_scale': 1000.0,
      'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.0
  config.optimizer.warmup_steps = 100
  config.global_batch_size = 256
  config.eval_batch_size = 1000
  config.num_train_steps = 20_000
  config.log_every_steps = 1000
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 10_000
  return config
