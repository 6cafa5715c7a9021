"""Weight holders for the MLX model: a matrix that is either float or affine-quantized.

MLX's affine quantization stores ``w = scale * q + bias`` per group of ``group_size`` inputs, with
``q`` packed into uint32 words along the input dimension. Rows (outputs) are independent, so
quantized matrices can be row-permuted, row-gathered (embedding lookup) and row-concatenated
(fusing q|k|v) exactly, without touching the packed values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(slots=True)
class Matrix:
    """``[out, in]`` weights (float), or packed ``[out, in * bits / 32]`` uint32 with
    ``scales``/``biases`` ``[out, in / group_size]`` (quantized); optional ``bias [out]``."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bias: mx.array | None = None
    group_size: int = 0
    bits: int = 0

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def arrays(self) -> list[mx.array]:
        parts = (self.weight, self.scales, self.biases, self.bias)
        return [a for a in parts if a is not None]

    def __call__(self, x: mx.array) -> mx.array:
        """x [T, in] -> [T, out]."""
        if self.scales is not None:
            y = mx.quantized_matmul(
                x,
                self.weight,
                self.scales,
                self.biases,
                transpose=True,
                group_size=self.group_size,
                bits=self.bits,
            )
            if y.dtype != x.dtype:  # float16 scales with float32 activations promote
                y = y.astype(x.dtype)
        else:
            y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias
        return y

    def rows(self, ids: mx.array, dtype: mx.Dtype) -> mx.array:
        """Embedding lookup: ids [T] -> [T, in] in ``dtype`` (only the gathered rows are
        dequantized)."""
        if self.scales is None:
            return self.weight[ids].astype(dtype)
        assert self.biases is not None
        # Scales cast first: dequantizing in float16 would round every float32 embedding.
        return mx.dequantize(
            self.weight[ids],
            self.scales[ids].astype(dtype),
            self.biases[ids].astype(dtype),
            group_size=self.group_size,
            bits=self.bits,
        )

    def take_rows(self, index: mx.array | slice) -> Matrix:
        """The matrix restricted to / reordered by output rows: row i is row ``index[i]``."""
        pick = [None if a is None else a[index] for a in (self.scales, self.biases, self.bias)]
        return Matrix(self.weight[index], *pick, group_size=self.group_size, bits=self.bits)


def same_format(parts: Sequence[Matrix]) -> bool:
    first = parts[0]
    return all(
        p.quantized == first.quantized
        and p.group_size == first.group_size
        and p.bits == first.bits
        and p.weight.dtype == first.weight.dtype
        and (p.scales is None or p.scales.dtype == first.scales.dtype)  # type: ignore[union-attr]
        and (p.bias is None) == (first.bias is None)
        for p in parts
    )


class Projection:
    """Several matrices that read the same input (q|k|v, gate|up), fused into one product per run
    of neighbours that share a format: a decode step is then one call per input instead of three
    or two.

    Parts of different formats (a Q4_K_M GGUF whose V is Q6_K, held 8-bit, beside 4-bit Q and K)
    stay separate products rather than being widened to one format, which would cost memory and
    (for a requantized part) accuracy: q|k fused, v on its own.
    """

    def __init__(self, parts: Sequence[Matrix]) -> None:
        runs: list[list[Matrix]] = []
        for p in parts:
            if runs and same_format([runs[-1][0], p]):
                runs[-1].append(p)
            else:
                runs.append([p])
        self.parts = [_fused(run) for run in runs]
        self._run_sizes = [[p.out_features for p in run] for run in runs]

    def arrays(self) -> list[mx.array]:
        return [a for p in self.parts for a in p.arrays()]

    def matrices(self) -> list[Matrix]:
        """The separate matrices again (fused ones split by rows, which is exact)."""
        out = []
        for fused, sizes in zip(self.parts, self._run_sizes, strict=True):
            if len(sizes) == 1:
                out.append(fused)
                continue
            start = 0
            for size in sizes:
                out.append(fused.take_rows(slice(start, start + size)))
                start += size
        return out

    def __call__(self, x: mx.array) -> list[mx.array]:
        """x [T, in] -> one [T, size_i] output per part, in the order given."""
        out = []
        for part, sizes in zip(self.parts, self._run_sizes, strict=True):
            y = part(x)  # [T, sum(sizes)]
            if len(sizes) == 1:
                out.append(y)
                continue
            cuts, total = [], 0
            for size in sizes[:-1]:
                total += size
                cuts.append(total)
            out.extend(mx.split(y, cuts, axis=-1))
        return out


def _fused(parts: Sequence[Matrix]) -> Matrix:
    """One matrix of ``parts``' rows in order (all of one format)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]

    def cat(field: str) -> mx.array | None:
        if getattr(first, field) is None:
            return None
        return mx.concatenate([getattr(p, field) for p in parts])

    return Matrix(
        cat("weight"),  # type: ignore[arg-type]
        cat("scales"),
        cat("biases"),
        cat("bias"),
        group_size=first.group_size,
        bits=first.bits,
    )
