"""GGUF block rows -> MLX affine groups, in numpy (no mlx import: the runner wraps the result).

For the exact types of gguf_forms.py each block's stored codes become the group's codes, and its
scale/offset the group's scale and bias, computed in float32 from the stored float16 ``d`` and
integer sub-block scales (exactly: an 11-bit mantissa times a 6-bit integer); MLX rounds them to
its 16-bit scale dtype. The other types (sub-blocks of 16) are dequantized by gguf-py and
quantized again, min/max per group of 32. Codes are packed the way ``mx.quantized_matmul`` reads
them: a little-endian bit stream along the row, value j at bits ``[bits * j, bits * (j + 1))``.

Layouts follow ggml-quants.c (and gguf-py's quants.py, which the tests compare against).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes [n, E] uint8, scale, bias [n, E/32]

# Rows converted at a time: the unpacked codes and their bit-packing take ~10 bytes per weight
# for the while, so a 262k-row LM head is converted a slice at a time.
CHUNK_WEIGHTS = 1 << 22


def _f32(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 stored at byte ``at`` of each block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """Bytes [n, m] -> [n, 2, m]: low nibbles, then high nibbles."""
    return np.stack([qs & 0x0F, qs >> 4], axis=1)


def _q4_0(b: np.ndarray) -> Decoded:
    d = _f32(b, 0)
    return _low_high(b[:, 2:18]).reshape(len(b), 32), d, -8 * d


def _q4_1(b: np.ndarray) -> Decoded:
    return _low_high(b[:, 4:20]).reshape(len(b), 32), _f32(b, 0), _f32(b, 2)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4 bytes of high bits [n, 4] -> bit j of the little-endian word, [n, 32]."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q5_0(b: np.ndarray) -> Decoded:
    d = _f32(b, 0)
    codes = _low_high(b[:, 6:22]).reshape(len(b), 32) | (_fifth_bits(b[:, 2:6]) << 4)
    return codes, d, -16 * d


def _q5_1(b: np.ndarray) -> Decoded:
    codes = _low_high(b[:, 8:24]).reshape(len(b), 32) | (_fifth_bits(b[:, 4:8]) << 4)
    return codes, _f32(b, 0), _f32(b, 2)


def _q8_0(b: np.ndarray) -> Decoded:
    d = _f32(b, 0)
    # int8 q -> q + 128 in 0..255: flipping the sign bit is that addition.
    return b[:, 2:34] ^ np.uint8(0x80), d, -128 * d


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit sub-block scales and mins -> (sc, m), each [n, 8]."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k_codes(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes of nibbles [n, 128] -> the 256 low codes in element order: 4 runs
    of 32 bytes, whose low nibbles are sub-block 2j and high nibbles sub-block 2j + 1."""
    runs = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(len(qs), 256)


def _q4_k(b: np.ndarray) -> Decoded:
    sc, mn = _k_scales(b[:, 4:16])
    return _q4_k_codes(b[:, 16:144]), _f32(b, 0) * sc, -_f32(b, 2) * mn


def _q5_k(b: np.ndarray) -> Decoded:
    n = len(b)
    sc, mn = _k_scales(b[:, 4:16])
    low = _q4_k_codes(b[:, 48:176])
    # qh [32]: bit i of byte l is the fifth bit of element l of sub-block i.
    high = np.unpackbits(b[:, 16:48], axis=1, bitorder="little").reshape(n, 32, 8)
    codes = low | (high.transpose(0, 2, 1).reshape(n, 256) << 4)
    return codes, _f32(b, 0) * sc, -_f32(b, 2) * mn


DECODERS: dict[str, Callable[[np.ndarray], Decoded]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
}


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [rows, cols] (< 2**bits, cols a multiple of 32) -> uint32 [rows, cols * bits / 32]
    as MLX packs them: a little-endian bit stream along each row."""
    rows, cols = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8).view(np.uint32)
    if bits == 4:  # the common case, in bytes: two codes a byte, the first in the low nibble
        pairs = codes.reshape(rows, cols // 2, 2)
        return np.ascontiguousarray(pairs[..., 0] | (pairs[..., 1] << 4)).view(np.uint32)
    # Every 8 codes make ``bits`` whole bytes: their bit stream as one little-endian uint64.
    eight = codes.reshape(rows, cols // 8, 8)
    words = np.zeros((rows, cols // 8), dtype=np.uint64)
    for k in range(8):
        words |= eight[..., k].astype(np.uint64) << np.uint64(bits * k)
    packed = words.view(np.uint8).reshape(rows, cols // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)


def row_chunks(rows: int, cols: int) -> Iterator[slice]:
    step = max(1, CHUNK_WEIGHTS // max(cols, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to the 16-bit dtype MLX will hold them in (``"float16"`` or
    ``"bfloat16"``, nearest-even as MLX casts), returned as float32."""
    if dtype == "bfloat16":
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        u = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return u.view(np.float32)
    return x.astype(np.float16).astype(np.float32)


def _requantized(
    type_name: str, raw: np.ndarray, cols: int, bits: int, scale_dtype: str
) -> Decoded:
    """Stored rows -> their dequantized values quantized again, min/max per group of 32 (the
    scale and minimum rounded to ``scale_dtype`` before the codes are taken, as quant_affine.py
    does, so the codes fit the values the matmul reads)."""
    w = gguf_quants.dequantize(raw, GGMLQuantizationType[type_name])
    g = w.reshape(len(raw), cols // 32, 32)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    levels = (1 << bits) - 1
    scale = round_to((hi - lo) / levels, scale_dtype)
    scale = np.where(scale > 0, scale, np.float32(1))
    bias = round_to(lo, scale_dtype)
    codes = g - bias[..., None]  # in place from here: this runs over every weight
    codes *= (1 / scale)[..., None]
    np.rint(codes, out=codes)
    np.clip(codes, 0, levels, out=codes)
    return codes.astype(np.uint8), scale, bias


def convert(
    type_name: str, raw: np.ndarray, cols: int, bits: int, scale_dtype: str = "float16"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stored rows [rows, row bytes] of a type in gguf_forms.GGUF_FORMS -> (packed uint32 [rows,
    cols * bits / 32], scales, biases float32 [rows, cols / 32]): exact types decoded, the others
    requantized to ``bits`` with scales in ``scale_dtype``."""
    rows = raw.shape[0]
    packed = np.empty((rows, cols * bits // 32), dtype=np.uint32)
    scales = np.empty((rows, cols // 32), dtype=np.float32)
    biases = np.empty_like(scales)
    decode = DECODERS.get(type_name)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    for part in row_chunks(rows, cols):
        n = part.stop - part.start
        chunk = np.ascontiguousarray(raw[part])
        if decode is not None:
            codes, scale, bias = decode(chunk.reshape(n * (cols // block), size))
        else:
            codes, scale, bias = _requantized(type_name, chunk, cols, bits, scale_dtype)
        packed[part] = pack(codes.reshape(n, cols), bits)
        scales[part] = scale.reshape(n, -1)
        biases[part] = bias.reshape(n, -1)
    return packed, scales, biases
