"""The ``dequant`` kernel (any device, the CPU default): expand a block of rows into one reused
buffer, then a plain float matmul. Weight-only, so as accurate as the quantized weights; on CPU
about 2x the cost of a float32 product for int8 (scripts/bench-quant), more for int4."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear

# Largest block the dequant kernel expands at once (elements): 4M floats = 16 MB in float32.
DEQUANT_BLOCK_ELEMENTS = 1 << 22


class DequantBuffer:
    """One scratch buffer shared by every dequant kernel of a model (layers run one at a time)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype = dtype
        self.device = device
        self._buf = torch.empty(0, dtype=dtype, device=device)

    def get(self, rows: int, cols: int) -> torch.Tensor:
        if self._buf.numel() < rows * cols:
            self._buf = torch.empty(rows * cols, dtype=self.dtype, device=self.device)
        return self._buf[: rows * cols].view(rows, cols)

    def nbytes(self) -> int:
        return self._buf.numel() * self._buf.element_size()


class DequantLinear(QuantLinear):
    kernel = "dequant"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype, buffer: DequantBuffer) -> None:
        super().__init__(matrix, dtype)
        self.buffer = buffer
        self.block_rows = max(1, min(self.out_features, DEQUANT_BLOCK_ELEMENTS // matrix.padded_in))

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        m, n = self.matrix, self.out_features
        cols = m.padded_in
        if self.block_rows >= n:
            w = m.dequantize_into(0, n, self.buffer.get(n, cols))  # [out, in]
            return F.linear(x, w, bias)
        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)  # [T, out]
        for start in range(0, n, self.block_rows):
            stop = min(n, start + self.block_rows)
            w = m.dequantize_into(start, stop, self.buffer.get(stop - start, cols))
            b = None if bias is None else bias[start:stop]
            out[:, start:stop] = F.linear(x, w, b)
        return out

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding gather: ids [T] long -> [T, in] in the compute dtype."""
        return self.matrix.dequantize_rows(ids, self.dtype)
