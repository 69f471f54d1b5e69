"""experiments/ngram.py turns its flags into the models it fits, refusing bad ones by name."""

from absl import app
import pytest

from experiments import ngram
from tests.messages import one_sentence


def test_every_order_gets_every_smoothing():
  specs = ngram.model_specs(['1', '3'], ['kneser_ney', 'add_k'], ['1', '0.01'], 'estimate')
  assert [(order, label) for order, label, _ in specs] == [
      (1, 'Kneser–Ney, D estimated'), (1, 'add-k, k = 1'), (1, 'add-k, k = 0.01'),
      (3, 'Kneser–Ney, D estimated'), (3, 'add-k, k = 1'), (3, 'add-k, k = 0.01')]
  assert specs[0][2] == {'smoothing': 'kneser_ney', 'discount': None}
  assert specs[2][2] == {'smoothing': 'add_k', 'add_k': 0.01}


@pytest.mark.parametrize('orders, smoothing, parts', [
    (['0', '2'], ['add_k'], ['--orders has 0', 'at least 1']),
    (['two'], ['add_k'], ['--orders', 'numbers']),
    (['2'], ['witten_bell'], ["'witten_bell'", 'kneser_ney']),
])
def test_bad_flags_are_refused_before_the_data_is_read(orders, smoothing, parts):
  one_sentence(lambda: ngram.model_specs(orders, smoothing, ['1'], '0.75'), *parts,
               error=app.UsageError)
