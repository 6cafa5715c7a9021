"""The interface every quantized-matrix kernel implements (quant_kernels.py chooses one)."""

from __future__ import annotations

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix


class QuantLinear:
    """A quantized matrix plus the kernel that multiplies by it: ``ql(x, bias)`` is
    ``x @ W.T + bias`` for x ``[T, in]`` in the compute dtype -> ``[T, out]``."""

    kernel: str = ""

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        self.matrix = matrix
        self.dtype = dtype
        self.out_features, self.in_features = matrix.shape

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def nbytes(self) -> int:
        return self.matrix.nbytes()

    @property
    def shape(self) -> tuple[int, int]:
        # Not the matrix's: kernels that repack it keep only their own copy (matrix = None).
        return (self.out_features, self.in_features)
