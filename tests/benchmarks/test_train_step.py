"""benchmarks/train_step.py counts the FLOPs of one whole global step in every parallel mode."""

import resource

from tests.subprocess_util import run_python


def test_step_flops_are_the_whole_global_steps_over_two_devices(data_dir, tmp_path):
  # The step's FLOPs, compiled for one device, in a run over one device and in runs split over
  # two; and, as the figure the count must not fall to, the same step compiled over the two
  # devices' global arrays, of which XLA's cost analysis counts one device's share.
  result = run_python(f'''
      import json
      import jax
      from benchmarks import train_step
      from experiments.configs import digits_mlp
      from train import loop

      flops = {{}}
      for mode, devices in (('jit', 1), ('jit', 2), ('shard_map', 2)):
        config = digits_mlp.get_config()
        config.data.data_dir = {data_dir!r}
        config.global_batch_size = 64
        config.model.dropout_rate = 0.0
        config.parallel.mode = mode
        config.parallel.num_devices = devices
        run = loop.setup(config, {str(tmp_path)!r} + f'/{{mode}}{{devices}}')
        state = run.parallel.init_state(run.init_fn, run.rng)
        host_batch = next(run.train_iterator())
        flops[f'{{mode}}{{devices}}'] = train_step.compiled_flops(
            train_step.one_device_step(run, state, host_batch))
        if devices == 2 and mode == 'jit':
          split = jax.jit(run.train_step_fn()).lower(
              state, run.parallel.global_batch(host_batch)).compile()
          flops['split'] = train_step.compiled_flops(split)
        run.lock.release()
      print(json.dumps(flops))
      ''', devices=2)
  # Batch 64 through 64 -> 256 -> 256 -> 10: the products, forward and backward, are
  # 3 x 2 x 64 x 86,528 FLOPs, most of the step (the optimiser adds about 20 per parameter).
  products = 3 * 2 * 64 * (64 * 256 + 256 * 256 + 256 * 10)
  assert products < result['jit1'] < 1.1 * products
  assert result['jit2'] == result['shard_map2'] == result['jit1']
  # One device's share: half the batch's work, all of the replicated optimiser's.
  assert result['split'] < 0.6 * result['jit1']


def test_step_flops_count_every_micro_batch(data_dir, tmp_path):
  # With 4 micro-batches the step is a scan whose body XLA's cost analysis counts once: the
  # compiled step's own count falls to about half (the first micro-batch, outside the scan,
  # and the body). The benchmark's count must be the whole global batch's. Dropout's random
  # bits come from loops over integers, which hold no FLOPs the count could miss and are not
  # reported. measure_step, the script's timing, reports the loop-free count too. (Its own
  # process: the benchmark scripts each define absl flags of the same names.)
  result = run_python(f'''
      import json
      from absl import flags
      from benchmarks import train_step
      from experiments.configs import digits_mlp
      from train import loop
      flags.FLAGS(['train_step.py', '--config=experiments/configs/digits_mlp.py',
                   '--pipeline_batches=1', '--noproducts_alone'])

      config = digits_mlp.get_config()
      config.data.data_dir = {data_dir!r}
      config.global_batch_size = 64
      config.model.dropout_rate = 0.1
      config.grad_accum_steps = 4
      run = loop.setup(config, {str(tmp_path)!r})
      state = run.parallel.init_state(run.init_fn, run.rng)
      scanned = train_step.one_device_step(run, state, next(run.train_iterator()))
      run.lock.release()
      counted, loops_left = train_step.loop_free_step_flops(config)
      measured = train_step.measure_step(config, steps=1)
      all_loops = sum(' while(' in line for line in scanned.as_text().splitlines())
      print(json.dumps({{'scanned': train_step.compiled_flops(scanned), 'all_loops': all_loops,
                        'scanned_loops': train_step.count_loops(scanned),
                        'counted': counted, 'loops_left': loops_left,
                        'measured': [measured['flops'], measured['loops_left']],
                        'loops': train_step.loops_counted_once(config)}}))
      ''')
  assert result['loops'] == ['micro-batches as one batch']
  assert result['scanned_loops'] == 1 < result['all_loops']
  products = 3 * 2 * 64 * (64 * 256 + 256 * 256 + 256 * 10)  # as in the test above
  assert products < result['counted'] < 1.1 * products
  assert result['scanned'] < 0.6 * result['counted']
  assert result['loops_left'] == 0
  assert result['measured'] == [result['counted'], 0]


def test_a_recurrent_models_scan_is_unrolled_for_counting_when_its_config_leaves_unroll_out():
  # digits_spell's model takes `unroll` at its default, 1: its decoder's scan body was counted
  # once (2.8e7 FLOP against 6.0e7 unrolled); a model without the option has no scan to unroll.
  result = run_python('''
      import json
      from benchmarks import train_step
      from experiments.configs import digits_mlp, digits_spell

      spell = digits_spell.get_config()
      print(json.dumps({'config_has_unroll': 'unroll' in spell.model,
                        'spell': train_step.loops_counted_once(spell),
                        'mlp': train_step.loops_counted_once(digits_mlp.get_config())}))
      ''')
  assert result == {'config_has_unroll': False, 'spell': ['scan unrolled'], 'mlp': []}


