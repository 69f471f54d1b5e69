"""The rates the benchmark scripts print, against numbers worked by hand (each script in its own
process: they define absl flags of the same names)."""

import os
import re
import subprocess
import sys

import pytest

from tests.subprocess_util import REPO_ROOT
from tests.subprocess_util import run_python
from train import xla_cpu


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


def test_fitted_exponent_starts_at_fit_from_and_fits_two_lengths():
  result = run_python('''
      import json
      from benchmarks import attention_scaling
      # Only 1,024 and 2,048 are fitted: 512 is below FIT_FROM, and off the law.
      print(json.dumps(attention_scaling.fitted_exponent([512, 1024, 2048],
                                                         [1.0, 1024.0**3, 2048.0**3])))
      ''')
  assert result == pytest.approx(3.0)


def test_attention_scaling_prints_times_memory_exponents_and_where_each_kind_overtakes_exact():
  # Every compiled setting and its time made up (a setting over --max_gb is None): the tables
  # must be those numbers, in ms and MB, in the order of the lengths.
  result = run_python('''
      import contextlib, io, json
      from absl import flags
      from benchmarks import attention_scaling
      flags.FLAGS(['attention_scaling.py', '--kinds=exact,local,fixed,strided,linear',
                   '--lengths=4096,512,2048,1024'])
      MB = 2 ** 20
      settings = {  # (seconds, bytes) per length 512, 1,024, 2,048, 4,096
          'exact': [(1e-9 * n * n, b) for n, b in ((512, 3 * MB), (1024, 4 * MB),
                                                   (2048, 16 * MB))] + [(None, 64 * MB)],
          'local': [(2e-6 * n, 4096 * n) for n in (512, 1024, 2048, 4096)],
          'fixed': [(1e-9 * 512 * 512, 512 * 1024)] + [(1e-9 * 1024 * n, 1024 * n)
                                                       for n in (1024, 2048, 4096)],
          'strided': [(0.5 * (n / 1024) ** 0.25, 2 ** 15 * n ** 0.5)
                      for n in (512, 1024, 2048, 4096)],
          'linear': [(None, 2 ** 31 * (n / 512) ** 1.5) for n in (512, 1024, 2048, 4096)],
      }
      index = {512: 0, 1024: 1, 2048: 2, 4096: 3}
      def compile_setting(kind, length, causal):
        seconds, total = settings[kind][index[length]]
        return (None if seconds is None else (kind, length)), total
      attention_scaling.compile_setting = compile_setting
      attention_scaling.time_interleaved = lambda calls: [
          None if c is None else settings[c[0]][index[c[1]]][0] for c in calls]
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        attention_scaling.main([])
      print(json.dumps(printed.getvalue().splitlines()))
      ''')
  header, columns, *rows = result
  assert columns.split() == ['kind', '512', '1024', '2048', '4096']
  times = [line.split('  ') for line in rows[:5]]
  cells = [[cell.strip() for cell in row if cell.strip()] for row in times]
  # exact: n²·1e-9 s, e.g. 1.048576 ms at 1,024; 4,096 over --max_gb.
  assert cells == [
      ['exact', '0.3 (3)', '1.0 (4)', '4.2 (16)', '— (64)'],
      ['local', '1.0 (2)', '2.0 (4)', '4.1 (8)', '8.2 (16)'],
      ['fixed', '0.3 (0)', '1.0 (1)', '2.1 (2)', '4.2 (4)'],
      ['strided', '420.4 (1)', '500.0 (1)', '594.6 (1)', '707.1 (2)'],
      ['linear', '— (2048)', '— (5793)', '— (16384)', '— (46341)']]
  fits = [line.split() for line in rows[-5:]]
  # Exponents from 1,024 up (exact's 512 is off its memory law, fixed's off its time law).
  # local is first faster at 2,048 (4.096 ms against 4.194 ms); fixed ties exact at 512 and
  # 1,024 and is faster from 2,048; strided only runs where exact does not; linear never runs.
  assert fits == [['exact', '2.00', '2.00', '—'],
                  ['local', '1.00', '1.00', '2048'],
                  ['fixed', '1.00', '1.00', '2048'],
                  ['strided', '0.25', '0.50', '4096'],
                  ['linear', '—', '1.50', '—']]


