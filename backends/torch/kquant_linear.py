"""The two matrix kinds a K-quant GGUF adds beside the quantized kernels (kquant_form.py):
a matrix the file stores as floats, and a fused matrix whose parts are held in different forms
(q|k as int4 from Q4_K beside v as int8 from Q6_K, as llama.cpp's Q4_K_M mixes them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localinfer.backends.torch.quant_linear import QuantLinear


class DenseLinear(QuantLinear):
    """A float matrix in the compute dtype, behind the QuantLinear interface."""

    kernel = "dense"

    def __init__(self, weight: torch.Tensor) -> None:  # no QuantMatrix: not super().__init__
        self.matrix = None  # type: ignore[assignment]
        self.weight = weight
        self.dtype = weight.dtype
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class SplitLinear(QuantLinear):
    """Row blocks held apart, each with its own kernel: ``[T, in] -> [T, sum of outs]``."""

    kernel = "split"

    def __init__(self, parts: list[QuantLinear]) -> None:  # no QuantMatrix: not super().__init__
        self.matrix = None  # type: ignore[assignment]
        self.parts = parts
        self.dtype = parts[0].dtype
        self.out_features = sum(p.out_features for p in parts)
        self.in_features = parts[0].in_features

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.cat([p(x) for p in self.parts], dim=-1)
        return y if bias is None else y + bias

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)
