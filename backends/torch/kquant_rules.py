"""How the torch runner holds a GGUF's block matrices quantized, converted from the stored bytes,
and the bytes of it: framework-free, so the budget (profile.py) counts by the rules the runner
loads by (kquant_form.py, kquant_convert.py). ``holds_converted`` decides which files: a K-quant
file (llama.cpp's Q2_K ... Q6_K mixes) always; a Q8_0 / Q4_0 / Q4_1 file wherever torch's native
CPU kernels do not keep its blocks as stored (CUDA; a CPU in bf16/fp16, or where they lost).

Such a file's matrices are held quantized, each stored type in one form:

* ``int4``: Q4_K, Q4_0, Q4_1, converted from the stored codes with the same arithmetic: a Q4_K
  sub-block is 32 codes with one scale ``d * sc`` and one offset ``-dmin * m``, so it is a
  group of 32 as it stands. 4 bits a weight plus a 16-bit scale and zero per group: 5.0 bits
  (Q4_K stores 4.5).
* ``int8``: every other block type (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q2_K, Q3_K, IQ*), one scale
  per row (``row max / 127``) over the stored values dequantized: the error against them is at
  most half that step. Per row because torch's int8 kernel (``_weight_int8pack_mm``) takes
  nothing finer.
* ``dense``: a matrix stored as floats (F32, F16, BF16), in the compute dtype.

A file is a K-quant file when a matrix is stored as Q2_K, Q3_K, Q4_K or Q5_K, or Q6_K holds
the most matrix bytes (a Q6_K file): a Q4_0 or Q5_0 file whose LM head llama.cpp keeps at Q6_K
is not one. A Q8_0 / Q4_0 / Q4_1 file (the type holding the most matrix bytes) is converted by
the same rules (its Q6_K head int8) where its blocks are not kept; a Q5_0 / Q5_1 / IQ file keeps
the runner's other rules (dequantized into the compute dtype).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from localinfer.facts.held_weights import StoredTensor
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES as NATIVE_BLOCK_TYPES

GROUP = 32  # inputs per int4 group: a Q4_K sub-block, a Q4_0 / Q4_1 block
INT4_TYPES = ("Q4_K", "Q4_0", "Q4_1")
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
_MARKS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K")  # a matrix in one of these makes a K-quant file
EMBED = "token_embd.weight"
HEAD = "output.weight"
# Tensors the runner reads into its config, never holds.
_NOT_HELD = ("rope_freqs.weight",)
# The torch CPU int4 kernel packs only a multiple of 16 rows, CUDA's of 8 (quant_int4pack.py).
_INT4_ROWS = {"cpu": 16, "cuda": 8}


def _totals(matrices: Iterable[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for type_name, nbytes in matrices:
        totals[type_name] = totals.get(type_name, 0) + nbytes
    return totals


def _most(totals: dict[str, int]) -> str | None:
    """The type holding the most matrix bytes (the file's own type, as its name says)."""
    return max(totals, key=totals.__getitem__) if totals else None


def is_kquant_file(matrices: Iterable[tuple[str, int]]) -> bool:
    """``matrices``: (GGUF type, stored bytes) of every matrix of the file."""
    totals = _totals(matrices)
    return any(t in totals for t in _MARKS) or _most(totals) == "Q6_K"


def holds_converted(matrices: Iterable[tuple[str, int]], blocks_kept: bool) -> bool:
    """Whether the runner, loading a GGUF's own quantization, holds its matrices in the forms
    ``held_form`` names: a K-quant file always; a file mostly stored as Q8_0 / Q4_0 / Q4_1
    unless ``blocks_kept`` (torch's native CPU kernels keep those blocks as stored: a CPU, in
    float32, where they measured faster). Else every matrix is dequantized into the compute
    dtype. The one rule the runner (weight_plan.py) and the budget (profile.py) both follow; a
    float name asked (``--quant f32|bf16|none``) is not the file's own and gets the float copy."""
    totals = _totals(matrices)
    if is_kquant_file(totals.items()):
        return True
    return not blocks_kept and _most(totals) in NATIVE_BLOCK_TYPES


def held_form(type_name: str) -> str:
    """``int4``, ``int8`` or ``dense``: the form a matrix stored as ``type_name`` is held in."""
    if type_name in INT4_TYPES:
        return "int4"
    return "dense" if type_name in FLOAT_TYPES else "int8"


def int8_scale_bytes(device_kind: str, float_bytes: int) -> int:
    """Bytes of an int8 row's scale, in the dtype the kernel multiplies in: the compute dtype
    on CUDA, bf16 on a CPU (quant_int8pack.py) and on a planned machine of any kind."""
    return float_bytes if device_kind == "cuda" else 2


def form_bytes(form: str, rows: int, cols: int, float_bytes: int, scale_bytes: int) -> int:
    """Bytes of one ``[rows, cols]`` matrix held as ``form``."""
    if form == "int4":
        return rows * cols // 2 + rows * (cols // GROUP) * 4
    if form == "int8":
        return rows * cols + rows * scale_bytes
    return rows * cols * float_bytes


def int4_packs(rows: int, device_kind: str) -> bool:
    """Whether torch's int4 kernel takes a matrix of ``rows`` rows on this device kind."""
    return rows % _INT4_ROWS.get(device_kind, 16) == 0


def held_bytes(tensors: Sequence[StoredTensor], float_bytes: int, device_kind: str) -> int:
    """What the runner holds for a converted file's ``tensors``: each matrix in its type's form,
    norms float32, biases in the compute dtype (``float_bytes``). An int4 embedding table that
    is also the LM head (no ``output.weight``) is held twice: codes for the row lookup, and
    the packed copy the head multiplies by."""
    scale = int8_scale_bytes(device_kind, float_bytes)
    tied = not any(t.name == HEAD for t in tensors)
    total = 0
    for t in tensors:
        if t.name in _NOT_HELD:
            continue
        if len(t.shape) != 2:
            total += t.n_elements * (float_bytes if t.name.endswith(".bias") else 4)
            continue
        rows, cols = t.shape
        form = held_form(t.type_name)
        size = form_bytes(form, rows, cols, float_bytes, scale)
        if t.name == EMBED and tied and form == "int4" and int4_packs(rows, device_kind):
            size *= 2
        total += size
    return total


def held_source(tensors: Sequence[StoredTensor]) -> str:
    """One line naming the form each stored matrix type takes."""
    by_form: dict[str, list[str]] = {}
    for t in tensors:
        if len(t.shape) == 2 and t.name not in _NOT_HELD:
            names = by_form.setdefault(held_form(t.type_name), [])
            if t.type_name not in names:
                names.append(t.type_name)
    words = {
        "int4": "int4 groups of 32, bf16 scales",
        "int8": "int8 per row",
        "dense": "the compute dtype",
    }
    parts = [f"{'/'.join(sorted(by_form[f]))} as {words[f]}" for f in words if f in by_form]
    return "torch: " + ", ".join(parts) + " (GGUF header)"