def test_train_step_figures_of_products_not_timed_are_none_for_token_windows_too():
  result = run_python('''
      import json, types
      from benchmarks import train_step
      measured = {'step_seconds': 0.5, 'batch_seconds': 0.02, 'flops': 1e10,
                  'products_seconds': None, 'products': [types.SimpleNamespace(flops=2e9)]}
      print(json.dumps(train_step.figures(measured, batch_size=8, window=64, peak=1e11)))
      ''')
  # --noproducts_alone on a model of token windows: 8 windows of 64 tokens in 0.5 s.
  assert result == pytest.approx({
      'steps_per_second': 2, 'examples_per_second': 16, 'tokens_per_second': 1024,
      'flops_per_second': 2e10, 'fraction_of_peak': 0.2, 'products_flops': 2e9,
      'products_flops_per_second': None, 'products_fraction_of_peak': None,
      'pipeline_examples_per_second': 400, 'pipeline_over_step': 25})


def test_matmul_peak_is_the_best_rate_of_2_n_cubed_flops_over_the_sizes():
  # On a clock whose n = 8 products last 2 µs and 1 µs and n = 16 ones 4 µs and 8 µs, the
  # best rates are 2·8³ / 1 µs = 1.024e9 and 2·16³ / 4 µs = 2.048e9 FLOP/s: the peak is
  # n = 16's.
  result = run_python('''
      import json, types
      import numpy as np
      from benchmarks import train_step
      ticks = iter(np.cumsum([0, 2e-6, 0, 1e-6, 0, 4e-6, 0, 8e-6]))
      train_step.time = types.SimpleNamespace(perf_counter=lambda: float(next(ticks)))
      peaks = [train_step.matmul_peak_flops(sizes=(8, 16), repeats=2)]
      # The same times with the sizes the other way round: the best is the first size's.
      ticks = iter(np.cumsum([0, 4e-6, 0, 8e-6, 0, 2e-6, 0, 1e-6]))
      peaks.append(train_step.matmul_peak_flops(sizes=(16, 8), repeats=2))
      print(json.dumps(peaks))
      ''')
  for peak, n in result:
    assert peak == pytest.approx(2 * 16**3 / 4e-6) and n == 16


def test_loops_counted_once_are_a_models_scan_and_more_than_one_micro_batch():
  result = run_python('''
      import json
      import ml_collections
      from benchmarks import train_step
      def config(model, **top):
        return ml_collections.ConfigDict({'model': model, **top})
      print(json.dumps([
          train_step.loops_counted_once(config({'name': 'mlp'})),
          train_step.loops_counted_once(config({'name': 'mlp'}, grad_accum_steps=1)),
          train_step.loops_counted_once(config({'name': 'gru', 'unroll': 1}, grad_accum_steps=1)),
          train_step.loops_counted_once(config({'name': 'mlp'}, grad_accum_steps=2)),
          train_step.loops_counted_once(config({'name': 'gru', 'unroll': 4},
                                               grad_accum_steps=4))]))
      ''')
  assert result == [[], [], ['scan unrolled'], ['micro-batches as one batch'],
                    ['scan unrolled', 'micro-batches as one batch']]


