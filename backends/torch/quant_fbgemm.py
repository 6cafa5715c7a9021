"""The ``fbgemm`` kernel (CPU, per-channel int8): fbgemm's prepacked int8 GEMM with the
activations quantized per call (``quantized::linear_dynamic``).

The only CPU path measured faster than float (2-4x a float32 matrix-vector product for these
layer shapes), but it is W8A8, not weight-only: 7-bit per-tensor activations cost SmolLM2 a 62%
perplexity rise (scripts/bench-quant), so it is only chosen through the kernel override.
"""

from __future__ import annotations

import warnings

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
        torch.ops.quantized, "linear_dynamic"
    )


class FbgemmInt8Linear(QuantLinear):
    """The prepacked matrix replaces the canonical int8 one."""

    kernel = "fbgemm"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated, the kernel is not
            warnings.simplefilter("ignore")
            qt = torch._make_per_channel_quantized_tensor(
                matrix.qweight, matrix.scales.double(), zero, 0
            )
            self.packed = torch.ops.quantized.linear_prepack(qt, None)
        # fbgemm keeps its own copy: per-row scales and column offsets beside the int8 matrix.
        self._nbytes = matrix.qweight.numel() + self.out_features * (8 + 8 + 4)
        self.matrix = None  # type: ignore[assignment]  # the packed copy is the only one kept

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # reduce_range=True: 7-bit activations, which fbgemm needs to avoid int16 overflow in
        # its AVX2 accumulation.
        y = torch.ops.quantized.linear_dynamic(x.float(), self.packed, True)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)

    def nbytes(self) -> int:
        return self._nbytes