def test_sweep_values_take_the_fields_type():
  # A bool field's 'False' once became bool('False'), True: the sweep measured True twice.
  result = run_python('''
      import json
      from benchmarks import train_step
      values = {text: train_step._parse(bool, text) for text in ('False', 'true', 'TRUE')}
      values['4'] = train_step._parse(int, '4')
      refused = []
      for kind, text in ((bool, 'yes'), (bool, '0'), (int, '2.5')):
        try:
          train_step._parse(kind, text)
        except ValueError:
          refused.append(text)
      print(json.dumps({'values': values, 'refused': refused}))
      ''')
  assert result['values'] == {'False': False, 'true': True, 'TRUE': True, '4': 4}
  assert result['refused'] == ['yes', '0', '2.5']


def test_products_by_kind_time_each_kind_once_and_total_them_by_count():
  result = run_python('''
      import contextlib, io, json
      from benchmarks import hlo_dots, train_step

      plain = hlo_dots.Product((64, 32), (32, 48), (((1,), (0,)), ((), ())), 'f32', 'f32',
                               2 * 64 * 32 * 48)
      batched = hlo_dots.Product((4, 16, 8), (4, 8, 16), (((2,), (1,)), ((0,), (0,))), 'f32',
                                 'f32', 2 * 4 * 16 * 8 * 16)
      # Square operands contracted over their first dimensions: [16, 16]ᵀ·[16, 16], which as
      # one product is [16, 16]·[16, 16] of the same shapes but other dimension numbers.
      transposed = hlo_dots.Product((16, 16), (16, 16), (((0,), (0,)), ((), ())), 'f32', 'f32',
                                    2 * 16**3)
      timed = []
      alone = hlo_dots.products_alone_seconds
      hlo_dots.products_alone_seconds = lambda ps, repeats: timed.append(ps) or alone(ps, repeats=1)
      by_kind = train_step.products_by_kind([plain, batched, plain, plain, transposed])
      hlo_dots.products_alone_seconds = alone
      # The step's [2048, 256]·[256, 256] projections and the per-head scores, on a made-up
      # clock: 1 ms alone and 3 ms as one product, 2 ms and 4 ms.
      projection = hlo_dots.Product((2048, 256), (256, 256), (((1,), (0,)), ((), ())), 'f32',
                                    'f32', 2 * 2048 * 256 * 256)
      scores = hlo_dots.Product((64, 128, 64), (64, 64, 128), (((2,), (1,)), ((0,), (0,))),
                                'f32', 'f32', 2 * 64 * 128 * 64 * 128)
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed):
        train_step.print_by_kind([(projection, 3, 1e-3, 3e-3), (scores, 1, 2e-3, 4e-3)],
                                 peak=2e11)
      print(json.dumps({'counts': [[list(p.lhs_shape), n] for p, n, _, _ in by_kind][:2],
                        'positive': all(s > 0 and t > 0 for _, _, s, t in by_kind),
                        'plain_equal': [s == t for _, _, s, t in by_kind],
                        'timed': [[list(p.lhs_shape) for p in ps] for ps in timed],
                        'printed': printed.getvalue().splitlines()}))
      ''')
  assert result['counts'] == [[[64, 32], 3], [[4, 16, 8], 1]] and result['positive']
  # Each kind alone, then as one [M, K]·[K, N] product: the batched one as [64, 8]·[8, 16];
  # the plain one already is one, so it is timed once and its two times are the same.
  assert result['timed'] == [[[64, 32]], [[4, 16, 8]], [[64, 8]], [[16, 16]], [[16, 16]]]
  assert result['plain_equal'][:2] == [True, False]
  header, first, second, total = result['printed']
  assert first == ('      3 × [2048, 256] · [256, 256] (contracting [1]·[0], f32): 1.000 ms each, '
                   '268.4 GFLOP/s (134%); as [2048, 256] · [256, 256]: 89.5 GFLOP/s')
  assert second == ('      1 × [64, 128, 64] · [64, 64, 128] (contracting [2]·[1], batch [0]·[0], '
                    'f32): 2.000 ms each, 67.1 GFLOP/s (34%); as [8192, 64] · [64, 128]: '
                    '33.6 GFLOP/s')
  # 3 × 1 ms + 2 ms for the FLOPs of all four: 3 · 268,435,456 + 134,217,728 in 5 ms.
  assert total == '  all 4, kind by kind: 5.0 ms, 187.905 GFLOP/s = 93.95% of the matmul peak'


def test_a_sweep_of_a_placeholder_field_takes_the_type_it_declares():
  # data.window is a placeholder(int) holding None: its values were read as str.
  result = run_python('''
      import json
      from absl import flags
      from benchmarks import train_step
      flags.FLAGS(['train_step.py', '--config=experiments/configs/digits_mlp.py',
                   '--sweep=data.window:64,128,256'])
      settings = train_step._settings(train_step._CONFIG.value)
      print(json.dumps([[label, field, value, type(value).__name__]
                        for label, field, value in settings]))
      ''')
  assert result == [['data.window=64', 'data.window', 64, 'int'],
                    ['data.window=128', 'data.window', 128, 'int'],
                    ['data.window=256', 'data.window', 256, 'int']]