def test_loop_free_flops_are_counted_once_per_config_with_no_scan_left_and_one_micro_batch():
  # The config handed to the count, recorded in place of compiling it.
  result = run_python('''
      import json
      import ml_collections
      from benchmarks import train_step
      counted = []
      def compiled_flops(config):
        counted.append(config.to_dict())
        return 1e9 * len(counted), 0
      train_step._compiled_flops = compiled_flops
      def config(unroll, accum, features):
        return ml_collections.ConfigDict({'model': {'name': 'gru', 'unroll': unroll,
                                                    'features': features},
                                          'data': {'window': 4096}, 'grad_accum_steps': accum})
      first = config(1, 4, 32)
      results = [train_step.loop_free_step_flops(first),
                 train_step.loop_free_step_flops(config(16, 2, 32)),  # the same arithmetic
                 train_step.loop_free_step_flops(config(1, 4, 64))]
      longer = config(1, 4, 32)
      longer.data.window = 8192  # the same model on other data: other FLOPs
      results.append(train_step.loop_free_step_flops(longer))
      print(json.dumps({'results': results, 'counted': counted, 'first': first.to_dict()}))
      ''')
  assert result['results'] == [[1e9, 0], [1e9, 0], [2e9, 0], [3e9, 0]]
  assert [c['model']['features'] for c in result['counted']] == [32, 64, 32]
  assert [c['data']['window'] for c in result['counted']] == [4096, 4096, 8192]
  for c in result['counted']:
    assert c['model']['unroll'] >= c['data']['window'] and c['grad_accum_steps'] == 1
  assert result['first']['model']['unroll'] == 1 and result['first']['grad_accum_steps'] == 4


def test_train_step_prints_each_settings_figures_and_the_step_time_ratios():
  # Two dtypes measured on made-up times: float32's step 0.25 s, bfloat16's 0.125 s (with one
  # loop left in it and its products not timed), each of 5e10 FLOPs on a 4e11 FLOP/s peak; a
  # batch of 64 windows of 16 tokens, in 2 micro-batches.
  result = run_python('''
      import contextlib, io, json, types
      from absl import flags
      from benchmarks import train_step
      flags.FLAGS(['train_step.py', '--config=experiments/configs/digits_mlp.py',
                   '--dtypes=float32,bfloat16'])
      train_step._CONFIG.value.data.window = 16
      train_step._CONFIG.value.grad_accum_steps = 2
      train_step._check_settings = lambda config, settings: None
      train_step.matmul_peak_flops = lambda: (4e11, 2048)
      products = [types.SimpleNamespace(flops=1e9)] * 3
      def measure_step(config, steps):
        if config.model.dtype == 'float32':
          return {'step_seconds': 0.25, 'flops': 5e10, 'loops_left': 0, 'batch_seconds': 0.01,
                  'mode': 'jit', 'devices': 1, 'products': products, 'products_seconds': 0.1,
                  'by_kind': [], 'page_faults_per_step': 12.4}
        return {'step_seconds': 0.125, 'flops': 5e10, 'loops_left': 1, 'batch_seconds': 0.01,
                'mode': 'jit', 'devices': 1, 'products': [], 'products_seconds': None,
                'by_kind': [], 'page_faults_per_step': None}
      train_step.measure_step = measure_step
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        train_step.main([])
      print(json.dumps(printed.getvalue().splitlines()))
      ''')
  # Page faults are counted for float32's step only (None: not counted).
  malloc = ('malloc: freed memory kept for reuse (train/xla_cpu.py)'
            if xla_cpu._is_glibc() else "malloc: the C library's and the environment's settings")
  assert result[1:] == [
      malloc,
      'matmul peak (float32, 2048x2048): 400.00 GFLOP/s',
      'config: digits / mlp (float32), mode=jit, devices=1, global batch 64',
      '  train step: 4.00 steps/s, 256 examples/s, 4096 tokens/s; 12 page faults per step',
      '  step FLOPs (XLA cost analysis, micro-batches as one batch): 5e+10',
      '  achieved: 200.000 GFLOP/s = 50.00% of the float32 matmul peak',
      '  its 3 matrix products alone (a loop body\'s once): 3e+09 FLOP (6.0% of the step\'s) in '
      '100.0 ms, 30.000 GFLOP/s = 7.50% of the matmul peak',
      '  input pipeline: 6400 examples/s (25.0x the train step)',
      'config: digits / mlp (bfloat16), mode=jit, devices=1, global batch 64',
      '  train step: 8.00 steps/s, 512 examples/s, 8192 tokens/s',
      '  step FLOPs (XLA cost analysis, micro-batches as one batch): 5e+10',
      '  (the step holds 1 more loop(s) over floating-point values, such as a block-sparse '
      'attention\'s, whose bodies XLA counts once: these FLOPs and the fraction below are '
      'lower bounds)',
      '  achieved: 400.000 GFLOP/s = 100.00% of the float32 matmul peak',
      '  input pipeline: 6400 examples/s (12.5x the train step)',
      'bfloat16 step time / float32 step time: 0.50']


