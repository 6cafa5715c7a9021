"""The ``int8pack`` kernel: torch's weight-only ``_weight_int8pack_mm`` on a per-row int8 matrix.

On CUDA it multiplies in the compute dtype. On a CPU only bf16 activations are fast: on the
project's 2-core AVX-512 machine (one thread, 4096 x 4096) a decode step took 1.15 ms against
3.4 ms for a float32 F.linear and 8.1 ms against 12.7 ms at 16 tokens; float32 or float16
activations ran 5-20x slower than float32 (so the recipes' CPU order leaves it out,
quant_kernels.py). The CPU kernel therefore converts its input to bf16 and back.
"""

from __future__ import annotations

import dataclasses

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear


def int8pack_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8PackLinear(QuantLinear):
    """A real kernel on the canonical per-row int8 matrix; its rows can be gathered too (an
    embedding table that is also the LM head)."""

    kernel = "int8pack"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        cpu = matrix.qweight.device.type == "cpu"
        self.act = torch.bfloat16 if cpu else dtype  # the dtype the kernel multiplies in
        # One scale tensor, in that dtype, serves the kernel and the row gather.
        self.matrix = dataclasses.replace(matrix, scales=matrix.scales.to(self.act))
        self.scales = self.matrix.scales

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(self.act), self.matrix.qweight, self.scales)
        y = y.to(x.dtype)
        return y if bias is None else y + bias

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding gather: ids [T] long -> [T, in] in the compute dtype."""
        return self.matrix.dequantize_rows(ids, self.dtype)
