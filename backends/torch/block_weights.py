"""GGUF legacy-quant matrices kept as their stored blocks for the native CPU kernels.

A decode step streams every weight once, so on CPU its speed is the bytes it reads. The embedded
SmolLM2 file holds ~96 MB of Q4_1/Q8_0 blocks that dequantize to 540 MB of float32: the native
kernels (cpu_kernels.c) read the blocks themselves and decode each one with exactly the float32
arithmetic of gguf-py's dequantization, so results equal the float32 path's bit for bit.

Only Q8_0, Q4_0 and Q4_1 (32 weights a block, one or two f16 scales) are kept; a matrix whose
parts (q|k|v, gate|up) are not all one of these, in one type, stays float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from localinfer.errors import ModelFileError

BLOCK_WEIGHTS = 32
# GGUF type name -> (format code in cpu_kernels.c, bytes per block of 32 weights)
BLOCK_FORMATS: dict[str, tuple[int, int]] = {"Q8_0": (1, 34), "Q4_0": (2, 18), "Q4_1": (3, 20)}


class BlockSource(Protocol):
    """A weight source that can hand out stored block rows (GGUFWeights)."""

    def stored_rows(self, name: str) -> tuple[str, np.ndarray] | None: ...

    def nbytes(self) -> int: ...


@dataclass(slots=True, eq=False)
class BlockMatrix:
    """A matrix ``[out, in]`` as GGUF block rows: ``blocks`` uint8 ``[out, in // 32 * size]``."""

    qtype: str  # "Q8_0" | "Q4_0" | "Q4_1"
    blocks: torch.Tensor
    in_features: int

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def format(self) -> int:
        return BLOCK_FORMATS[self.qtype][0]

    @property
    def row_bytes(self) -> int:
        return self.blocks.shape[1]

    def nbytes(self) -> int:
        return self.blocks.untyped_storage().nbytes()


def row_bytes(qtype: str, in_features: int) -> int:
    return in_features // BLOCK_WEIGHTS * BLOCK_FORMATS[qtype][1]


def block_matrix(
    source: BlockSource,
    parts: Sequence[str],
    shape: tuple[int, int],
    name: str,
    alloc: Callable[[tuple[int, int]], torch.Tensor] | None = None,
) -> BlockMatrix | None:
    """The row concatenation of ``parts`` as one BlockMatrix of ``shape``, or None when a part
    is not stored in one shared supported type (the caller keeps the matrix float32).
    ``alloc(shape)`` gives the uint8 tensor to copy into (default: torch.empty).
    ModelFileError when the stored bytes do not fit the shape."""
    out, in_features = shape
    if in_features % BLOCK_WEIGHTS:
        return None
    stored = []
    for part in parts:
        try:
            found = source.stored_rows(part)
        except KeyError:
            raise ModelFileError(part, "tensor missing from the model file") from None
        if found is None:
            return None
        stored.append(found)
    qtypes = {qtype for qtype, _ in stored}
    if len(qtypes) != 1 or (qtype := qtypes.pop()) not in BLOCK_FORMATS:
        return None
    expected = row_bytes(qtype, in_features)
    rows = 0
    for part, (_, array) in zip(parts, stored, strict=True):
        if array.ndim != 2 or array.shape[1] != expected:
            raise ModelFileError(
                part,
                f"{qtype} rows of {array.shape[1:]} bytes, expected {expected} for "
                f"{in_features} weights",
            )
        rows += array.shape[0]
    if rows != out:
        raise ModelFileError(name, f"{rows} {qtype} rows, expected {out}")
    blocks = alloc((out, expected)) if alloc else torch.empty(out, expected, dtype=torch.uint8)
    np.concatenate([a for _, a in stored], out=blocks.numpy())  # one copy, never a view of the file
    return BlockMatrix(qtype, blocks, in_features)