def test_generation_times_the_best_call_after_an_untimed_compile():
  # A fake `generate` on a fake clock: the first call (the compile) takes 10 s, the timed ones
  # 3, 1 and 2 s; with one repeat, 10 s then 2 s.
  result = run_python('''
      import json, types
      import numpy as np
      from benchmarks import generation
      now, durations, calls = [0.0], iter([10, 3, 1, 2, 10, 2]), []
      def generate(model, variables, prompt, rng, num_new_tokens, temperature, use_cache):
        now[0] += next(durations)
        calls.append([list(prompt.shape), num_new_tokens, use_cache])
        return np.zeros((prompt.shape[0], prompt.shape[1] + num_new_tokens), np.int32)
      generation.sampling.generate = generate
      generation.time = types.SimpleNamespace(perf_counter=lambda: now[0])
      best = [generation.time_generation(None, None, length=5, batch=2, use_cache=True,
                                         repeats=3),
              generation.time_generation(None, None, length=5, batch=2, use_cache=False,
                                         repeats=1)]
      print(json.dumps({'best': best, 'calls': calls}))
      ''')
  assert result['best'] == [1, 2]
  # Every call from a one-token prompt per sequence to the length: 4 new tokens.
  assert result['calls'] == [[[2, 1], 4, True]] * 4 + [[[2, 1], 4, False]] * 2


def test_tokenizer_counts_characters_and_bytes_apart_and_rates_bytes_per_token(tmp_path):
  corpus = tmp_path / 'text.txt'
  corpus.write_text('été\n' * 300, encoding='utf-8')  # 4 characters, 6 bytes each line
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, os.path.join('benchmarks', 'tokenizer.py'),
                           f'--corpus={corpus}', '--vocab_size=259'],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  corpus_line, train, encode, decode = result.stdout.splitlines()
  assert corpus_line == f'corpus: {corpus} (1,200 characters, 1,800 bytes)'
  # Three merges join the five bytes of 'été' (é is two) into one token; the newline is
  # another: 600 tokens of 3 bytes on average.
  assert train.endswith('to a vocabulary of 259 tokens (3 merges)')
  assert re.fullmatch(r'encode: [\d.]+ s for 600 tokens = [\d,]+ tokens/s '
                      r'\(3\.00 bytes per token\)', encode), encode
  assert re.fullmatch(r'decode: [\d.]+ s, round trip exact: True', decode), decode


def test_attention_timing_interleaves_batches_and_keeps_each_settings_best_round():
  # Two settings on a fake clock, and one over --max_gb (None). A's calls last 4 ms when
  # its batch is sized, so a batch of ceil(10 ms / 4 ms) = 3 calls, then 5, 3 and 4 ms in the
  # three rounds; B's last 20 ms (a batch of one call), then 30, 25 and 40 ms.
  result = run_python('''
      import json, types
      from absl import flags
      from benchmarks import attention_scaling
      flags.FLAGS(['attention_scaling.py', '--repeats=3', '--min_batch_seconds=0.01'])
      now, ran = [0.0], []
      def call(name, durations):
        durations = iter(durations)
        def run():
          ran.append(name)
          now[0] += next(durations)
        return run
      attention_scaling.time = types.SimpleNamespace(perf_counter=lambda: now[0])
      a = call('A', [4e-3, 4e-3] + [5e-3] * 3 + [3e-3] * 3 + [4e-3] * 3)
      b = call('B', [20e-3, 20e-3, 30e-3, 25e-3, 40e-3])
      best = attention_scaling.time_interleaved([a, None, b])
      # --min_batch_seconds=0: one call per batch, not none.
      flags.FLAGS.min_batch_seconds = 0.0
      flags.FLAGS.repeats = 2
      single = attention_scaling.time_interleaved([call('C', [1e-3, 1e-3, 7e-3, 6e-3])])
      print(json.dumps({'best': best, 'single': single, 'ran': ''.join(ran)}))
      ''')
  assert result['best'] == pytest.approx([3e-3, None, 25e-3])
  assert result['single'] == pytest.approx([6e-3])
  # Each setting's warm-up and sizing call, then the rounds: A's batch and B's in turn.
  assert result['ran'] == 'AA' 'BB' + 'AAAB' * 3 + 'CC' + 'CC'


