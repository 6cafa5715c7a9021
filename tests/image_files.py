"""Image files for the image tests, good and hostile: real PNG and JPEG bytes (Pillow), and PNGs
written by hand whose header says what the pixels do not hold (a 50,000 x 50,000 bomb, 0 x 0)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np


def png_bytes(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    """``pixels`` (``[height, width, 3]`` uint8) encoded as ``fmt`` by Pillow."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format=fmt)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says ``width x height`` RGB pixels, holding one row of them at most:
    decoding it would unpack ``width x height x 3`` bytes (a decompression bomb's shape)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = b"\x00" + b"\x00" * 3 * min(width, 16)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(row))
        + _chunk(b"IEND", b"")
    )


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
