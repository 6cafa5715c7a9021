"""What ``RunnerConfig.quant`` means to the MLX runner (plain Python: no mlx import here).

Three ways to hold the weights:

* ``native`` — keep the file's own types: GGUF Q4_0 / Q4_1 / Q8_0 tensors stay quantized
  (MLX's affine format is exactly those blocks: group 32, one scale and one offset per group);
  other quantized GGUF types are dequantized to the compute dtype; float files stay float.
* ``float`` — every tensor dequantized to the compute dtype (``quant="none"``).
* ``affine`` — quantized on load with ``mx.quantize`` (``int4`` / ``int8``, group 64 by default;
  ``int4-g32``, ``int8-g128`` ... pick the group; ``mlx-4bit``, ``mlx-8bit-g32`` are accepted as
  the budget spells them). GGUF type names of other files map to the MLX layout with the same
  block size: ``Q4_0`` / ``Q4_1`` -> 4-bit group 32, ``Q8_0`` -> 8-bit group 32.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from localinfer.errors import UnsupportedModelError

# GGUF block types MLX's GGUF reader keeps quantized: type -> bits (group size is always 32).
NATIVE_GGUF_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
GGUF_GROUP_SIZE = 32
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64

_FLOAT_NAMES = {"none", "float", "fp32", "f32", "float32", "bf16", "bfloat16", "fp16", "f16"}
_AFFINE_RE = re.compile(r"^(?:int|mlx-|q)?(4|8)(?:bit|b)?(?:[-_:]?g(\d+))?$")


@dataclass(slots=True, frozen=True)
class QuantSpec:
    mode: Literal["native", "float", "affine"]
    bits: int = 0  # affine only
    group_size: int = 0  # affine only

    @property
    def label(self) -> str:
        """Short name for RunnerInfo.quant (native is labelled by the caller with the file type)."""
        if self.mode == "affine":
            return f"int{self.bits}-g{self.group_size}"
        return self.mode


def parse_quant(quant: str | None, file_quant: str) -> QuantSpec:
    """``RunnerConfig.quant`` (None: the file's own) -> QuantSpec.

    Raises UnsupportedModelError for a name the runner cannot produce."""
    if quant is None:
        return QuantSpec("native")
    q = quant.strip()
    if q.upper() == file_quant.upper():
        return QuantSpec("native")
    if q.lower() in _FLOAT_NAMES:
        return QuantSpec("float")
    if q.upper() in NATIVE_GGUF_BITS:
        return QuantSpec("affine", NATIVE_GGUF_BITS[q.upper()], GGUF_GROUP_SIZE)
    m = _AFFINE_RE.match(q.lower())
    if m:
        bits = int(m.group(1))
        group = int(m.group(2)) if m.group(2) else DEFAULT_GROUP_SIZE
        if group not in GROUP_SIZES:
            raise UnsupportedModelError(
                f"MLX quantization group size must be one of {GROUP_SIZES}, got {group}"
            )
        return QuantSpec("affine", bits, group)
    raise UnsupportedModelError(
        f"the mlx runner cannot quantize to {quant!r}; use int4, int8 (optionally "
        f"-g32/-g64/-g128), Q4_0, Q4_1, Q8_0, none, or the file's own type ({file_quant})"
    )
