"""How the MLX runner holds each GGUF tensor type, and the bytes that takes (plain Python, no mlx:
the budget's profile reads it, the runner's conversion (gguf_blocks.py, native.py) follows it).

MLX runs one quantized form, affine groups (``w = scale * q + bias`` per group of 32/64/128 inputs,
2 to 8 bits, a 16-bit scale and bias per group), so each GGUF block type maps to the MLX form
that holds its blocks best:

* exact: the stored codes are kept and each block's scale/offset becomes the group's scale/bias
  (rounded to 16 bits). Q4_0/Q4_1/Q8_0 and Q5_0/Q5_1 are blocks of 32 already; Q4_K/Q5_K are
  super-blocks of 8 sub-blocks of 32 with ``w = d * sc_j * q - dmin * m_j``, so a sub-block is a
  group with scale ``d * sc_j`` and bias ``-dmin * m_j``.
* requantized: Q6_K, Q3_K and Q2_K scale sub-blocks of 16, a group MLX does not have; their
  dequantized values are quantized again, min/max in groups of 32 (gguf_blocks.py). Two
  sub-blocks with different scales then share one grid, so the width is the narrowest that adds
  under ~7% to the error variance the type already has against the float weights (measured on
  Gaussian weights quantized by llama.cpp): Q6_K at 8 bits adds 7% (6 bits: 110%), Q3_K at 5
  bits 6% (4 bits: 29%), Q2_K at 4 bits 5%.

Any other type (IQ*, TQ*, float) is held as a float matrix in the compute dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from localinfer.facts.quant import MatrixQuant, mlx_matrix_bytes

GROUP = 32
# GGUF type -> (MLX form, kept exactly). Exact forms keep every stored code.
GGUF_FORMS: dict[str, tuple[MatrixQuant, bool]] = {
    "Q4_0": (MatrixQuant(4, GROUP), True),
    "Q4_1": (MatrixQuant(4, GROUP), True),
    "Q5_0": (MatrixQuant(5, GROUP), True),
    "Q5_1": (MatrixQuant(5, GROUP), True),
    "Q8_0": (MatrixQuant(8, GROUP), True),
    "Q4_K": (MatrixQuant(4, GROUP), True),
    "Q5_K": (MatrixQuant(5, GROUP), True),
    "Q6_K": (MatrixQuant(8, GROUP), False),
    "Q3_K": (MatrixQuant(5, GROUP), False),
    "Q2_K": (MatrixQuant(4, GROUP), False),
}
# Tensors the loader folds into the model's config: the runner holds no array for them.
CONFIG_ONLY = ("rope_freqs.weight",)
FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def held_form(type_name: str, shape: tuple[int, ...]) -> MatrixQuant | None:
    """The MLX form of a ``shape`` (numpy order: rows, row length) tensor stored as
    ``type_name``; None where it is held as floats (a vector, a type MLX has no form for)."""
    entry = GGUF_FORMS.get(type_name)
    if entry is None or len(shape) != 2 or shape[1] % entry[0].group:
        return None
    return entry[0]


def is_exact(type_name: str) -> bool:
    return type_name in GGUF_FORMS and GGUF_FORMS[type_name][1]


def held_tensor_bytes(type_name: str, shape: tuple[int, ...], float_bytes: int) -> int:
    """Bytes the runner holds for one tensor: its MLX form's codes, scales and biases, or every
    element in the compute dtype (``float_bytes``)."""
    form = held_form(type_name, shape)
    if form is None:
        return math.prod(shape) * float_bytes
    rows, cols = shape
    return mlx_matrix_bytes(form, rows, cols, float_bytes)


def describe_forms(type_names: Iterable[str], compute_dtype: str) -> str:
    """One line on the forms held: "affine groups of 32: Q4_K 4-bit, Q6_K 8-bit (requantized),
    float16 scales; other tensors float32"."""
    parts = []
    for t in sorted(set(type_names) & set(GGUF_FORMS)):
        form, exact = GGUF_FORMS[t]
        parts.append(f"{t} {form.bits}-bit" + ("" if exact else " (requantized)"))
    scales = "float16" if compute_dtype == "float32" else compute_dtype
    held = f"affine groups of {GROUP}: " + ", ".join(parts) if parts else "no quantized form"
    return f"{held}, {scales} scales; other tensors {compute_dtype}"
