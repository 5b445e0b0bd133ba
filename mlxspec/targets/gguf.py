"""A GGUF file's structure checked before MLX reads it: MLX's reader trusts the lengths, counts
and offsets it finds, so a damaged header can crash the process instead of raising. Reading
the header, metadata and tensor table here costs tens of milliseconds and turns any
inconsistency into one ``MlxspecError``; the tensors themselves are not read."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from mlxspec.errors import MlxspecError

# Metadata value types (GGUF spec): byte size of the fixed-size ones; 8 string, 9 array.
VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
# Tensor types (ggml): elements per block, bytes per block.
TENSOR_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
                 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}
MAX_DIMS = 4


class _Damaged(Exception):
    pass


class _Cursor:
    def __init__(self, data: mmap.mmap):
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise _Damaged(f"the file ends at byte {len(self.data)}, inside a field at byte {self.at}")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if n > len(self.data) - self.at:
            raise _Damaged(f"a string of {n} bytes at byte {self.at} runs past the end of the file")
        raw = self.data[self.at : self.at + n]
        self.at += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"a string at byte {self.at - n} is not UTF-8") from None

    def skip_value(self, kind: int) -> int | None:
        """Step over one metadata value; an integer value is returned (for ``general.alignment``)."""
        if kind in VALUE_BYTES:
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[VALUE_BYTES[kind]]
            return self.take(fmt)
        if kind == STRING:
            self.string()
            return None
        if kind == ARRAY:
            inner, count = self.take("<I"), self.take("<Q")
            if inner not in VALUE_BYTES and inner != STRING:
                raise _Damaged(f"an array of unknown type {inner} at byte {self.at}")
            width = VALUE_BYTES.get(inner, 8)  # a string takes 8 bytes at least (its length)
            if count * width > len(self.data) - self.at:
                raise _Damaged(f"an array of {count} values at byte {self.at} runs past the end of the file")
            if inner == STRING:
                for _ in range(count):
                    self.string()
            else:
                self.at += count * width
            return None
        raise _Damaged(f"a metadata value of unknown type {kind} at byte {self.at}")


def check_gguf(path: Path) -> None:
    """Raise an ``MlxspecError`` naming the first inconsistency in ``path``'s structure."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _check(_Cursor(data), len(data))
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise MlxspecError(f"cannot read GGUF file {path}: {e}") from None
    except _Damaged as e:
        raise MlxspecError(f"cannot read GGUF file {path}: {e} (corrupt or truncated? re-fetch registry "
                           "models with `mlxspec models pull`)") from None


def _check(c: _Cursor, size: int) -> None:
    if c.take("<I") != int.from_bytes(b"GGUF", "little"):
        raise _Damaged("it does not start with the GGUF magic")
    if (version := c.take("<I")) not in (2, 3):
        raise _Damaged(f"GGUF version {version}; versions 2 and 3 are read")
    tensors, keys = c.take("<Q"), c.take("<Q")
    if tensors > size // 24 or keys > size // 12:  # the smallest tensor entry and key-value pair
        raise _Damaged(f"{tensors} tensors and {keys} metadata keys cannot fit in {size} bytes")
    alignment = 32
    for _ in range(keys):
        key, kind = c.string(), c.take("<I")
        value = c.skip_value(kind)
        if key == "general.alignment":
            alignment = value if isinstance(value, int) and value > 0 else 0
    if alignment <= 0 or alignment & (alignment - 1):
        raise _Damaged(f"general.alignment is {alignment}, not a power of two")
    table = [_tensor_entry(c) for _ in range(tensors)]
    start = -(-c.at // alignment) * alignment
    for name, nbytes, offset in table:
        if start + offset + nbytes > size:
            raise _Damaged(f"tensor {name!r} ({nbytes} bytes at {start + offset}) runs past the end of the file")


def _tensor_entry(c: _Cursor) -> tuple[str, int, int]:
    name, dims = c.string(), c.take("<I")
    if not 1 <= dims <= MAX_DIMS:
        raise _Damaged(f"tensor {name!r} has {dims} dimensions")
    count = 1
    for _ in range(dims):
        count *= c.take("<Q")
    kind = c.take("<I")
    if kind not in TENSOR_BLOCKS:
        raise _Damaged(f"tensor {name!r} has unknown type {kind}")
    block, block_bytes = TENSOR_BLOCKS[kind]
    if count % block:
        raise _Damaged(f"tensor {name!r} holds {count} values, not whole blocks of {block}")
    return name, count // block * block_bytes, c.take("<Q")