def test_attention_compiled_memory_is_temporaries_arguments_and_outputs_and_bounds_the_setting():
  # Exact attention (no parameters) of length 16, 2 heads of width 8: the arguments q, k and v
  # are 1·16·2·8 float32s (1,024 B) each; the outputs the loss (4 B) and the three gradients
  # (and the tuples holding them).
  result = run_python('''
      import json
      import jax
      from absl import flags
      from benchmarks import attention_scaling
      flags.FLAGS(['attention_scaling.py', '--width=8', '--heads=2'])
      call, total = attention_scaling.compile_setting('exact', 16, False)
      loss, grads = call()
      fn, args = attention_scaling.attention_fn('exact', 16, False)
      memory = jax.jit(fn).lower(*args).compile().memory_analysis()
      flags.FLAGS.max_gb = total / 2 ** 30  # exactly the setting's memory: still run
      fits = attention_scaling.compile_setting('exact', 16, False)[0] is not None
      flags.FLAGS.max_gb = (total - 1) / 2 ** 30
      over = attention_scaling.compile_setting('exact', 16, False)[0] is None
      # Causal: the first query sees the first key alone, its weight 1 whatever q is, so the
      # gradient with respect to that query is 0; without the mask it is not.
      causal_fn, causal_args = attention_scaling.attention_fn('exact', 16, True)
      first_query = [float(abs(g[0][:, 0]).max()) for g in (causal_fn(*causal_args)[1], grads)]
      print(json.dumps({'total': total, 'shapes': [list(g.shape) for g in grads],
                        'first_query': first_query,
                        'arguments': memory.argument_size_in_bytes,
                        'outputs': memory.output_size_in_bytes,
                        'temporaries': memory.temp_size_in_bytes, 'fits': fits, 'over': over}))
      ''')
  assert result['shapes'] == [[1, 16, 2, 8]] * 3
  assert result['arguments'] == 3 * 1024
  assert 4 + 3 * 1024 <= result['outputs'] <= 4 + 3 * 1024 + 64
  assert result['temporaries'] > 0
  assert result['total'] == result['arguments'] + result['outputs'] + result['temporaries']
  assert result['fits'] and result['over']
  assert result['first_query'][0] < 1e-6 < 1e-3 < result['first_query'][1]


def test_attention_scaling_runs_linformer_at_each_length_and_skips_it_when_causal():
  # Timed for real, once each: Linformer's projections are made for the length measured
  # (E and F: 256 × 512 at n = 512, its option projected_length = 256), and --causal leaves
  # Linformer out of the table while exact attention is still measured.
  result = run_python('''
      import contextlib, io, json
      import jax
      from absl import flags
      from benchmarks import attention_scaling
      flags.FLAGS(['attention_scaling.py', '--kinds=exact,linformer', '--lengths=512',
                   '--width=8', '--repeats=1', '--min_batch_seconds=0'])
      _, (params, *_) = attention_scaling.attention_fn('linformer', 512, False)
      tables = []
      for causal in (False, True):
        flags.FLAGS.causal = causal
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
          attention_scaling.main([])
        tables.append(printed.getvalue().splitlines())
      print(json.dumps({'shapes': jax.tree_util.tree_map(lambda a: list(a.shape), params),
                        'tables': tables}))
      ''')
  assert result['shapes'] == {'params': {'projections': {'proj_e': [256, 512],
                                                         'proj_f': [256, 512]}}}
  for table, kinds in zip(result['tables'], (['exact', 'linformer'], ['exact'])):
    rows = [line.split() for line in table[2:2 + len(kinds)]]
    assert [row[0] for row in rows] == kinds and table[2 + len(kinds)] == ''
    assert all(float(row[1]) > 0 for row in rows)  # a time in ms, not —


