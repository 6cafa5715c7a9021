"""The ``int4pack`` kernel: torch's weight-only int4 matrix product in groups, with bf16
activations: ``_weight_int4pack_mm`` on CUDA (the tinygemm layout, as gpt-fast and torchao pack
it), ``_weight_int4pack_mm_for_cpu`` on a CPU. One class, the op chosen by the matrix's device.

On a CPU the kernel is fast only in bf16: on the project's 2-core AVX-512 machine (one thread,
a 4096 x 4096 matrix) a decode step took 0.92 ms against 3.1 ms for a float32 F.linear, a
16-token product 6.7 ms against 11.6 ms, 256 tokens 129 ms against 124 ms; with float32
activations it ran 10x slower than float32 (the recipes' measurement in scripts/bench-quant).
"""

from __future__ import annotations

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear

# Rows the CPU op packs at a time: a matrix must have a multiple of them (kquant_rules.py too).
CPU_ROW_MULTIPLE = 16


def int4pack_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm")


class Int4PackLinear(QuantLinear):
    """Needs ``in`` a multiple of 32 and of the group, ``out`` a multiple of 8 (CUDA) or 16
    (CPU); KernelChooser checks its result against dequant on build."""

    kernel = "int4pack"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        self.group_size = matrix.group_size
        cpu = matrix.qweight.device.type == "cpu"
        # tinygemm tiles k by inner_k_tiles x 16 (2, 4 or 8 tiles): the widest that divides it.
        tiles = next((t for t in (8, 4, 2) if matrix.in_features % (t * 16) == 0), None)
        rows = CPU_ROW_MULTIPLE if cpu else 8
        if tiles is None or matrix.in_features % self.group_size or matrix.out_features % rows:
            raise ValueError("shape not supported by _weight_int4pack_mm")
        q = matrix.qweight
        if cpu:
            if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
                raise NotImplementedError("this torch has no CPU int4pack kernel")
            # The CPU op takes one int32 code per weight, in column order.
            codes = torch.stack((q & 15, q >> 4), dim=-1).view(matrix.out_features, -1)
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes.to(torch.int32), tiles
            )
            self._mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        else:
            # tinygemm wants the even column in the high nibble: swap the canonical nibbles.
            swapped = ((q & 15) << 4) | (q >> 4)
            self.packed = torch.ops.aten._convert_weight_to_int4pack(swapped, tiles)
            self._mm = torch.ops.aten._weight_int4pack_mm
        # value = (code - 8) * scale + zero  <=>  zero = minimum + 8 * scale (in float32, then
        # rounded once to bf16)
        scale = matrix.scales.float()
        zero = matrix.minimum.float() + 8 * scale
        # [groups, out, 2]
        self.scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        self.scales_zeros = self.scales_zeros.to(torch.bfloat16)
        self.matrix = None  # type: ignore[assignment]
        self._nbytes = self.packed.numel() * self.packed.element_size() + (
            self.scales_zeros.numel() * 2
        )

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = self._mm(x.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros)
        y = y.to(x.dtype)
        return y if bias is None else y + bias

    def nbytes(self) -> int:
        return self._nbytes
