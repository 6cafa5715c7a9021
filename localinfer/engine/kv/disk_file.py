"""The disk KV tier's file format (issue #24): one KV snapshot per file, checked before use.

    prefix   28 bytes  "<8sHHIIQ": magic, version, reserved (0), meta length, tokens, payload length
    meta     JSON {"model": model key, "layout": KVSnapshot.layout}
    tokens   n x uint32, little-endian: the ids whose cells the payload holds
    digests  sha256(payload), then sha256(prefix + meta + tokens + payload digest)
    payload  the runner's opaque snapshot bytes

A file's length must be exactly what its prefix says, so a hostile or damaged header cannot make a
reader allocate more than the file holds; the header digest is checked before the tokens are
trusted (the index reads only headers) and the payload digest before a payload is returned.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

MAGIC = b"LIKVSNAP"
VERSION = 1
PREFIX = struct.Struct("<8sHHIIQ")
DIGEST = 32  # sha256
MAX_META = 1 << 16  # a layout string is a few hundred bytes; more is not a file of ours


class BadKVFile(ValueError):
    """A file that is not a complete, intact snapshot file of this format (the message says why)."""


@dataclass(slots=True, frozen=True)
class KVFileHeader:
    model_key: str
    layout: str
    tokens: np.ndarray  # [n] int64: the key
    payload_len: int
    payload_digest: bytes
    payload_offset: int

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokens)


def encode_header(model_key: str, layout: str, tokens: np.ndarray, payload: bytes) -> bytes:
    """Everything a file holds before ``payload``; ``tokens`` are the snapshot's key."""
    if tokens.size < 1 or tokens.min() < 0 or tokens.max() >= 2**32:
        raise ValueError("a KV file's key must be 1+ token ids in [0, 2**32)")
    meta = json.dumps({"model": model_key, "layout": layout}).encode()
    if len(meta) > MAX_META:
        raise ValueError(f"layout/model key too long for a KV file ({len(meta)} bytes)")
    head = PREFIX.pack(MAGIC, VERSION, 0, len(meta), tokens.size, len(payload))
    head += meta + tokens.astype("<u4").tobytes()
    payload_digest = hashlib.sha256(payload).digest()
    head += payload_digest
    return head + hashlib.sha256(head).digest()


def read_header(f: BinaryIO, file_size: int, max_payload: int) -> KVFileHeader:
    """The header of the open file ``f`` (at offset 0) of ``file_size`` bytes; BadKVFile when the
    file is short, not ours, of another version, inconsistent, or carries a payload above
    ``max_payload`` bytes."""
    raw = f.read(PREFIX.size)
    if len(raw) < PREFIX.size:
        raise BadKVFile("short file")
    magic, version, _reserved, meta_len, n_tokens, payload_len = PREFIX.unpack(raw)
    if magic != MAGIC:
        raise BadKVFile("bad magic")
    if version != VERSION:
        raise BadKVFile(f"format version {version}, this reader knows {VERSION}")
    if meta_len > MAX_META or n_tokens < 1:
        raise BadKVFile("implausible header")
    header_len = PREFIX.size + meta_len + 4 * n_tokens + 2 * DIGEST
    # Sizes are checked against the file before anything they describe is read.
    if header_len + payload_len != file_size:
        raise BadKVFile(f"length {file_size} bytes, header says {header_len + payload_len}")
    if payload_len > max_payload:
        raise BadKVFile(f"payload of {payload_len} bytes exceeds the tier's cap")
    rest = f.read(header_len - PREFIX.size)
    if len(rest) != header_len - PREFIX.size:
        raise BadKVFile("short file")
    body, stored = raw + rest[:-DIGEST], rest[-DIGEST:]
    if hashlib.sha256(body).digest() != stored:
        raise BadKVFile("header checksum mismatch")
    meta = _meta(rest[:meta_len])
    tokens_end = meta_len + 4 * n_tokens
    tokens = np.frombuffer(rest[meta_len:tokens_end], dtype="<u4").astype(np.int64)
    payload_digest = rest[tokens_end : tokens_end + DIGEST]
    return KVFileHeader(meta[0], meta[1], tokens, payload_len, payload_digest, header_len)


def read_payload(f: BinaryIO, header: KVFileHeader) -> bytes:
    """The payload after ``header``; BadKVFile when it is short or its checksum differs."""
    f.seek(header.payload_offset)
    payload = f.read(header.payload_len)
    if len(payload) != header.payload_len:
        raise BadKVFile("short file")
    if hashlib.sha256(payload).digest() != header.payload_digest:
        raise BadKVFile("payload checksum mismatch")
    return payload


def _meta(raw: bytes) -> tuple[str, str]:
    try:
        meta = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise BadKVFile("unreadable metadata") from None
    if not isinstance(meta, dict):
        raise BadKVFile("unreadable metadata")
    model, layout = meta.get("model"), meta.get("layout")
    if not isinstance(model, str) or not isinstance(layout, str):
        raise BadKVFile("unreadable metadata")
    return model, layout
