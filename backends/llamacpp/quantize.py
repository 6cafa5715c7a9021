"""Write a quantized copy of a GGUF with llama.cpp's own ``llama_model_quantize``.

llama.cpp's quantize parameters have no progress callback, but it logs one line per tensor
(``[  12/ 272] blk.1.attn_q.weight - [...], type = f16, ...``); :func:`quantize_gguf` listens to
the log and turns those lines into :class:`QuantizeProgress` events.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from localinfer.backends.llamacpp import native
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.errors import InvalidParameterError, ModelFileError
from localinfer.facts.quantize_events import QuantizeProgress, QuantizeResult

# --to name -> (llama_ftype constant name in llama_cpp, GGUF type label).
TARGETS: dict[str, tuple[str, str]] = {
    "q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", "Q8_0"),
    "q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_0"),
    "q4_k_m": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_K_M"),
    # Friendly names: int8 keeps 8.5 bits/weight; int4 is the better-quality 4-bit K-quant mix.
    "int8": ("LLAMA_FTYPE_MOSTLY_Q8_0", "Q8_0"),
    "int4": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_K_M"),
}

_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_SOURCE_SUFFIX = re.compile(r"[._-](f16|bf16|f32|fp16|fp32)$", re.IGNORECASE)


def target_label(target: str) -> str:
    """``"int4"`` -> ``"Q4_K_M"``; InvalidParameterError for an unknown target."""
    key = target.lower()
    if key not in TARGETS:
        raise InvalidParameterError(
            f"unknown quantization '{target}'; choose one of: {', '.join(TARGETS)}"
        )
    return TARGETS[key][1]


def requantize_advice(source: Path, quant: str, file_quant: str | None) -> str:
    """What to do when the llamacpp backend is asked for ``quant`` but the file stores
    ``file_quant``: the quantize command that writes it, where llama.cpp can write it."""
    if quant.lower() not in TARGETS:
        writes = f"llama.cpp writes only {', '.join(TARGETS)} (localinfer quantize)"
        if quant.lower().startswith("mlx"):
            return f"{writes}; {quant} is the MLX backend's (--backend mlx)"
        # Another GGUF type (Q5_K_M, IQ3_XXS ...): a repo that ships it has it as a file.
        return f"{writes}; for a repo's {quant} file: localinfer pull ORG/REPO:{quant}"
    command = f"localinfer quantize {source} --to {quant}"
    if (file_quant or "").upper() not in ("F16", "BF16", "F32"):
        command += " --allow-requantize"  # from an already quantized file: worse than F16's
    return f"write a new file: {command}"


def default_output(source: Path, target: str) -> Path:
    """``model-F16.gguf`` -> ``model-Q8_0.gguf`` beside the source."""
    stem = _SOURCE_SUFFIX.sub("", source.stem)
    return source.with_name(f"{stem}-{target_label(target)}.gguf")


def _check_source(source: Path) -> None:
    if source.is_dir():
        raise ModelFileError(source, "is a directory; quantize reads one GGUF file")
    if not source.is_file():
        raise ModelFileError(source, "file not found")
    with source.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(source, "not a GGUF file (bad magic); quantize reads GGUF files")


def quantize_gguf(
    source: str | Path,
    output: str | Path | None,
    target: str,
    *,
    threads: int | None = None,
    allow_requantize: bool = False,
    on_progress: Callable[[QuantizeProgress], None] | None = None,
) -> QuantizeResult:
    """Quantize ``source`` (F32/F16/BF16 GGUF) to ``target``; returns what was written.

    The file is written under a temporary name and renamed at the end, so a failure never leaves
    a half-written GGUF at ``output``.
    """
    source = Path(source)
    label = target_label(target)
    out = Path(output) if output is not None else default_output(source, target)
    _check_source(source)
    if out.resolve() == source.resolve():
        raise InvalidParameterError("the output must be a different file from the source")
    llama = native.lib()
    params = llama.llama_model_quantize_default_params()
    params.nthread = threads or physical_cores()
    params.ftype = getattr(llama, TARGETS[target.lower()][0])
    params.allow_requantize = allow_requantize

    capture = native.LogCapture()

    def listener(level: int, text: str) -> None:
        capture(level, text)
        match = _TENSOR_LINE.search(text)
        if match and on_progress is not None:
            on_progress(QuantizeProgress(int(match[1]), int(match[2]), match[3]))

    partial = out.with_name(f".{out.name}.partial")
    start = time.perf_counter()
    try:
        with native.listen(listener):
            rc = llama.llama_model_quantize(
                str(source).encode(), str(partial).encode(), ctypes.byref(params)
            )
        if rc != 0:
            errors = capture.errors()
            reason = errors[0] if errors else f"llama_model_quantize returned {rc}"
            if "requantiz" in reason:
                reason += " (quantize from an F16/BF16/F32 GGUF, or pass --allow-requantize)"
            raise ModelFileError(source, f"could not quantize to {label}: {reason}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return QuantizeResult(
        source=source,
        output=out,
        quant=label,
        source_bytes=source.stat().st_size,
        output_bytes=out.stat().st_size,
        seconds=time.perf_counter() - start,
    )


def quant_matches(asked: str, file_quant: str) -> bool:
    """Whether a GGUF stored as ``file_quant`` already is the ``asked`` quantization.

    int8 is any Q8 type, int4 any 4-bit one; K-quant mixes compare without their _S/_M/_L size
    suffix (a loader may report the file type "Q4_K_M" or the dominant tensor type "Q4_K").
    """
    a, f = asked.upper(), file_quant.upper()
    if a == "INT8":
        return f.startswith("Q8")
    if a == "INT4":
        return f.startswith(("Q4", "IQ4"))
    return re.sub(r"_[SML]$", "", a) == re.sub(r"_[SML]$", "", f)
