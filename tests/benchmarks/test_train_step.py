"""benchmarks/train_step.py counts the FLOPs of one whole global step in every parallel mode."""

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
  # reported. (Its own process: the benchmark scripts each define absl flags of the same names.)
  result = run_python(f'''
      import json
      from benchmarks import train_step
      from experiments.configs import digits_mlp
      from train import loop

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
      all_loops = sum(' while(' in line for line in scanned.as_text().splitlines())
      print(json.dumps({{'scanned': train_step.compiled_flops(scanned), 'all_loops': all_loops,
                        'scanned_loops': train_step.count_loops(scanned),
                        'counted': counted, 'loops_left': loops_left,
                        'loops': train_step.loops_counted_once(config)}}))
      ''')
  assert result['loops'] == ['micro-batches as one batch']
  assert result['scanned_loops'] == 1 < result['all_loops']
  products = 3 * 2 * 64 * (64 * 256 + 256 * 256 + 256 * 10)  # as in the test above
  assert products < result['counted'] < 1.1 * products
  assert result['scanned'] < 0.6 * result['counted']
  assert result['loops_left'] == 0


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
