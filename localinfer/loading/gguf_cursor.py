"""Sequential little-endian reads of a GGUF header: integers, strings and the typed metadata
values (scalars, strings, arrays of either, arrays of arrays), bounded against hostile files."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

# Arrays of arrays are legal GGUF but no model uses them deeper than this; bounding the depth keeps
# a hostile file from exhausting the parser's recursion.
MAX_ARRAY_DEPTH = 8
# GGUF metadata value types -> (struct format, numpy dtype) for the fixed-size ones.
_SCALAR_TYPES: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),  # bool
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING = 8
_ARRAY = 9
_BOOL = 7
_U64 = struct.Struct("<Q")
_FLOAT32 = 6


class Truncated(Exception):
    """A read ran past the end of the file."""


class Corrupt(Exception):
    """A structurally impossible value; the message is the one-line reason."""


class Cursor:
    """Sequential little-endian reads over the mapped file, raising Truncated at the end."""

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.size = len(buf)

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise Truncated()

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # Some vocabularies hold invalid UTF-8 pieces; keep them readable, never fail on them.
            return raw.decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """An array of strings (vocabularies: 50k-260k entries), in one tight loop."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                raise Truncated()
            (n,) = unpack(buf, pos)
            pos += 8
            end = pos + n
            if end > size:
                raise Truncated()
            # Some vocabularies hold invalid UTF-8 pieces: keep them readable, never fail.
            append(str(buf[pos:end], "utf-8", "replace"))
            pos = end
        self.pos = pos
        return out

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype in _SCALAR_TYPES:
            v = self.unpack(_SCALAR_TYPES[vtype][0])
            if vtype == _FLOAT32:
                # Shortest decimal that round-trips in float32: 1e-5, not 9.999999747e-06.
                return float(str(np.float32(v)))
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype = self.unpack("<I")
            count = self.unpack("<Q")
            if itype in _SCALAR_TYPES:
                dtype = np.dtype(_SCALAR_TYPES[itype][1])
                self.need(count * dtype.itemsize)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * dtype.itemsize
                return arr.astype(bool) if itype == _BOOL else arr
            if itype == _STRING:
                # Each string needs at least its 8-byte length: rejects absurd counts early.
                self.need(count * 8)
                return self.strings(count)
            if itype == _ARRAY:
                if depth + 1 >= MAX_ARRAY_DEPTH:
                    raise Corrupt(
                        f"metadata key '{key}' nests arrays more than {MAX_ARRAY_DEPTH} deep"
                    )
                self.need(count * 12)
                return [self.value(_ARRAY, key, depth + 1) for _ in range(count)]
            raise Corrupt(f"metadata key '{key}' has an array of unknown type {itype}")
        raise Corrupt(f"metadata key '{key}' has unknown value type {vtype}")
