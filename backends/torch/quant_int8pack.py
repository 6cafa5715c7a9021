"""The ``int8pack`` kernel: torch's weight-only ``_weight_int8pack_mm`` (CUDA; on CPU it ran
3-10x slower than float32, scripts/bench-quant, so it is not offered there)."""

from __future__ import annotations

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear


def int8pack_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8PackLinear(QuantLinear):
    """A real kernel for bf16/fp16 activations, on the canonical per-channel int8 matrix."""

    kernel = "int8pack"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        self.scales = matrix.scales.to(dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x, self.matrix.qweight, self.scales)
        return y if bias is None else y + bias
