"""Checks shared by the tests of user-facing errors: each is one sentence naming what is wrong."""

import pytest


def assert_one_sentence(message: str, *parts: str) -> None:
  """`message` is one line ending in a full stop, of at most two clauses, and holds `parts`."""
  assert '\n' not in message and message.endswith('.') and message.count('; ') <= 1, message
  for part in parts:
    assert part in message, (part, message)


def one_sentence(fn, *parts: str, error: type[Exception] = ValueError) -> str:
  """The message of the `error` that `fn()` raises, checked with assert_one_sentence."""
  with pytest.raises(error) as info:
    fn()
  assert_one_sentence(str(info.value), *parts)
  return str(info.value)
