"""Weight-only quantization for the torch runner: int8 per output channel, int4 in groups.

Canonical layout (what is quantized once, cached on disk and gathered from):

* int8: ``qweight`` int8 ``[out, in]``, symmetric (``w = q * s``): one float32 scale per row
  (``int8``, the layer matrices), or float16 scales per group of 32/64/128 inputs (``int8-gN``;
  rows padded with zeros to whole groups). ``int8`` keeps the embedding table (gathered, and the
  LM head when tied) in groups of 32: that is a GGUF Q8_0 table exactly, and per-row scales on it
  cost SmolLM2 1.3 points of top-1 agreement for 1% of the weights memory.
* int4: ``qweight`` uint8 ``[out, in_pad // 2]``, two codes per byte (even column in the low
  nibble), asymmetric per group of ``group_size`` inputs along a row: ``w = q * scale + minimum``
  with float16 ``scale`` and ``minimum`` ``[out, groups]``. ``in_pad`` rounds ``in`` up to a whole
  group; padded columns hold code 0 and are cut off when dequantized.

Row-wise quantization commutes with stacking rows, so fused q|k|v and gate|up matrices quantize
exactly like their parts.

How a quantized matrix is multiplied is a *kernel*, chosen per device (``KERNEL_ORDER``) from
measurements on the project's 2-core x86 CPU (scripts/bench-quant and the module notes below):

* ``fbgemm`` (CPU, int8): fbgemm's prepacked int8 GEMM with the activations quantized per call
  (``quantized::linear_dynamic``). 2-4x faster than a float32 matrix-vector product for these
  layer shapes, the only CPU path measured faster than float -- but it is W8A8, not weight-only:
  quantizing activations to 7 bits per tensor wrecked SmolLM2 (perplexity +62% on the
  evaluation text, top-1 agreement 62%), so it is not chosen by default.
* ``int8pack`` / ``int4pack`` (torch's weight-only packed kernels): 3-10x *slower* than float32
  on this CPU, so used only on CUDA (``_weight_int8pack_mm`` / ``_weight_int4pack_mm``).
* ``dequant`` (any device): dequantize into one reused buffer, a block of rows at a time, then a
  plain float matmul. Weight-only, so as accurate as the quantized weights; about 2x the cost of
  a float32 product for int8 on this CPU (the expansion reads 1 byte and writes 4 per weight),
  more for int4 (nibble unpacking). It is the CPU default: on CPU, quantization here buys memory,
  not speed -- the llama.cpp backend is the fast quantized CPU path.

A fast kernel is checked against ``dequant`` on random input when it is built; a mismatch (an
untested device, a layout change in torch) falls back to ``dequant`` with a warning instead of
producing garbage.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localinfer.errors import UnsupportedModelError

log = logging.getLogger(__name__)

# Bump when the canonical layout or the rounding changes: the disk cache keys on it.
QUANT_LAYOUT_VERSION = 1
GROUP_SIZES = (32, 64, 128)
INT4_GROUP_SIZES = GROUP_SIZES
EMBED_INT8_GROUP = 32
# 64, like MLX's default: 4.5 bits/weight (budget "int4"). 128 (4.25) pads rows whose width is
# not a multiple of 128 (SmolLM2's 576 -> 640, +11%) and loses more; 32 (5.0) loses least.
DEFAULT_INT4_GROUP = 64
# Largest block the dequant kernel expands at once (elements): 4M floats = 16 MB in float32.
DEQUANT_BLOCK_ELEMENTS = 1 << 22

KERNEL_ENV = "LOCALINFER_QUANT_KERNEL"  # force one kernel (benchmarks): fbgemm | dequant | ...
KERNEL_ORDER: dict[tuple[str, int], tuple[str, ...]] = {
    # fbgemm is the fastest CPU kernel but its 7-bit per-tensor activations cost SmolLM2 a 62%
    # perplexity rise (KL 0.53, top-1 62%): offered only through KERNEL_ENV, for measurement.
    ("cpu", 8): ("dequant",),
    ("cpu", 4): ("dequant",),
    ("cuda", 8): ("int8pack", "dequant"),
    ("cuda", 4): ("int4pack", "dequant"),
}

_FLOAT_NAMES = {"none", "fp32", "f32", "float32", "bf16", "bfloat16", "fp16", "f16", "float16"}
_QUANT_RE = re.compile(r"^int(4|8)(?:[-_]?g(\d+))?$")


@dataclass(slots=True, frozen=True)
class QuantSpec:
    """What ``RunnerConfig.quant`` asks of the torch runner."""

    bits: int  # 8 or 4
    group_size: int  # inputs per group; int8 only: 0 = one scale per row

    @property
    def label(self) -> str:
        if self.bits == 8 and not self.group_size:
            return "int8"
        return f"int{self.bits}-g{self.group_size}"

    def for_table(self) -> QuantSpec:
        """The spec of the embedding table (see the module docstring)."""
        return QuantSpec(8, EMBED_INT8_GROUP) if self == QuantSpec(8, 0) else self


def parse_quant(quant: str | None) -> QuantSpec | None:
    """``int8``, ``int4``, ``int4-g32|g64|g128`` -> QuantSpec; None / ``none`` / a float name ->
    None (no quantization). Anything else: UnsupportedModelError."""
    if quant is None or quant.strip().lower() in _FLOAT_NAMES:
        return None
    m = _QUANT_RE.match(quant.strip().lower())
    if not m:
        raise UnsupportedModelError(
            f"the torch runner quantizes to int8 or int4 (int4-g32/-g64/-g128), not {quant!r}"
        )
    bits = int(m.group(1))
    default = 0 if bits == 8 else DEFAULT_INT4_GROUP
    group = int(m.group(2)) if m.group(2) else default
    if group and group not in GROUP_SIZES:
        raise UnsupportedModelError(f"int{bits} group size must be one of {GROUP_SIZES}: {group}")
    return QuantSpec(bits, group)


@dataclass(slots=True)
class QuantMatrix:
    """A weight matrix ``[out, in]`` in the canonical quantized layout (module docstring)."""

    bits: int
    out_features: int
    in_features: int
    qweight: torch.Tensor  # int8 [out, in] / [out, in_pad] | uint8 [out, in_pad // 2]
    scales: torch.Tensor  # int8: float32 [out] / float16 [out, groups] | float16 [out, groups]
    minimum: torch.Tensor | None  # int4: float16 [out, groups]
    group_size: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.qweight, self.scales, self.minimum) if t is not None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """-> [out, in] in ``dtype``."""
        return self.dequantize_rows(slice(None), dtype)

    def dequantize_rows(self, rows: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``rows`` (a slice or a LongTensor of row ids) -> [R, in] in ``dtype``."""
        q = self.qweight[rows]
        r = q.shape[0]
        if self.bits == 8:
            if not self.group_size:
                return (q.to(torch.float32) * self.scales[rows][:, None]).to(dtype)
            w = q.view(r, -1, self.group_size).to(torch.float32)
            w *= self.scales[rows].float()[..., None]  # [R, groups, group]
            return w.view(r, -1)[:, : self.in_features].to(dtype)
        codes = torch.stack((q & 15, q >> 4), dim=-1).view(r, -1, self.group_size)
        w = codes.to(torch.float32) * self.scales[rows].float()[..., None]
        w += self.minimum[rows].float()[..., None]  # [R, groups, group]
        return w.view(r, -1)[:, : self.in_features].to(dtype)

    @property
    def padded_in(self) -> int:
        """Columns of the stored layout (``in`` rounded up to whole groups)."""
        if not self.group_size:
            return self.in_features
        return -(-self.in_features // self.group_size) * self.group_size

    def dequantize_into(self, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        """Rows ``start:stop`` -> ``out`` [stop - start, padded_in] (any float dtype), written in
        place with no full-size temporaries (this runs for every matrix on every forward).
        Returns ``out[:, :in]``."""
        q = self.qweight[start:stop]
        r, g = stop - start, self.group_size
        # Measured on the 2-core x86 CPU: contiguous copy + in-place mul/add with float32 group
        # factors runs ~100x faster than writing through strided views, addcmul with broadcast
        # operands, or float16 factors (which also compute in float16).
        if self.bits == 8 and not g:
            torch.mul(q, self.scales[start:stop, None], out=out)  # int8 x float32 -> float32
            return out[:, : self.in_features]
        groups = out.view(r, -1, g)  # [R, groups, group]
        if self.bits == 8:
            groups.copy_(q.view(r, -1, g))
        else:
            # [R, in_pad / 2, 2] -> [R, groups, group]: the even column is the low nibble
            groups.copy_(torch.stack((q & 15, q >> 4), dim=-1).view(r, -1, g))
        groups.mul_(self.scales[start:stop].float()[..., None])
        if self.minimum is not None:
            groups.add_(self.minimum[start:stop].float()[..., None])
        return out[:, : self.in_features]

    def to(self, device: torch.device) -> QuantMatrix:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return QuantMatrix(
            self.bits, self.out_features, self.in_features, move(self.qweight),
            move(self.scales), move(self.minimum), self.group_size,
        )  # fmt: skip

    def to_arrays(self) -> dict[str, np.ndarray]:
        """numpy arrays for the on-disk cache (localinfer/quant_cache.py)."""
        out = {"qweight": self.qweight.cpu().numpy(), "scales": self.scales.cpu().numpy()}
        if self.minimum is not None:
            out["minimum"] = self.minimum.cpu().numpy()
        out["meta"] = np.array(
            [self.bits, self.out_features, self.in_features, self.group_size], dtype=np.int64
        )
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> QuantMatrix:
        bits, out_f, in_f, group = (int(v) for v in arrays["meta"])
        minimum = arrays.get("minimum")
        qm = cls(
            bits, out_f, in_f, torch.from_numpy(np.array(arrays["qweight"])),
            torch.from_numpy(np.array(arrays["scales"])),
            None if minimum is None else torch.from_numpy(np.array(minimum)), group,
        )  # fmt: skip
        qm.validate()
        return qm

    def validate(self) -> None:
        """Shapes and dtypes agree with the layout (a corrupt cache entry raises ValueError)."""
        o, i = self.out_features, self.in_features
        g = self.group_size
        groups = -(-i // g) if g else 0
        if self.bits == 8 and g:
            ok = (
                g in GROUP_SIZES
                and self.qweight.dtype == torch.int8
                and tuple(self.qweight.shape) == (o, groups * g)
                and tuple(self.scales.shape) == (o, groups)
            )
        elif self.bits == 8:
            ok = (
                self.qweight.dtype == torch.int8
                and tuple(self.qweight.shape) == (o, i)
                and tuple(self.scales.shape) == (o,)
            )
        elif self.bits == 4:
            ok = (
                g in INT4_GROUP_SIZES
                and self.qweight.dtype == torch.uint8
                and tuple(self.qweight.shape) == (o, groups * g // 2)
                and tuple(self.scales.shape) == (o, groups)
                and self.minimum is not None
                and tuple(self.minimum.shape) == (o, groups)
            )
        else:
            ok = False
        if not ok:
            raise ValueError(f"inconsistent quantized matrix {self.bits}-bit {o}x{i}")


def quantize(w: torch.Tensor, spec: QuantSpec) -> QuantMatrix:
    """[out, in] float -> QuantMatrix (computed in float32 on w's device)."""
    if w.dim() != 2:
        raise ValueError(f"quantize takes a matrix, got shape {tuple(w.shape)}")
    if spec.bits == 8:
        return quantize_int8(w, spec.group_size)
    return quantize_int4(w, spec.group_size)


def quantize_int8(w: torch.Tensor, group_size: int = 0) -> QuantMatrix:
    w = w.float()
    out_f, in_f = w.shape
    if group_size:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"int8 group size must be one of {GROUP_SIZES}, got {group_size}")
        groups = -(-in_f // group_size)
        padded = F.pad(w, (0, groups * group_size - in_f))  # zeros never widen |max|
        g = padded.view(out_f, groups, group_size)
        scales = (g.abs().amax(dim=-1) / 127.0).to(torch.float16)  # [out, groups]
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(g / scales.float()[..., None]).clamp_(-127, 127).to(torch.int8)
        return QuantMatrix(8, out_f, in_f, q.view(out_f, -1), scales, None, group_size)
    scales = w.abs().amax(dim=1) / 127.0  # [out]
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # all-zero rows
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantMatrix(8, out_f, in_f, q, scales, None, 0)


def quantize_int4(w: torch.Tensor, group_size: int) -> QuantMatrix:
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    w = w.float()
    out_f, in_f = w.shape
    groups = -(-in_f // group_size)
    pad = groups * group_size - in_f
    # Pad with each row's last real value, so padding never widens a group's range.
    if pad:
        w = torch.cat([w, w[:, -1:].expand(out_f, pad)], dim=1)
    g = w.view(out_f, groups, group_size)
    lo = g.amin(dim=-1)  # [out, groups]
    hi = g.amax(dim=-1)
    # Round scale and minimum to float16 *before* computing codes, so the codes fit the stored
    # (rounded) values rather than the exact ones.
    scale = ((hi - lo) / 15.0).to(torch.float16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    lo16 = lo.to(torch.float16)
    codes = torch.round((g - lo16.float()[..., None]) / scale.float()[..., None])
    codes = codes.clamp_(0, 15).to(torch.uint8).view(out_f, groups * group_size)
    if pad:
        codes[:, in_f:] = 0
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()  # [out, in_pad // 2]
    return QuantMatrix(4, out_f, in_f, packed, scale, lo16, group_size)


# -- kernels --------------------------------------------------------------------------------


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
        return self.matrix.shape


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


class FbgemmInt8Linear(QuantLinear):
    """fbgemm int8 GEMM (CPU). The prepacked matrix replaces the canonical int8 one."""

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

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)


class Int8PackLinear(QuantLinear):
    """torch._weight_int8pack_mm (CUDA: a real kernel for bf16/fp16 activations)."""

    kernel = "int8pack"

    def __init__(self, matrix: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__(matrix, dtype)
        self.scales = matrix.scales.to(dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x, self.matrix.qweight, self.scales)
        return y if bias is None else y + bias


class Int4PackLinear(QuantLinear):
    """torch._weight_int4pack_mm (CUDA, bf16 activations; tinygemm layout, as gpt-fast and
    torchao pack it). Needs ``in`` a multiple of 32 and of the group, ``out`` a multiple of 8;
    KernelChooser checks its result against dequant on build (not run here: no GPU)."""

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

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)


def kernel_available(name: str) -> bool:
    if name == "fbgemm":
        return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
            torch.ops.quantized, "linear_dynamic"
        )
    if name == "int8pack":
        return hasattr(torch.ops.aten, "_weight_int8pack_mm")
    if name == "int4pack":
        return hasattr(torch.ops.aten, "_weight_int4pack_mm")
    return name == "dequant"


class KernelChooser:
    """Builds QuantLinear objects for one model: picks the first kernel of ``KERNEL_ORDER`` for
    the device that is available and agrees with ``dequant`` (checked once per kernel)."""

    def __init__(
        self, bits: int, dtype: torch.dtype, device: torch.device, force: str | None = None
    ) -> None:
        self.dtype = dtype
        self.device = device
        self.buffer = DequantBuffer(dtype, device)
        order = KERNEL_ORDER.get((device.type, bits), ("dequant",))
        force = force or os.environ.get(KERNEL_ENV) or None
        if force:
            order = (force,)
        self.candidates = [k for k in order if kernel_available(k)] or ["dequant"]
        self._verified: dict[str, bool] = {}
        self.kernels_used: dict[str, int] = {}  # kernel name -> matrices built with it

    def _note(self, ql: QuantLinear) -> QuantLinear:
        self.kernels_used[ql.kernel] = self.kernels_used.get(ql.kernel, 0) + 1
        return ql

    def dequant(self, matrix: QuantMatrix) -> DequantLinear:
        return self._note(DequantLinear(matrix.to(self.device), self.dtype, self.buffer))

    def build(self, matrix: QuantMatrix) -> QuantLinear:
        matrix = matrix.to(self.device)
        for name in self.candidates:
            if name == "dequant":
                break
            try:
                ql = _make_fast(name, matrix, self.dtype)
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                log.debug("kernel %s unusable for %s: %s", name, matrix.shape, exc)
                continue
            if name not in self._verified:
                self._verified[name] = _agrees(ql, matrix, self.dtype)
                if not self._verified[name]:
                    log.warning("quantized kernel %s disagrees with dequant: not used", name)
            if self._verified[name]:
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


class WeightQuantizer:
    """Quantizes a model's matrices while weights.load_weights reads them: each one comes from
    ``cached`` (arrays of a quant_cache entry) when present, else from the source, quantized on
    the CPU and recorded in ``new_entries`` for the caller to cache."""

    def __init__(
        self,
        spec: QuantSpec,
        chooser: KernelChooser,
        cached: dict[str, dict[str, np.ndarray]] | None = None,
    ) -> None:
        self.spec = spec
        self.chooser = chooser
        self.cached = cached or {}
        self.new_entries: dict[str, dict[str, np.ndarray]] = {}
        self.cache_hits = 0

    def quantized(
        self, name: str, shape: tuple[int, int], fetch, spec: QuantSpec | None = None
    ) -> QuantMatrix:
        """``fetch() -> np.ndarray [out, in]`` is called only on a cache miss."""
        from localinfer.errors import ModelFileError

        spec = spec or self.spec
        arrays = self.cached.get(name)
        if arrays is not None:
            try:
                qm = QuantMatrix.from_arrays(arrays)
                if qm.shape == shape and (qm.bits, qm.group_size) == (spec.bits, spec.group_size):
                    self.cache_hits += 1
                    return qm
            except (ValueError, KeyError):
                pass  # a stale or damaged entry: quantize again
        array = fetch()
        if tuple(array.shape) != shape:
            raise ModelFileError(name, f"shape {tuple(array.shape)}, expected {shape}")
        qm = quantize(torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)), spec)
        self.new_entries[name] = qm.to_arrays()
        return qm

    def matrix(self, name: str, shape: tuple[int, int], fetch) -> QuantLinear:
        return self.chooser.build(self.quantized(name, shape, fetch))

    def table(self, name: str, shape: tuple[int, int], fetch) -> DequantLinear:
        """A matrix whose rows are also gathered (the embedding): kept in the canonical layout."""
        return self.chooser.dequant(self.quantized(name, shape, fetch, self.spec.for_table()))

    def finish(self) -> None:
        self.cached = {}  # drop the memory maps once everything is copied
