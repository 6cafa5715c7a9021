"""Weight-only quantization for the torch runner: the canonical layout, computed once, cached on
disk (localinfer/quant_cache.py) and multiplied by one of the kernels (quant_kernels.py).

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localinfer.errors import UnsupportedModelError

# Bump when the canonical layout or the rounding changes: the disk cache keys on it.
QUANT_LAYOUT_VERSION = 1
GROUP_SIZES = (32, 64, 128)
INT4_GROUP_SIZES = GROUP_SIZES
EMBED_INT8_GROUP = 32
# 64, like MLX's default: 4.5 bits/weight (budget "int4"). 128 (4.25) pads rows whose width is
# not a multiple of 128 (SmolLM2's 576 -> 640, +11%) and loses more; 32 (5.0) loses least.
DEFAULT_INT4_GROUP = 64

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
