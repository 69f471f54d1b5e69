"""Reader for the IDX files of MNIST and Fashion-MNIST, plain or gzip-compressed.

Layout: a 4-byte magic number 0x00 0x00 TT NN, where TT is the element type
(0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64) and
NN the number of dimensions; then NN big-endian uint32 sizes; then the elements,
big-endian, in row-major order.
"""

import gzip
import math
import os
import struct
import zlib

import numpy as np

_TYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}
_GZIP_MAGIC = b'\x1f\x8b'


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Returns the array stored in the IDX file at `path`, in native byte order."""
  with open(path, 'rb') as f:
    raw = f.read()
  if raw[:2] == _GZIP_MAGIC:
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:
      raise ValueError(
          f'{os.fspath(path)} is a truncated or corrupt gzip file ({error}).') from None
  if len(raw) < 4 or raw[:2] != b'\x00\x00' or raw[2] not in _TYPES:
    allowed = ', '.join(f'{code:02x}' for code in _TYPES)
    raise ValueError(f'{os.fspath(path)} is not an IDX file: its magic number {raw[:4].hex()!r} '
                     f'is not 0000TTNN with element type TT in {allowed}.')
  ndim = raw[3]
  header_size = 4 + 4 * ndim
  if len(raw) < header_size:
    raise ValueError(f'{os.fspath(path)} is truncated: its header needs {header_size} bytes, '
                     f'the file has {len(raw)}.')
  shape = struct.unpack(f'>{ndim}I', raw[4:header_size])
  dtype = np.dtype(_TYPES[raw[2]])
  expected = header_size + math.prod(shape) * dtype.itemsize
  if len(raw) != expected:
    raise ValueError(f'{os.fspath(path)} has {len(raw)} bytes but its header declares a '
                     f'{shape} array of {dtype.name}, which needs {expected}.')
  array = np.frombuffer(raw, dtype, offset=header_size).reshape(shape)
  return array.astype(dtype.newbyteorder('='))