def test_train_step_measures_the_configs_own_dtype_without_dtypes():
  result = run_python('''
      import json
      from absl import flags
      from benchmarks import train_step
      flags.FLAGS(['train_step.py', '--config=experiments/configs/digits_mlp.py'])
      config = train_step._CONFIG.value
      config.model.dtype = 'bfloat16'
      settings = [train_step._settings(config)]
      with config.unlocked():
        del config.model['dtype']  # a model that leaves its dtype at the default, float32
      settings.append(train_step._settings(config))
      print(json.dumps(settings))
      ''')
  assert result == [[['bfloat16', 'model.dtype', 'bfloat16']],
                    [['float32', 'model.dtype', 'float32']]]


def test_tokenizer_reports_a_decoding_that_differs_from_the_text(tmp_path):
  corpus = tmp_path / 'text.txt'
  corpus.write_text('to be or not to be\n' * 5, encoding='utf-8')
  result = run_python(f'''
      import contextlib, io, json
      from absl import flags
      from benchmarks import tokenizer
      tokenizer.define_flags()
      flags.FLAGS(['tokenizer.py', '--corpus={corpus}', '--vocab_size=256'])
      # A decoder that drops the last character.
      decode = tokenizer.tokenizers.ByteBPETokenizer.decode
      tokenizer.tokenizers.ByteBPETokenizer.decode = lambda self, ids: decode(self, ids)[:-1]
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        tokenizer.main([])
      print(json.dumps(printed.getvalue().splitlines()))
      ''')
  assert result[-1].endswith('round trip exact: False')


def test_generation_raises_the_models_max_length_to_the_longest_length_and_prints_the_rates():
  # A made-up run and made-up rates: the model is built with a max_length that holds every
  # length (the config's 128 when the lengths are shorter), and each length's rates printed.
  result = run_python('''
      import contextlib, io, json, types
      from absl import flags
      from benchmarks import generation
      flags.FLAGS(['generation.py', '--config=experiments/configs/shakespeare_char_gpt.py',
                   '--lengths=64,100', '--batch=2', '--repeats=4'])
      class Model:
        def __call__(self, tokens, decode=False):
          pass
      built, rated = [], []
      def setup(config, workdir):
        built.append(config.model.max_length)
        state = types.SimpleNamespace(params={'w': 1}, model_state={'stats': 2})
        return types.SimpleNamespace(
            model=Model(), init_fn=None, rng=None, lock=types.SimpleNamespace(release=lambda: None),
            parallel=types.SimpleNamespace(init_state=lambda init_fn, rng: state))
      generation.runs = types.SimpleNamespace(setup=setup)
      def rates(model, variables, length, batch, repeats):
        rated.append([sorted(variables), length, batch, repeats])
        return 10.0 * length, 40.0 * length, 4.0
      generation.rates = rates
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        generation.main([])
        flags.FLAGS.lengths = ['64', '300']
        generation.main([])
      print(json.dumps({'built': built, 'rated': rated,
                        'printed': printed.getvalue().splitlines()}))
      ''')
  assert result['built'] == [128, 300]
  assert result['rated'] == [[['params', 'stats'], n, 2, 4] for n in (64, 100, 64, 300)]
  assert result['printed'][:4] == ['gpt: batch 2, new tokens per second',
                                   '  length     no cache        cache  speed-up',
                                   '      64        640.0       2560.0      4.0x',
                                   '     100       1000.0       4000.0      4.0x']
