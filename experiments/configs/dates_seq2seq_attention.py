r"""Dates → ISO 8601 with a GRU encoder–decoder and additive (Bahdanau) attention.

As dates_seq2seq.py, but the encoder is bidirectional and every decoder step
scores the encoder states with its previous state, e = vᵀ tanh(W s_{t−1} + U h_i)
(Bahdanau et al. 2015), and feeds the context vector to the cell and the output
layer. `experiments/plot_attention.py` draws the weights of a trained run.

  python -m experiments.main --config=experiments/configs/dates_seq2seq_attention.py \
      --workdir=workdirs/dates_seq2seq_attention
"""

from experiments.configs import dates_seq2seq


def get_config():
  config = dates_seq2seq.get_config()
  config.model.bidirectional_encoder = True
  config.model.attention = 'additive'
  return config
