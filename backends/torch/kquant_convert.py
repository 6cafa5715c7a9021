"""A GGUF matrix's stored rows -> the quantized layout the torch kernels take (QuantMatrix), in
the form kquant_rules.py gives its type. Vectorised over every block of the matrix at once.

* Q4_K / Q4_0 / Q4_1 -> int4 in groups of 32, ``w = code * scale + minimum`` with the stored
  codes and float32 ``scale`` / ``minimum`` computed as gguf-py computes them, so dequantizing
  the result gives gguf-py's float32 values bit for bit:
  Q4_K super-block (256 weights, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales
  and mins, 128 bytes of codes): sub-block j is ``d * sc_j * q - dmin * m_j``;
  Q4_0 (18 bytes): ``d * (q - 8)``; Q4_1 (20 bytes): ``d * q + m``.
  The kernels then hold scale and zero in 16 bits (``compact``; int4pack: bf16).
* any other block type -> int8 per row over gguf-py's float32 values (quant_layout.quantize_int8).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf.quants import Q4_K

from localinfer.backends.torch.kquant_rules import GROUP
from localinfer.backends.torch.quant_layout import QuantMatrix, quantize_int8

# GGUF type -> (weights, bytes) of a block
_BLOCKS = {"Q4_K": (256, 144), "Q4_0": (32, 18), "Q4_1": (32, 20)}


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of every block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, k, 16 or 32] bytes -> [n, k, 2, ...] codes: the low nibbles, then the high ones
    (GGML's order: a block's first half is the low nibbles)."""
    return np.stack((qs & 15, qs >> 4), axis=2)


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))  # [n, 8] each
    codes = _nibbles(blocks[:, 16:].reshape(-1, 4, 32))  # [n, 4, 2, 32]: sub-blocks 2c, 2c+1
    scale = d * sc.astype(np.float32)  # [n, 8]
    minimum = -(dmin * m.astype(np.float32))
    return codes.reshape(len(blocks), -1), scale, minimum


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks, 0)
    codes = _nibbles(blocks[:, 2:].reshape(-1, 1, 16))
    return codes.reshape(len(blocks), -1), d, -8 * d


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    codes = _nibbles(blocks[:, 4:].reshape(-1, 1, 16))
    return codes.reshape(len(blocks), -1), _f16(blocks, 0), _f16(blocks, 2)


_DECODERS = {"Q4_K": _q4_k, "Q4_0": _q4_0, "Q4_1": _q4_1}


def int4_matrix(type_name: str, rows: np.ndarray, cols: int) -> QuantMatrix:
    """uint8 rows ``[out, row bytes]`` stored as Q4_K / Q4_0 / Q4_1 -> int4 in groups of 32,
    float32 scale and minimum (module docstring)."""
    out = rows.shape[0]
    weights, size = _BLOCKS[type_name]
    if cols % weights or rows.shape[1] != cols // weights * size:
        raise ValueError(f"{type_name} rows of {rows.shape[1]} bytes do not hold {cols} weights")
    codes, scale, minimum = _DECODERS[type_name](np.ascontiguousarray(rows).reshape(-1, size))
    codes = codes.reshape(out, cols)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # the even column in the low nibble
    groups = cols // GROUP
    return QuantMatrix(
        4, out, cols, torch.from_numpy(np.ascontiguousarray(packed, dtype=np.uint8)),
        torch.from_numpy(scale.reshape(out, groups)),
        torch.from_numpy(minimum.reshape(out, groups)), GROUP,
    )  # fmt: skip


def int8_matrix(values: np.ndarray) -> QuantMatrix:
    """Dequantized float32 ``[out, in]`` -> int8, one float32 scale per row."""
    return quantize_int8(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), 0)


def compact(matrix: QuantMatrix) -> QuantMatrix:
    """The held form of an int4 matrix that stays in the canonical layout (the dequant kernel,
    a table's row lookup): float16 scale and minimum, as quant_layout holds them."""
    if matrix.bits != 4 or matrix.scales.dtype == torch.float16:
        return matrix
    assert matrix.minimum is not None
    return QuantMatrix(
        4, matrix.out_features, matrix.in_features, matrix.qweight,
        matrix.scales.to(torch.float16), matrix.minimum.to(torch.float16), matrix.group_size,
    )  # fmt: skip


def stack_rows(parts: list[QuantMatrix]) -> QuantMatrix:
    """Matrices of one layout stacked by rows (a fused q|k|v or gate|up): every layout here is
    per row, so this is the matrix the stacked values would quantize to."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    minimum = None
    if first.minimum is not None:
        minimum = torch.cat([p.minimum for p in parts])  # type: ignore[misc]
    return QuantMatrix(
        first.bits, sum(p.out_features for p in parts), first.in_features,
        torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), minimum,
        first.group_size,
    )  # fmt: skip
