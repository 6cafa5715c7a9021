"""What ``RunnerConfig.quant`` means to the MLX runner (plain Python: no mlx import here).

Three ways to hold the weights:

* ``native`` — keep the file's own types: GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and K-quant
  tensors stay quantized in MLX's affine groups of 32 (gguf_forms.py: exact where the blocks are
  groups of 32, requantized from sub-blocks of 16 for Q6_K / Q3_K / Q2_K); other quantized GGUF
  types (IQ*) are dequantized to the compute dtype; float files stay float.
* ``float`` — every tensor dequantized to the compute dtype (``quant="none"``).
* ``affine`` — quantized on load (backends/mlx/quant_affine.py), each matrix by its role's
  layout (localinfer/facts/quant.py ``mlx_recipe_layout``, the table the budget counts):
  ``int4`` is the mixed recipe shared with torch (the LM head — the table too when tied — at
  8 bits, layer matrices at 4 bits, groups of 32); ``int8`` / ``int4-g32`` / ``int8-g128`` ...
  quantize every matrix alike (group 64 unless named); ``mlx-4bit``, ``mlx-8bit-g32`` are
  accepted as the budget spells them. GGUF type names of other files map to the MLX layout with
  the same block size: ``Q4_0`` / ``Q4_1`` -> 4-bit group 32, ``Q8_0`` -> 8-bit group 32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localinfer.errors import UnsupportedModelError
from localinfer.facts.quant import (
    MLX_GROUPS,
    MLX_MIXED_NAMES,
    MLX_NAME_RE,
    MatrixQuant,
    mlx_recipe_layout,
)

GROUP_SIZES = MLX_GROUPS

_FLOAT_NAMES = {"none", "float", "fp32", "f32", "float32", "bf16", "bfloat16", "fp16", "f16"}
MIXED_LABEL = "int4"


@dataclass(slots=True, frozen=True)
class QuantSpec:
    mode: Literal["native", "float", "affine"]
    bits: int = 0  # affine: the layer matrices' width
    group_size: int = 0  # affine: the layer matrices' group
    mixed: bool = False  # affine: the mixed int4 recipe (roles differ) rather than uniform

    @property
    def label(self) -> str:
        """Short name for RunnerInfo.quant (native is labelled by the caller with the file type)."""
        if self.mode == "affine":
            return MIXED_LABEL if self.mixed else f"int{self.bits}-g{self.group_size}"
        return self.mode

    def layout(self, tied: bool) -> dict[str, MatrixQuant]:
        """Role -> MatrixQuant (affine only); ``tied``: the table is the LM head."""
        if self.mixed:
            layout = mlx_recipe_layout(MIXED_LABEL, tied)
            assert layout is not None
            return layout
        return mlx_recipe_layout(f"int{self.bits}-g{self.group_size}") or {}


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
    layout = mlx_recipe_layout(q)
    if layout is not None:
        layers = layout["gate_up"]
        return QuantSpec("affine", layers.bits, layers.group, q.lower() in MLX_MIXED_NAMES)
    m = MLX_NAME_RE.match(q.lower())
    if m:  # a width MLX has, in a group it has not
        raise UnsupportedModelError(
            f"MLX quantization group size must be one of {GROUP_SIZES}, got {m.group(2)}"
        )
    raise UnsupportedModelError(
        f"the mlx runner cannot quantize to {quant!r}; use int4 (the mixed recipe), int8 or "
        f"int4/int8 with -g32/-g64/-g128, Q4_0, Q4_1, Q8_0, none, or the file's own type "
        f"({file_quant})"
    )
