"""Patches that make a training run meet trouble at a chosen point: SIGTERM during a given
train step, NaN inputs in given train batches."""

import os
import signal

import numpy as np

from train import loop
from train import parallel


def stop_during_step(step_number, monkeypatch):
  """Patches the compiled train step to send this process SIGTERM during call `step_number`
  (counted from 1); the loop's own handler records it."""
  compile_train_step = parallel.Parallel.compile_train_step

  def compile_with_a_stop(self, *args, **kwargs):
    step_fn, calls = compile_train_step(self, *args, **kwargs), []

    def step(state, batch):
      calls.append(None)
      if len(calls) == step_number:
        os.kill(os.getpid(), signal.SIGTERM)
      return step_fn(state, batch)
    return step
  monkeypatch.setattr(parallel.Parallel, 'compile_train_step', compile_with_a_stop)


def poison_batches(batches, monkeypatch):
  """Patches the train iterator to fill the listed batches (counted from 1) with NaN."""
  original = loop.Run.train_iterator

  def poisoned(self):
    iterator, count = original(self), [0]

    class Poisoned:
      def __next__(self):
        batch = next(iterator)
        count[0] += 1
        if count[0] in batches:
          batch = {**batch, 'input': np.full_like(batch['input'], np.nan)}
        return batch

      def get_state(self):
        return iterator.get_state()

      def set_state(self, state):
        iterator.set_state(state)
    return Poisoned()
  monkeypatch.setattr(loop.Run, 'train_iterator', poisoned)
