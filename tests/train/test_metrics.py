"""Metrics reach metrics.jsonl, TensorBoard event files and the progress line with the values
written; a resumed run keeps only the records of the steps it does not replay."""

import errno
import glob
import json
import os
import struct
import time

import jax
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from train.metrics import MetricWriter


def _read_events(path):
  """Parses a TFRecord file of Event protos (length, crc, payload, crc)."""
  events = []
  with open(path, 'rb') as f:
    while header := f.read(12):
      (length,) = struct.unpack('<Q', header[:8])
      payload = f.read(length)
      f.read(4)
      events.append(event_pb2.Event.FromString(payload))
  return events


def test_jsonl_and_tensorboard_hold_the_written_values(tmp_path, capsys):
  writer = MetricWriter(str(tmp_path), total_steps=20)
  writer.write(10, 'train', {'loss': 0.5, 'examples_per_second': 1234.0})
  writer.write(20, 'eval', {'accuracy': 0.75})
  writer.close()

  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert rows == [{'step': 10, 'split': 'train', 'loss': 0.5, 'examples_per_second': 1234.0},
                  {'step': 20, 'split': 'eval', 'accuracy': 0.75}]

  (event_file,) = glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))
  scalars = {(v.tag, e.step): v.simple_value
             for e in _read_events(event_file) for v in e.summary.value}
  assert scalars == {('train/loss', 10): 0.5, ('train/examples_per_second', 10): 1234.0,
                     ('eval/accuracy', 20): 0.75}
  progress = capsys.readouterr().err
  assert '10/20 train: loss=0.5 examples_per_second=1234' in progress


def test_a_resumed_run_appends_and_drops_the_steps_it_replays(tmp_path):
  def steps():
    return [json.loads(line)['step'] for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  for step in (1, 2, 3):  # a session that reached step 3, its last checkpoint at step 1
    writer = MetricWriter(str(tmp_path), total_steps=4, start_step=step - 1)
    writer.write(step, 'train', {'loss': float(step)})
    writer.close()
  assert steps() == [1, 2, 3]
  with open(tmp_path / 'metrics.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"step": 4, "spl')  # killed while writing
  writer = MetricWriter(str(tmp_path), total_steps=4, start_step=1)  # resumes from step 1
  assert steps() == [1]
  writer.write(2, 'train', {'loss': 2.5})
  writer.close()
  assert steps() == [1, 2]


def test_hook_outputs_go_to_jsonl_tensorboard_and_sample_files(tmp_path):
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  writer = MetricWriter(str(tmp_path), total_steps=10)
  image = np.linspace(0, 1, 4 * 6).reshape(4, 6, 1)
  writer.write_outputs(10, {'bits_per_dim': 3.5, 'text': 'to be or not', 'grid': image})
  writer.close()
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert records == [{'step': 10, 'split': 'eval', 'bits_per_dim': 3.5}]
  assert (tmp_path / 'samples' / 'text_10.txt').read_text() == 'to be or not'
  png = matplotlib.image.imread(tmp_path / 'samples' / 'grid_10.png')
  assert png.shape[:2] == (4, 6)
  # Gray levels kept to the 8-bit colour map's step (matplotlib bins [0, 1] into 256 levels).
  np.testing.assert_allclose(png[..., 0], image[..., 0], atol=2 / 255)
  (event_file,) = glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))
  values = {v.tag: v for e in _read_events(event_file) for v in e.summary.value}
  assert sorted(values) == ['eval/bits_per_dim', 'samples/grid', 'samples/text/text_summary']
  assert list(values['samples/text/text_summary'].tensor.string_val) == [b'to be or not']
  assert (values['samples/grid'].image.height, values['samples/grid'].image.width) == (4, 6)


def test_a_resumed_run_keeps_whole_records_up_to_its_step_and_knows_which(tmp_path):
  """A run killed while it wrote the eval record of step 3, its last checkpoint: the torn
  record is dropped (else the next record would be appended to its line), and the resumed
  writer knows that step 3 has a train record but no eval one, which it then writes."""
  records = [{'step': 1, 'split': 'train', 'loss': 1.0}, {'step': 1, 'split': 'eval', 'loss': 2.0},
             {'step': 2, 'split': 'train', 'loss': 3.0}, {'step': 3, 'split': 'train', 'loss': 4.0},
             {'step': 3, 'split': 'eval', 'loss': 5.0}]
  # The last record is whole but for its newline.
  text = ''.join(json.dumps(r) + '\n' for r in records[:4]) + json.dumps(records[4])
  (tmp_path / 'metrics.jsonl').write_text(text)
  writer = MetricWriter(str(tmp_path), total_steps=4, start_step=3)
  assert all(writer.recorded(r['step'], r['split']) for r in records[:4])
  assert not writer.recorded(3, 'eval') and not writer.recorded(2, 'eval')
  writer.write(3, 'eval', {'loss': 5.5})
  writer.close()
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert rows == records[:4] + [{'step': 3, 'split': 'eval', 'loss': 5.5}]
  # Resumed from step 1, the records of later steps are gone, and so is what it knew of them.
  writer = MetricWriter(str(tmp_path), total_steps=4, start_step=1)
  assert writer.recorded(1, 'eval') and not writer.recorded(2, 'train')
  writer.close()
  assert [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()] == (
      records[:2])


def test_progress_line_shows_the_fraction_done_and_this_session_s_rate(tmp_path, capsys):
  """A session resumed at step 10 that reached step 20 of 40 in 30 s: half the bar, and
  20 steps left at 3 s a step (its own 10 steps), 60 s, not 30 s (20 steps in 30 s)."""
  writer = MetricWriter(str(tmp_path), total_steps=40, start_step=10)
  writer.start_time = time.time() - 30
  writer.write(20, 'train', {'loss': 0.25, 'tokens': 123456.0})
  writer.close()
  line = capsys.readouterr().err.strip()
  assert line == ('[##########..........] 20/40 train: loss=0.25 tokens=1.235e+05 | 30s elapsed, '
                  'eta 60s')


