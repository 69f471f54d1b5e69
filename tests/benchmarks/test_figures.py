"""The rates the benchmark scripts print, against numbers worked by hand (each script in its own
process: they define absl flags of the same names)."""

import pytest

from tests.subprocess_util import run_python


def test_train_step_figures_are_the_rates_of_the_measured_times():
  result = run_python('''
      import json, types
      from benchmarks import train_step
      measured = {'step_seconds': 0.25, 'batch_seconds': 0.01, 'flops': 5e10,
                  'products_seconds': 0.1, 'products': [types.SimpleNamespace(flops=1e9)] * 3}
      windows = train_step.figures(measured, batch_size=32, window=128, peak=4e11)
      images = train_step.figures({**measured, 'products_seconds': None}, batch_size=32,
                                  window=None, peak=4e11)
      print(json.dumps({'windows': windows, 'images': images}))
      ''')
  # A step of 32 windows of 128 tokens and 5e10 FLOPs in 0.25 s, on a 4e11 FLOP/s peak; its
  # three products of 1e9 FLOPs each in 0.1 s alone; a batch read in 0.01 s.
  assert result['windows'] == pytest.approx({
      'steps_per_second': 4, 'examples_per_second': 128, 'tokens_per_second': 16384,
      'flops_per_second': 2e11, 'fraction_of_peak': 0.5, 'products_flops': 3e9,
      'products_flops_per_second': 3e10, 'products_fraction_of_peak': 0.075,
      'pipeline_examples_per_second': 3200, 'pipeline_over_step': 25})
  assert (result['images']['tokens_per_second'], result['images']['products_flops_per_second'],
          result['images']['products_fraction_of_peak']) == (None, None, None)


def test_fitted_exponent_is_the_slope_of_a_power_law_over_the_fitted_lengths():
  result = run_python('''
      import json
      from benchmarks import attention_scaling
      lengths = [256, 512, 1024, 2048, 4096, 8192]
      # Below FIT_FROM (1,024) the values follow no law; a setting not run is None.
      square = [1.0, 1.0] + [3e-6 * n**2 for n in lengths[2:]]
      linear = [5.0, None] + [5e-3 * n for n in lengths[2:-1]] + [None]
      print(json.dumps([attention_scaling.fitted_exponent(lengths, square),
                        attention_scaling.fitted_exponent(lengths, linear),
                        attention_scaling.fitted_exponent(lengths, [1, 2, 3, None, None, None])]))
      ''')
  assert result[:2] == pytest.approx([2.0, 1.0])
  assert result[2] != result[2]  # NaN: fewer than two lengths to fit


def test_generation_rates_count_the_new_tokens_of_every_sequence():
  # A fake `generate` that takes 1 ms per new token with the cache and 4 ms without, on a
  # fake clock; the rates must be those of the tokens it returns.
  result = run_python('''
      import json, types
      import numpy as np
      from benchmarks import generation
      now, made = [0.0], []
      def generate(model, variables, prompt, rng, num_new_tokens, temperature, use_cache):
        tokens = np.zeros((prompt.shape[0], prompt.shape[1] + num_new_tokens), np.int32)
        made.append(tokens.size - prompt.size)
        now[0] += made[-1] * (1e-3 if use_cache else 4e-3)
        return tokens
      generation.sampling.generate = generate
      generation.time = types.SimpleNamespace(perf_counter=lambda: now[0])
      print(json.dumps({'rates': generation.rates(None, None, length=9, batch=3, repeats=2),
                        'made': sorted(set(made))}))
      ''')
  assert result['made'] == [24]  # 3 sequences of 8 new tokens after a one-token prompt
  assert result['rates'] == pytest.approx([250, 1000, 4])
