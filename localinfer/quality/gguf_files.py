"""llama.cpp's candidates for ``localinfer quality``: the model re-quantized by
`localinfer quantize` into the quant cache, made once per (file, type) and reused after."""

from __future__ import annotations

from pathlib import Path

from localinfer.errors import InvalidParameterError
from localinfer.loading.loader import load_model
from localinfer.loading.model import LoadedModel
from localinfer.quant_cache import QuantCache

# What `localinfer quantize --to` takes, by the GGUF type it writes (commands/quantize.py).
GGUF_TARGETS = {
    "int8": "Q8_0",
    "int4": "Q4_K_M",
    "q8_0": "Q8_0",
    "q4_0": "Q4_0",
    "q4_k_m": "Q4_K_M",
}


def gguf_type(quant: str) -> str:
    """``int8`` / ``q8_0`` -> ``Q8_0`` ...; InvalidParameterError for a type quantize cannot
    write."""
    label = GGUF_TARGETS.get(quant.strip().lower())
    if label is None:
        known = ", ".join(sorted(set(GGUF_TARGETS.values())))
        raise InvalidParameterError(f"--quant: llama.cpp quality takes {known}, not {quant!r}")
    return label


def cached_gguf_path(model_path: Path, label: str, cache: QuantCache | None = None) -> Path:
    """Where the quant cache keeps ``model_path`` quantized to ``label`` (keyed by the source
    file's identity, as the torch runner's entries are)."""
    cache = cache or QuantCache()
    folder = cache.entry_dir(model_path, f"llamacpp-{label}")
    return folder / f"{model_path.stem}-{label}.gguf"


def quantized_model(
    model: LoadedModel, quant: str, threads: int | None = None, cache: QuantCache | None = None
) -> LoadedModel:
    """``model`` as a GGUF of ``quant``'s type: the file itself when it already is one, else the
    quant cache's copy, written through `localinfer quantize` when missing. A source already
    quantized (the embedded Q4_1 model) is re-quantized, as torch's int8/int4 are from it."""
    label = gguf_type(quant)
    source = Path(model.path)
    if model.file_quant == label:
        return model
    out = cached_gguf_path(source, label, cache)
    if not out.is_file():
        from localinfer.gguf_quantize import quantize_gguf

        out.parent.mkdir(parents=True, exist_ok=True)
        # quantize_gguf writes a temporary file and renames it: never a half-written cache entry.
        quantize_gguf(source, out, label.lower(), threads=threads, allow_requantize=True)
    return load_model(out, f"{model.name}-{label}")