def _tensorboard_view(logdir):
  """{(tag, step): [values]} as TensorBoard shows the event files of `logdir`: read in name
  order, a SessionLog START at step s hides every event of step >= s read before it."""
  shown = {}
  for path in sorted(glob.glob(str(logdir / 'events.out.tfevents.*'))):
    for event in _read_events(path):
      if event.HasField('session_log') and event.session_log.status == event_pb2.SessionLog.START:
        shown = {key: values for key, values in shown.items() if key[1] < event.step}
      for value in event.summary.value:
        shown.setdefault((value.tag, event.step), []).append(value.simple_value)
  return shown


def test_a_resumed_run_purges_the_steps_it_replays_from_tensorboard(tmp_path):
  writer = MetricWriter(str(tmp_path), total_steps=40)  # interrupted after step 30
  for step in (10, 20, 30):
    writer.write(step, 'train', {'loss': float(step)})
  writer.close()
  writer = MetricWriter(str(tmp_path), total_steps=40, start_step=20)  # its checkpoint: step 20
  for step in (30, 40):
    writer.write(step, 'train', {'loss': step + 0.5})
  writer.close()
  # Both sessions' files are kept; each step shows once, replayed ones with the new values.
  assert len(glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))) == 2
  assert _tensorboard_view(tmp_path / 'tensorboard') == {
      ('train/loss', 10): [10.0], ('train/loss', 20): [20.0], ('train/loss', 30): [30.5],
      ('train/loss', 40): [40.5]}


def test_an_image_outside_the_unit_range_is_clipped_to_it(tmp_path):
  """A colour sample a little outside [0, 1] (as a sampler's output can be) is written
  clipped: matplotlib refuses such a float RGB image."""
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  writer = MetricWriter(str(tmp_path), total_steps=10)
  image = np.linspace(-0.2, 1.2, 2 * 5 * 3).reshape(2, 5, 3)
  writer.write_outputs(10, {'sample': image})
  writer.close()
  png = matplotlib.image.imread(tmp_path / 'samples' / 'sample_10.png')
  np.testing.assert_allclose(png[..., :3], np.clip(image, 0, 1), atol=1 / 255)


def test_a_gray_image_keeps_its_levels_rather_than_being_stretched(tmp_path):
  """A dim one-channel sample (values in [0.2, 0.6]) is written with those gray levels, on the
  fixed [0, 1] scale, not stretched to black and white."""
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  writer = MetricWriter(str(tmp_path), total_steps=10)
  image = np.linspace(0.2, 0.6, 3 * 4).reshape(3, 4, 1)
  writer.write_outputs(10, {'dim': image})
  writer.close()
  png = matplotlib.image.imread(tmp_path / 'samples' / 'dim_10.png')
  np.testing.assert_allclose(png[..., 0], image[..., 0], atol=2 / 255)


def test_records_reach_metrics_jsonl_before_the_writer_closes(tmp_path):
  """A run killed mid-training, or a reader following the file, sees every record written."""
  writer = MetricWriter(str(tmp_path), total_steps=10)
  writer.write(1, 'train', {'loss': 0.5})
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  writer.close()
  assert rows == [{'step': 1, 'split': 'train', 'loss': 0.5}]


def test_processes_other_than_0_write_nothing(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  writer = MetricWriter(str(tmp_path), total_steps=10)
  writer.write(5, 'train', {'loss': 0.5})
  writer.write_outputs(10, {'accuracy': 0.75, 'text': 'to be', 'grid': np.zeros((2, 2, 1))})
  writer.close()
  assert list(tmp_path.iterdir()) == [] and capsys.readouterr().err == ''


def test_a_failed_metric_write_is_one_sentence_naming_the_work_directory(tmp_path):
  class _FullDisk:
    def write(self, _):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  writer = MetricWriter(str(tmp_path), total_steps=10)
  jsonl, writer._jsonl = writer._jsonl, _FullDisk()  # pylint: disable=protected-access
  with pytest.raises(ValueError) as error:
    writer.write(1, 'train', {'loss': 0.5})
  assert str(error.value) == (f"Writing the metrics in '{tmp_path}' failed (No space left on "
                              'device); free space or fix permissions and rerun.')
  writer._jsonl = jsonl  # pylint: disable=protected-access
  writer.close()


def test_array_and_numpy_values_are_recorded_as_plain_numbers(tmp_path):
  """A train step's metrics arrive as device arrays and NumPy scalars: metrics.jsonl gets their
  float values (json cannot encode the arrays themselves)."""
  writer = MetricWriter(str(tmp_path), total_steps=10)
  writer.write(1, 'train', {'loss': jax.numpy.float32(0.5), 'accuracy': np.float32(0.25),
                            'count': np.array(3)})
  writer.close()
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert rows == [{'step': 1, 'split': 'train', 'loss': 0.5, 'accuracy': 0.25, 'count': 3.0}]


def test_the_progress_bar_rounds_down_so_it_fills_only_at_the_last_step(tmp_path, capsys):
  # 39/40 is 19.5 of 20 marks: 19 shown, the 20th at step 40.
  writer = MetricWriter(str(tmp_path), total_steps=40)
  writer.write(39, 'train', {'loss': 1.0})
  writer.write(40, 'train', {'loss': 1.0})
  writer.close()
  bars = [line.split(']')[0] for line in capsys.readouterr().err.strip().splitlines()]
  assert bars == ['[' + '#' * 19 + '.', '[' + '#' * 20]