def test_step_flops_of_a_batch_norm_model_under_shard_map_and_pmap(data_dir, tmp_path):
  # Batch norm averages its statistics over the device axis under shard_map and pmap, an axis
  # the one-device step does not map: it must count what the 'jit' run counts.
  result = run_python(f'''
      import json
      from benchmarks import train_step
      from experiments.configs import digits_mlp
      from train import loop

      flops = {{}}
      for mode, devices in (('jit', 1), ('shard_map', 2), ('pmap', 2)):
        config = digits_mlp.get_config()
        config.data.data_dir = {data_dir!r}
        config.global_batch_size = 16
        config.model.update({{'features': (16, 10), 'batch_norm': True, 'dropout_rate': 0.0}})
        config.parallel.mode = mode
        config.parallel.num_devices = devices
        run = loop.setup(config, {str(tmp_path)!r} + f'/{{mode}}')
        state = run.parallel.init_state(run.init_fn, run.rng)
        try:
          flops[mode] = train_step.compiled_flops(
              train_step.one_device_step(run, state, next(run.train_iterator())))
        except NameError as e:
          flops[mode] = str(e)
        run.lock.release()
      print(json.dumps(flops))
      ''', devices=2)
  assert result['shard_map'] == result['pmap'] == result['jit'] > 0, result


def test_measure_step_divides_the_timed_steps_and_batches_by_their_counts(data_dir, tmp_path):
  # A small MLP's step timed on a made-up clock: 3 steps in 6 s, then 4 input batches in 2 s.
  result = run_python(f'''
      import json, mmap, types
      from absl import flags
      from benchmarks import train_step
      flags.FLAGS(['train_step.py', '--config=experiments/configs/digits_mlp.py',
                   '--pipeline_batches=4', '--noproducts_alone'])
      config = train_step._CONFIG.value
      config.data.data_dir = {data_dir!r}
      config.global_batch_size = 16
      config.model.update({{'features': (16, 10), 'dropout_rate': 0.0}})
      ticks = iter([0.0, 6.0, 10.0, 12.0])
      train_step.time = types.SimpleNamespace(perf_counter=lambda: next(ticks))
      fresh_memory = mmap.mmap(-1, 2**26)  # 64 MB, mapped in page by page as it is written
      fresh = train_step.page_faults()
      for i in range(0, 2**26, mmap.PAGESIZE):
        fresh_memory[i] = 1
      fresh = train_step.page_faults() - fresh
      faults = iter([100, 160])  # the process's page faults before and after the timed steps
      train_step.page_faults = lambda: next(faults)
      counts = {{'steps': 0, 'batches': 0}}
      setup = train_step.runs.setup
      def counting_setup(config, workdir):  # counts the compiled step's calls and the batches
        run = setup(config, workdir)
        compile_step, iterator = run.parallel.compile_train_step, run.train_iterator
        def compile_counting(*args):
          step = compile_step(*args)
          return lambda *a: counts.update(steps=counts['steps'] + 1) or step(*a)
        def iterator_counting():
          for batch in iterator():
            counts['batches'] += 1
            yield batch
        run.parallel.compile_train_step, run.train_iterator = compile_counting, iterator_counting
        return run
      train_step.runs.setup = counting_setup
      measured = train_step.measure_step(config, steps=3)
      print(json.dumps({{'counts': counts, 'products': [p.flops for p in measured['products']],
                        'fresh': fresh, 'page_faults_per_step': measured['page_faults_per_step'],
                        **{{k: measured[k] for k in ('step_seconds', 'batch_seconds', 'flops',
                                                   'loops_left', 'products_seconds', 'by_kind',
                                                   'mode', 'devices')}}}}))
      ''')
  assert result['step_seconds'] == 2 and result['batch_seconds'] == 0.5
  # 60 page faults over the 3 timed steps; writing 64 MB of fresh memory took a fault for each
  # of its 16,384 pages.
  assert result['page_faults_per_step'] == 20
  assert result['fresh'] >= 64 * 2**20 // resource.getpagesize()
  # 3 warm-up and 3 timed steps; the batch stepped on, then the 4 timed ones.
  assert result['counts'] == {'steps': 6, 'batches': 5}
  # Batch 16 through 64 -> 16 -> 10: each layer's product forward and for its weights'
  # gradient, and the second's for the hidden layer's gradient (none for the input's).
  products = 2 * 16 * (2 * 64 * 16 + 3 * 16 * 10)
  assert sum(result['products']) == products and len(result['products']) == 5
  assert products < result['flops'] < 1.5 * products
  assert (result['loops_left'], result['products_seconds'], result['by_kind']) == (0, None, [])
  assert (result['mode'], result['devices']) == ('jit', 1)
