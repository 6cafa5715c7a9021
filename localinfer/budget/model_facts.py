"""What the budget knows about a model before loading it: architecture, parameter count and,
where headers can be read (a file on disk, or the Hub's metadata: remote_facts.py), the exact
weight bytes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.budget.facts_record import ModelFacts
from localinfer.budget.file_headers import (
    WeightsHeader,
    gguf_weights_header,
    read_gguf_header,
    read_projector,
    read_safetensors_headers,
)
from localinfer.errors import LocalinferError
from localinfer.facts.gguf_names import pick_projector, projector_ggufs
from localinfer.facts.hf_config import arch_from_hf_config, read_json_object
from localinfer.resolve import ResolvedModel

if TYPE_CHECKING:
    from localinfer.loading.model import LoadedModel


def model_facts(
    resolved: ResolvedModel, online: bool = False, mmproj: str | None = None
) -> ModelFacts:
    """The facts of a resolved model. ``online``: a catalog model not on disk is read from the
    Hub's metadata instead of the catalog's numbers (hub_remote models always are);
    ``mmproj``: count a vision projector ("" the model's own, or a file name)."""
    if resolved.kind == "gguf":
        assert resolved.path is not None
        header = _gguf_header(str(resolved.path), *_stamp(resolved.path))
        facts = _gguf_facts(header, resolved)
        return _with_local_projector(facts, resolved.path.parent, mmproj)
    if resolved.kind == "hf_dir":
        assert resolved.path is not None
        config_path = resolved.path / "config.json"
        arch = arch_from_hf_config(read_json_object(config_path), config_path)
        header = read_safetensors_headers(resolved.path, arch.tied_embeddings)
        return ModelFacts(
            resolved.name, arch, header.params, header.quant, header, resolved, "safetensors"
        )
    from localinfer.budget.remote_facts import catalog_hub_facts, config_facts, hub_facts

    if resolved.kind == "hf_config":
        assert resolved.path is not None
        return config_facts(read_json_object(resolved.path), resolved, "config.json")
    if resolved.kind == "hub_remote":
        return hub_facts(resolved, mmproj)
    entry = resolved.entry
    assert entry is not None, "a catalog_remote model always has its catalog entry"
    origin = ""
    if online or mmproj is not None:
        try:
            return catalog_hub_facts(resolved, mmproj)
        except LocalinferError:
            if mmproj is not None:
                raise
            # offline, gated, rate limited: the catalog's numbers still answer, and say so
            # (the weights row would otherwise read as if --online had been honoured)
            origin = "catalog: --online could not read the Hub"
    quant = resolved.quant or entry.default_quant
    return ModelFacts(entry.name, entry.arch, entry.params, quant, None, resolved, origin=origin)


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
    return ModelFacts(
        resolved.name, header.arch, header.params, header.quant, header, resolved, "gguf"
    )


def _with_local_projector(facts: ModelFacts, folder: Path, mmproj: str | None) -> ModelFacts:
    """A GGUF's facts with the projectors beside it listed, and the one asked for counted."""
    names = [str(p.relative_to(folder)) for p in folder.glob("*.gguf")]
    found = tuple(projector_ggufs(names))
    if not found and mmproj is None:
        return facts
    projector = None
    if mmproj is not None:
        name = pick_projector(names, mmproj, str(folder))
        projector = read_projector(folder / name, name)
    return _replace(facts, projector=projector, projectors=found)


def _replace(facts: ModelFacts, **changes: object) -> ModelFacts:
    import dataclasses

    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _gguf_header(path: str, size: int, mtime_ns: int) -> WeightsHeader:
    # Keyed on size and mtime too, so a file replaced in place is read again.
    return read_gguf_header(path)
