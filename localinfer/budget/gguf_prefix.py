"""GGUF headers read from a file's first bytes: a file on the Hub read with HTTP range requests,
and the parts of a split GGUF (llama.cpp's gguf-split writes NAME-00001-of-0000N.gguf, and only
the first part holds the metadata; every part holds its own tensor directory).

The bytes are parsed by loading's own parser (GGUFFile: the same value types, ranges and checks
as for a file on disk), so a header read over HTTP and the same file after download give the same
numbers. When the parser runs past the bytes read so far, more are read: 2 MiB first (the embedded
model's header is 1.7 MiB), then four times as much each time, up to MAX_HEADER_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from localinfer.errors import ModelFileError
from localinfer.loading.gguf_cursor import Truncated
from localinfer.loading.gguf_file import GGUF_MAGIC, GGUFFile
from localinfer.loading.gguf_split import check_split_parts

# (start, end) -> the file's bytes [start, end); fewer only where the file ends.
ByteReader = Callable[[int, int], bytes]

FIRST_READ_BYTES = 2 * 2**20
# A vocabulary of 262k tokens with scores and merges takes ~10 MiB; nothing real comes near this.
MAX_HEADER_BYTES = 2**30


class _NeedMoreBytes(Exception):
    """The header goes on past the bytes read so far."""


class GGUFHeaderBytes(GGUFFile):
    """A GGUF header parsed from the first bytes of a file of ``size`` bytes; the tensor data is
    never read. ``first_part=False`` reads a later part of a split GGUF: its split.* keys and
    tensor directory, without the architecture and the checks that belong to the first part."""

    def __init__(self, name: str, prefix: bytes, size: int, *, first_part: bool = True) -> None:
        self._prefix = prefix
        self._file_size = size
        self._first_part = first_part
        super().__init__(name)

    def _map_file(self) -> memoryview:
        if self._file_size == 0:
            raise ModelFileError(self.path, "empty file (0 bytes), not a GGUF model")
        head = bytes(self._prefix[:4])
        if len(head) == 4 and head != GGUF_MAGIC:
            raise ModelFileError(
                self.path, f"not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r})"
            )
        self.size = self._file_size  # offsets are checked against the whole file
        return memoryview(self._prefix)

    def _open(self) -> None:
        try:
            if self._first_part:
                super()._open()
            else:
                self._open_later_part()
        except Truncated:
            if len(self._prefix) < self._file_size:
                raise _NeedMoreBytes() from None
            raise


def read_header(name: str, size: int, read: ByteReader, *, first_part: bool = True) -> GGUFFile:
    """The parsed header of a GGUF file of ``size`` bytes, reading only as much as it takes."""
    have = b""
    want = min(size, FIRST_READ_BYTES)
    while True:
        chunk = read(len(have), want)
        if len(chunk) < want - len(have):
            raise ModelFileError(
                name, f"the file ended at byte {len(have) + len(chunk)} of {size} while reading"
            )
        have += chunk
        try:
            return GGUFHeaderBytes(name, have, size, first_part=first_part)
        except _NeedMoreBytes:
            if want >= min(size, MAX_HEADER_BYTES):
                raise ModelFileError(name, "GGUF header larger than 1 GiB") from None
            want = min(size, want * 4, MAX_HEADER_BYTES)


def file_reader(path: Path) -> ByteReader:
    """A ByteReader over a file on disk."""

    def read(start: int, end: int) -> bytes:
        with path.open("rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    return read


def merge_split_parts(first: GGUFFile, later: list[GGUFFile]) -> GGUFFile:
    """The first part with every part's tensors in its directory: one header for the whole model
    (the metadata is the first part's). The parts' split numbers are checked."""
    check_split_parts(first, later)
    for part in later:
        first.tensors.update(part.tensors)
    return first
