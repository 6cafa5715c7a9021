"""oneDNN's packed matmul: where dense CPU matrices are multiplied faster in its blocked layout.

Where the native kernels cannot be built, CPU matrices are packed once into oneDNN's blocked
layout: on the project's 2-core x86 machine that read SmolLM2's fp32 matrices about 2x faster
than torch's default matmul for the 4-8 row products of batched decode and no slower for one row
(per-call measurement while choosing: 8 rows 11.8 vs 5.6 GB/s). The native kernels stream one row
at about 2x that (scripts/bench-native-kernels).
"""

from __future__ import annotations

from functools import cache

import torch


def onednn_available(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN packed matmul: CPU builds with mkldnn, float32, or bfloat16 where this CPU's
    oneDNN packs it (its fp16 path needs AVX512-FP16, which most x86 CPUs lack)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return _onednn_packs_bf16()
    return dtype == torch.float32


@cache
def _onednn_packs_bf16() -> bool:
    """Asked of oneDNN itself: its bf16 linear packing needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT
    (an AVX2 laptop CPU has neither, and ONEDNN_MAX_CPU_ISA=AVX2 hides them). Without it bf16
    matrices stay plain and F.linear multiplies them (support.onednn_bf16_expected is the
    budget's torch-free answer to the same question)."""
    try:
        pack_onednn(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def pack_onednn(w: torch.Tensor) -> torch.Tensor:
    # No batch-size hint: measured as good as a hint of 8 for 1..64 rows.
    return torch.ops.mkldnn._reorder_linear_weight(w, None)


def linear_onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w packed from [out, in] by pack_onednn (or plain) -> [T, out]."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
