"""Which kernel multiplies a quantized matrix, chosen per device and checked once.

``KERNEL_ORDER`` lists, per (device, bits), the kernels to try, fastest first, from measurements
on the project's 2-core x86 CPU (scripts/bench-quant): on CPU only ``dequant`` is weight-only
and not slower than the alternatives (quantization there buys memory, not speed: the llama.cpp
backend is the fast quantized CPU path); CUDA has torch's packed kernels. ``PACKED_ORDER``
is the table for a K-quant GGUF's converted matrices: the packed kernels on both. A fast kernel is
checked against ``dequant`` on random input when it is first built; a mismatch (an untested
device, a layout change in torch) falls back to ``dequant`` with a warning instead of producing
garbage.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from localinfer.backends.torch.quant_dequant import DequantBuffer, DequantLinear
from localinfer.backends.torch.quant_fbgemm import FbgemmInt8Linear, fbgemm_available
from localinfer.backends.torch.quant_int4pack import Int4PackLinear, int4pack_available
from localinfer.backends.torch.quant_int8pack import Int8PackLinear, int8pack_available
from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear

log = logging.getLogger(__name__)

KERNEL_ENV = "LOCALINFER_QUANT_KERNEL"  # force one kernel (benchmarks): fbgemm | dequant | ...
KERNEL_ORDER: dict[tuple[str, int], tuple[str, ...]] = {
    # fbgemm is the fastest CPU kernel but its 7-bit per-tensor activations cost SmolLM2 a 62%
    # perplexity rise (KL 0.53, top-1 62%): offered only through KERNEL_ENV, for measurement.
    ("cpu", 8): ("dequant",),
    ("cpu", 4): ("dequant",),
    ("cuda", 8): ("int8pack", "dequant"),
    ("cuda", 4): ("int4pack", "dequant"),
}
# A K-quant GGUF's matrices, held as converted from the file (kquant_rules.py): the packed
# kernels on a CPU too, where with bf16 activations they measured ~3x a float32 product at
# decode and no slower at prefill (quant_int4pack.py, quant_int8pack.py). The recipes' CPU
# order above came from scripts/bench-quant, which timed the packed ops in float32 only.
PACKED_ORDER: dict[tuple[str, int], tuple[str, ...]] = {
    ("cpu", 8): ("int8pack", "dequant"),
    ("cpu", 4): ("int4pack", "dequant"),
    ("cuda", 8): ("int8pack", "dequant"),
    ("cuda", 4): ("int4pack", "dequant"),
}


def kernel_available(name: str) -> bool:
    if name == "fbgemm":
        return fbgemm_available()
    if name == "int8pack":
        return int8pack_available()
    if name == "int4pack":
        return int4pack_available()
    return name == "dequant"


class KernelChooser:
    """Builds QuantLinear objects for one model: picks the first kernel of ``KERNEL_ORDER`` for
    the device that is available and agrees with ``dequant`` (checked once per kernel).
    ``order``: the table to pick from (default KERNEL_ORDER)."""

    def __init__(
        self,
        bits: int,
        dtype: torch.dtype,
        device: torch.device,
        force: str | None = None,
        order: Mapping[tuple[str, int], tuple[str, ...]] | None = None,
    ) -> None:
        self.dtype = dtype
        self.order = KERNEL_ORDER if order is None else order
        self.device = device
        self.buffer = DequantBuffer(dtype, device)
        self.force = force or os.environ.get(KERNEL_ENV) or None
        self.candidates = self.candidates_for(bits)
        self._verified: dict[str, bool] = {}
        self.kernels_used: dict[str, int] = {}  # kernel name -> matrices built with it

    def candidates_for(self, bits: int) -> list[str]:
        """The kernels to try for ``bits``-bit matrices (a mixed recipe holds both widths)."""
        order = (self.force,) if self.force else self.order.get((self.device.type, bits), ())
        return [k for k in order if kernel_available(k)] or ["dequant"]

    def _note(self, ql: QuantLinear) -> QuantLinear:
        self.kernels_used[ql.kernel] = self.kernels_used.get(ql.kernel, 0) + 1
        return ql

    def dequant(self, matrix: QuantMatrix) -> DequantLinear:
        return self._note(DequantLinear(matrix.to(self.device), self.dtype, self.buffer))

    def build(self, matrix: QuantMatrix) -> QuantLinear:
        matrix = matrix.to(self.device)
        for name in self.candidates_for(matrix.bits):
            if name == "dequant":
                break
            try:
                ql = _make_fast(name, matrix, self.dtype)
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                log.debug("kernel %s unusable for %s: %s", name, matrix.shape, exc)
                continue
            key = f"{name}/{matrix.bits}"
            if key not in self._verified:
                self._verified[key] = _agrees(ql, matrix, self.dtype)
                if not self._verified[key]:
                    log.warning("quantized kernel %s disagrees with dequant: not used", name)
            if self._verified[key]:
                return self._note(ql)
        return self._note(DequantLinear(matrix, self.dtype, self.buffer))


def _make_fast(name: str, matrix: QuantMatrix, dtype: torch.dtype) -> QuantLinear:
    if name in ("fbgemm", "int8pack") and matrix.group_size:
        raise ValueError(f"kernel {name} takes per-channel int8 only")
    if name == "fbgemm" and matrix.bits == 8:
        return FbgemmInt8Linear(matrix, dtype)
    if name == "int8pack" and matrix.bits == 8:
        return Int8PackLinear(matrix, dtype)
    if name == "int4pack" and matrix.bits == 4:
        return Int4PackLinear(matrix, dtype)
    raise ValueError(f"kernel {name} does not take {matrix.bits}-bit weights")


def _agrees(ql: QuantLinear, matrix: QuantMatrix, dtype: torch.dtype) -> bool:
    """Run the kernel on random rows and compare with the dequantized product. The tolerance
    admits activation rounding (fbgemm quantizes inputs to 7 bits) but not a wrong layout."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, matrix.in_features, generator=gen).to(device=matrix.qweight.device)
    x = x.to(dtype)
    ref = F.linear(x.float(), matrix.dequantize(torch.float32))
    try:
        got = ql(x).float()
    except (RuntimeError, NotImplementedError):
        return False
    err = (got - ref).norm() / ref.norm().clamp_min(1e-12)
    return bool(err < 0.05)
