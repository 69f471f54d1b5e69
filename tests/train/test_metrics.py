"""Metrics reach metrics.jsonl and TensorBoard event files with the values written."""

import glob
import json
import struct

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


def test_a_resumed_run_appends(tmp_path):
  for step in (1, 2):
    writer = MetricWriter(str(tmp_path), total_steps=2)
    writer.write(step, 'train', {'loss': float(step)})
    writer.close()
  steps = [json.loads(line)['step'] for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert steps == [1, 2]
