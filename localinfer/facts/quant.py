"""Weight quantizations by name, and the bits per weight each stores.

Weight figures are used only when no file header gives exact tensor bytes. Pure GGML block types
are exact (block bytes / block elements). Mixed GGUF file types (Q4_K_M keeps some tensors at
Q6_K, ...) are effective averages derived from llama.cpp's `llama-quantize` size table for
Llama-3-8B (file GiB x 2^30 x 8 / 8.03e9 params).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from localinfer.errors import InvalidParameterError
from localinfer.facts.arch import ArchSpec

# Weight quantizations a user may ask for, by canonical name -> bits per weight.
WEIGHT_BITS: dict[str, Fraction] = {
    "f32": Fraction(32),
    "f16": Fraction(16),
    "bf16": Fraction(16),
    # Pure GGML block types: (block bytes x 8) / block elements.
    "Q4_0": Fraction(18 * 8, 32),  # 4.5
    "Q4_1": Fraction(20 * 8, 32),  # 5.0
    "Q5_0": Fraction(22 * 8, 32),  # 5.5
    "Q5_1": Fraction(24 * 8, 32),  # 6.0
    "Q8_0": Fraction(34 * 8, 32),  # 8.5
    "Q6_K": Fraction(210 * 8, 256),  # 6.5625
    "IQ4_XS": Fraction(136 * 8, 256),  # 4.25
    # Mixed GGUF file types: effective averages (see module docstring).
    "Q2_K": Fraction("3.17"),
    "Q3_K_S": Fraction("3.65"),
    "Q3_K_M": Fraction("4.00"),
    "Q3_K_L": Fraction("4.31"),
    "Q4_K_S": Fraction("4.67"),
    "Q4_K_M": Fraction("4.89"),
    "Q5_K_S": Fraction("5.57"),
    "Q5_K_M": Fraction("5.70"),
    # torch weight-only quantization (backends/torch/quant_layout.py): int8 per output channel (a
    # float32 scale per row, under 1% for rows of 576+ inputs, not counted; measured +1.9% on
    # SmolLM2 with its embedding table at 8.5); int4 in groups (default 64, as MLX) with an
    # fp16 scale and minimum per group. Checked against the torch runner's measured weight bytes in
    # tests/test_quant_runner.py.
    "int8": Fraction(8),  # the embedding table in groups of 32 (Q8_0-like): +0.5 bit on it
    "int8-g32": Fraction(8) + Fraction(16, 32),  # 8.5
    "int8-g64": Fraction(8) + Fraction(16, 64),  # 8.25
    "int8-g128": Fraction(8) + Fraction(16, 128),  # 8.125
    # int4 on torch is the mixed recipe (MIXED_INT4 below), whose bytes the budget counts matrix
    # by matrix (torch_quant_bytes); this figure (group 64) is MLX's int4 and the fallback.
    "int4": Fraction(4) + Fraction(32, 64),  # 4.5
    "int4-g64": Fraction(4) + Fraction(32, 64),  # 4.5
    "int4-g32": Fraction(4) + Fraction(32, 32),  # 5.0
    "int4-g128": Fraction(4) + Fraction(32, 128),  # 4.25 (rows padded to whole groups)
    # MLX affine quantization: an fp16 scale and bias per group.
    "mlx-4bit": Fraction(4) + Fraction(32, 64),  # 4.5 (group 64)
    "mlx-4bit-g32": Fraction(4) + Fraction(32, 32),  # 5.0
    "mlx-8bit": Fraction(8) + Fraction(32, 64),  # 8.5 (group 64)
}

# Spellings people use -> canonical name. "none" is handled by the caller (keep the native dtype).
QUANT_ALIASES = {
    "fp32": "f32",
    "float32": "f32",
    "fp16": "f16",
    "float16": "f16",
    "bfloat16": "bf16",
    "mlx-4bit-g64": "mlx-4bit",
    "mlx-8bit-g64": "mlx-8bit",
    "q4": "int4",
    "q8": "int8",
}


def normalize_quant(name: str) -> str:
    """Canonical name of a weight quantization; raises InvalidParameterError if unknown."""
    key = name.strip()
    low = key.lower()
    if low in QUANT_ALIASES:
        return QUANT_ALIASES[low]
    for canonical in WEIGHT_BITS:
        if canonical.lower() == low:
            return canonical
    known = ", ".join(["none", *WEIGHT_BITS])
    raise InvalidParameterError(f"unknown quantization '{name}' (known: {known})")


def weight_bits(quant: str) -> Fraction:
    return WEIGHT_BITS[normalize_quant(quant)]


def bytes_for_params(params: int, quant: str) -> int:
    """params x bits-per-weight / 8, rounded up to a whole byte."""
    bits = weight_bits(quant)
    total = Fraction(params) * bits / 8
    return -(-total.numerator // total.denominator)


# -- The torch runner's recipes: which bits each matrix role gets -------------------------------
# Torch-free, so the budget reads the same table the runner quantizes by
# (backends/torch/quant_recipe.py builds its QuantRecipe objects from it).

TORCH_ROLES = ("embed", "head", "qkv", "o", "gate_up", "down")
TORCH_INT_GROUPS = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class MatrixQuant:
    """How one matrix is stored (backends/torch/quant_layout.py): int8 per row (group 0, a float32
    scale per row) or in groups (float16 scale), int4 in groups (float16 scale and minimum);
    rows padded to whole groups."""

    bits: int  # 8 or 4
    group: int  # inputs per group; 0: one scale per row (int8 only)

    def nbytes(self, rows: int, cols: int) -> int:
        if not self.group:
            return rows * cols + 4 * rows
        groups = -(-cols // self.group)
        codes = rows * groups * self.group * self.bits // 8
        return codes + rows * groups * (2 if self.bits == 8 else 4)


Q8_TABLE = MatrixQuant(8, 32)  # a GGUF Q8_0 layout: the embedding table of int8 and int4
# The mixed int4 recipe: the LM head at 8 bits (and so the embedding table where it is the head:
# tied), the layer matrices at 4 bits in groups of 32. An untied table only feeds the first layer:
# 4 bits, as Q4_K_M does. Groups of 32 because a Q4_1 or Q4_0 source's blocks are 32 wide: g32
# lands on the same grid and loses nothing more (perplexity +0.0% against fp32 on the embedded
# model, where groups of 64 lost a third; docs/measurements.md, "The int4 recipe"). Bits per
# weight: 5.0 on the layers, 8.5 on the head; SmolLM2-135M 96.6 MB (5.74 bpw), Qwen3-8B 5.27.
MIXED_INT4: dict[str, MatrixQuant] = {
    "embed": MatrixQuant(4, 32),
    "head": Q8_TABLE,
    "qkv": MatrixQuant(4, 32),
    "o": MatrixQuant(4, 32),
    "gate_up": MatrixQuant(4, 32),
    "down": MatrixQuant(4, 32),
}
_TORCH_RE = re.compile(r"^int(4|8)(?:[-_]?g(\d+))?$")


def torch_recipe_layout(quant: str, tied: bool = True) -> dict[str, MatrixQuant] | None:
    """Role -> MatrixQuant of the torch runner's ``quant`` (``int4``: the mixed recipe, whose
    table is held as the head is where ``tied``; ``int8``: per-row layers, the table in groups of
    32; ``int4-gN`` / ``int8-gN``: every matrix alike); None for a name the torch runner does not
    quantize to."""
    m = _TORCH_RE.match(quant.strip().lower())
    if not m:
        return None
    bits, group = int(m.group(1)), int(m.group(2) or 0)
    if bits == 4 and not group:
        return mixed_int4_layout(tied)
    if group and group not in TORCH_INT_GROUPS:
        return None
    one = MatrixQuant(bits, group)
    layout = dict.fromkeys(TORCH_ROLES, one)
    if one == MatrixQuant(8, 0):
        layout["embed"] = Q8_TABLE
    return layout


def torch_quant_bytes(arch: ArchSpec, quant: str, float_bytes: int = 4) -> int | None:
    """Exactly the bytes the torch runner holds for ``arch`` quantized as ``quant``: every matrix
    in its role's layout, the tied LM head shared with the table, norms float32, q|k|v biases
    in the compute dtype (``float_bytes``). None where the recipe or the architecture is not
    one the torch runner quantizes (MoE, MLA)."""
    layout = torch_recipe_layout(quant, arch.tied_embeddings)
    if layout is None or arch.is_moe or arch.is_mla:
        return None
    h, f, hd = arch.hidden_size, arch.ffn_size, arch.head_dim
    q, kv = arch.n_heads * hd, arch.n_kv_heads * hd
    layer = (
        layout["qkv"].nbytes(q + 2 * kv, h)
        + layout["o"].nbytes(h, q)
        + layout["gate_up"].nbytes(2 * f, h)
        + layout["down"].nbytes(h, f)
        + 4 * (2 * h + (2 * hd if arch.qk_norm else 0))
        + (float_bytes * (q + 2 * kv) if arch.attention_bias else 0)
    )
    total = arch.n_layers * layer + layout["embed"].nbytes(arch.vocab_size, h) + 4 * h
    if not arch.tied_embeddings:
        total += layout["head"].nbytes(arch.vocab_size, h)
    return total


# -- The MLX runner's recipes: the same role table, MLX's affine storage ------------------------
# MLX stores every quantized matrix as codes plus a 16-bit scale and bias per group (float16
# beside float32 activations, else the compute dtype): 4-bit g32 is 5.0 bits per weight, 8-bit
# g32 9.0. ``int4`` is MIXED_INT4 itself; the quantizer is min/max as torch's int4 is
# (backends/mlx/quant_affine.py), so both backends hold the same 4-bit codes for the layers.

MLX_GROUPS = (32, 64, 128)
MLX_DEFAULT_GROUP = 64  # of the uniform names (int8, int4-gN's default, mlx-4bit, mlx-8bit)
MLX_GGUF_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # GGUF names -> the same block size (32)
MLX_MIXED_NAMES = ("int4", "q4")
MLX_NAME_RE = re.compile(r"^(?:int|mlx-|q)?(4|8)(?:bit|b)?(?:[-_:]?g(\d+))?$")


def mixed_int4_layout(tied: bool) -> dict[str, MatrixQuant]:
    """MIXED_INT4, whose table is held as the head where the model is ``tied``."""
    mixed = dict(MIXED_INT4)
    if tied:
        mixed["embed"] = mixed["head"]
    return mixed


def mlx_recipe_layout(quant: str, tied: bool = True) -> dict[str, MatrixQuant] | None:
    """Role -> MatrixQuant of the MLX runner's affine ``quant``: ``int4`` (``q4``) the mixed
    recipe shared with torch; ``int8``, ``int4-gN``, ``mlx-4bit(-gN)``, ``mlx-8bit`` every
    matrix alike (group 64 unless named); ``Q4_0`` / ``Q4_1`` / ``Q8_0`` every matrix at that
    width in groups of 32. None for a name MLX does not quantize to (a bad group included)."""
    name = quant.strip()
    if name.upper() in MLX_GGUF_BITS:
        return dict.fromkeys(TORCH_ROLES, MatrixQuant(MLX_GGUF_BITS[name.upper()], 32))
    m = MLX_NAME_RE.match(name.lower())
    if not m:
        return None
    if name.lower() in MLX_MIXED_NAMES:
        return mixed_int4_layout(tied)
    group = int(m.group(2) or MLX_DEFAULT_GROUP)
    if group not in MLX_GROUPS:
        return None
    return dict.fromkeys(TORCH_ROLES, MatrixQuant(int(m.group(1)), group))


def mlx_matrix_bytes(mq: MatrixQuant, rows: int, cols: int, float_bytes: int) -> int:
    """Bytes MLX holds for one ``[rows, cols]`` matrix stored as ``mq``: packed codes and a
    16-bit scale and bias per group; a matrix whose width is not a whole number of groups stays
    in the compute dtype (as backends/mlx/weights.py leaves it)."""
    if cols % mq.group:
        return rows * cols * float_bytes
    return rows * cols * mq.bits // 8 + rows * (cols // mq.group) * 2 * 2


def mlx_quant_bytes(arch: ArchSpec, quant: str, float_bytes: int = 4) -> int | None:
    """Exactly the bytes the MLX runner holds for ``arch`` quantized on load as ``quant``: every
    matrix in its role's layout, the tied head shared with the table, norms and q|k|v biases in
    the compute dtype (``float_bytes``). None for other names and for MoE / MLA models."""
    layout = mlx_recipe_layout(quant, arch.tied_embeddings)
    if layout is None or arch.is_moe or arch.is_mla:
        return None
    h, f, hd = arch.hidden_size, arch.ffn_size, arch.head_dim
    q, kv = arch.n_heads * hd, arch.n_kv_heads * hd

    def mat(role: str, rows: int, cols: int) -> int:
        return mlx_matrix_bytes(layout[role], rows, cols, float_bytes)

    layer = (
        mat("qkv", q + 2 * kv, h)
        + mat("o", h, q)
        + mat("gate_up", 2 * f, h)
        + mat("down", h, f)
        + float_bytes * (2 * h + (2 * hd if arch.qk_norm else 0))
        + (float_bytes * (q + 2 * kv) if arch.attention_bias else 0)
    )
    total = arch.n_layers * layer + mat("embed", arch.vocab_size, h) + float_bytes * h
    if not arch.tied_embeddings:
        total += mat("head", arch.vocab_size, h)
    return total
