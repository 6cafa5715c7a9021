"""The ``int4pack`` kernel: torch's weight-only ``_weight_int4pack_mm`` (CUDA, bf16 activations;
the tinygemm layout, as gpt-fast and torchao pack it). On CPU it ran 3-10x slower than float32
(scripts/bench-quant), so it is not offered there."""

from __future__ import annotations

import torch

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear


def int4pack_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm")


class Int4PackLinear(QuantLinear):
    """Needs ``in`` a multiple of 32 and of the group, ``out`` a multiple of 8; KernelChooser
    checks its result against dequant on build (not run here: no GPU)."""

    kernel = "int4pack"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        self.group_size = matrix.group_size
        # tinygemm tiles k by inner_k_tiles x 16 (2, 4 or 8 tiles): the widest that divides it.
        tiles = next((t for t in (8, 4, 2) if matrix.in_features % (t * 16) == 0), None)
        if tiles is None or matrix.in_features % self.group_size or matrix.out_features % 8:
            raise ValueError("shape not supported by _weight_int4pack_mm")
        q = matrix.qweight
        # tinygemm wants the even column in the high nibble: swap the canonical nibbles.
        swapped = ((q & 15) << 4) | (q >> 4)
        self.packed = torch.ops.aten._convert_weight_to_int4pack(swapped, tiles)
        # value = (code - 8) * scale + zero  <=>  zero = minimum + 8 * scale
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
        y = torch.ops.aten._weight_int4pack_mm(
            x.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros
        ).to(x.dtype)
        return y if bias is None else y + bias

    def nbytes(self) -> int:
        return self._nbytes
