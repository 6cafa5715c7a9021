"""Weight quantizations by name, and the bits per weight each stores.

Weight figures are used only when no file header gives exact tensor bytes. Pure GGML block types
are exact (block bytes / block elements). Mixed GGUF file types (Q4_K_M keeps some tensors at
Q6_K, ...) are effective averages derived from llama.cpp's `llama-quantize` size table for
Llama-3-8B (file GiB x 2^30 x 8 / 8.03e9 params).
"""

from __future__ import annotations

from fractions import Fraction

from localinfer.errors import InvalidParameterError

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
    "int4": Fraction(4) + Fraction(32, 64),  # 4.5 (group 64)
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
    "int4-g64": "int4",
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
