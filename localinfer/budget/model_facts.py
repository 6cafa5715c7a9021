"""What the budget knows about a model before loading it: architecture, parameter count and, where
a file is on disk, the exact weight bytes from its header."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.budget.file_headers import (
    WeightsHeader,
    gguf_weights_header,
    read_gguf_header,
    read_safetensors_headers,
    safetensors_dtype_bytes,
)
from localinfer.facts.arch import ArchSpec
from localinfer.facts.hf_config import arch_from_hf_config, read_json_object
from localinfer.facts.quant import bytes_for_params, weight_bits
from localinfer.resolve import ResolvedModel

if TYPE_CHECKING:
    from localinfer.loading.model import LoadedModel


@dataclass(frozen=True, slots=True)
class ModelFacts:
    name: str
    arch: ArchSpec
    params: int
    native_quant: str  # the quantization the weights come in when none is asked for
    header: WeightsHeader | None  # exact figures from the file on disk
    resolved: ResolvedModel
    remote_bytes: int | None = None  # safetensors bytes reported by the Hub (--online)

    def weights(self, quant: str) -> tuple[int, str]:
        """(bytes, how they were found) for the weights stored as `quant`."""
        if self.header is not None and quant == self.header.quant:
            kind = "GGUF header" if self.resolved.kind == "gguf" else "safetensors headers"
            return self.header.weight_bytes, kind
        if self.remote_bytes is not None and quant == "bf16":
            return self.remote_bytes, "Hub safetensors metadata"
        bits = float(weight_bits(quant))
        return bytes_for_params(self.params, quant), f"{self.params:,} params x {bits:g} bits"


def model_facts(resolved: ResolvedModel, online: bool = False) -> ModelFacts:
    if resolved.kind == "gguf":
        assert resolved.path is not None
        return _gguf_facts(_gguf_header(str(resolved.path), *_stamp(resolved.path)), resolved)
    if resolved.kind == "hf_dir":
        assert resolved.path is not None
        config_path = resolved.path / "config.json"
        arch = arch_from_hf_config(read_json_object(config_path), config_path)
        header = read_safetensors_headers(resolved.path)
        return ModelFacts(resolved.name, arch, header.params, header.quant, header, resolved)
    entry = resolved.entry
    assert entry is not None, "a catalog_remote model always has its catalog entry"
    quant = resolved.quant or entry.default_quant
    remote = _hub_safetensors_bytes(entry.source) if online else None
    return ModelFacts(entry.name, entry.arch, entry.params, quant, None, resolved, remote)


def facts_of_loaded(model: LoadedModel) -> ModelFacts:
    """The facts of a model the session has open (headers and tokenizer read): its GGUF header
    comes from the loader's open file, so the file is neither resolved nor parsed twice."""
    kind = "gguf" if model.format == "gguf" else "hf_dir"
    resolved = ResolvedModel(model.name, model.path, kind, quant=model.file_quant)
    gguf = getattr(model.weights, "gguf", None)
    if gguf is None:
        return model_facts(resolved)
    return _gguf_facts(gguf_weights_header(gguf), resolved)


def _gguf_facts(header: WeightsHeader, resolved: ResolvedModel) -> ModelFacts:
    assert header.arch is not None  # a GGUF header always names its architecture
    return ModelFacts(resolved.name, header.arch, header.params, header.quant, header, resolved)


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _gguf_header(path: str, size: int, mtime_ns: int) -> WeightsHeader:
    # Keyed on size and mtime too, so a file replaced in place is read again.
    return read_gguf_header(path)


def _hub_safetensors_bytes(source: object) -> int | None:
    """Exact original-weight bytes from the Hub's safetensors metadata, or None when offline."""
    repo = getattr(source, "repo", None)
    if not repo:
        return None
    try:
        from huggingface_hub import get_safetensors_metadata

        meta = get_safetensors_metadata(repo)
    except Exception:  # offline, gated repo, rate limit: the catalog numbers still answer
        return None
    return sum(
        safetensors_dtype_bytes(dtype) * count for dtype, count in meta.parameter_count.items()
    )
