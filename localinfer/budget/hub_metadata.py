"""What the budget needs of a model on the Hub, read without downloading any weight.

- GGUF (``ORG/REPO:Q4_K_M`` or ``--quant``): the repo's listing, then only the header of the
  quantization's file, over HTTP range requests (every part of a split GGUF), parsed by loading's
  own GGUF parser: the weights figure is the file's own tensor bytes.
- safetensors (``ORG/REPO``): config.json, then each shard's header with huggingface_hub's
  safetensors metadata API (``parse_safetensors_file_metadata``: range reads of the header).
- a repo with a config.json but neither (PyTorch .bin weights only): the config alone.
- vision projectors (``mmproj*.gguf``) are listed, and their header read when asked.

Everything read is kept per repo revision (metadata_cache.py): the Hub is asked for the listing
once per budget, and nothing else when the revision's headers are cached. Offline
(HF_HUB_OFFLINE=1, or no answer from the Hub) the latest cached revision answers, and a model whose
metadata was never fetched is a clear error.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from localinfer.budget.file_headers import (
    Projector,
    SafetensorsTensor,
    WeightsHeader,
    gguf_weights_header,
    projector_header,
    safetensors_weights_header,
)
from localinfer.budget.gguf_prefix import merge_split_parts, read_header
from localinfer.budget.metadata_cache import (
    MetadataCache,
    RepoRecord,
    header_from_json,
    header_to_json,
)
from localinfer.budget.vision import shape_from_dict
from localinfer.errors import InvalidParameterError, ModelFileError
from localinfer.facts.gguf_names import (
    model_ggufs,
    pick_gguf,
    pick_projector,
    projector_ggufs,
    quant_tag,
)
from localinfer.facts.hf_config import arch_from_hf_config
from localinfer.hub import HubError, HubUnreachableError, repo_errors
from localinfer.hub_files import (
    SAFETENSORS_INDEX,
    SAFETENSORS_SINGLE,
    RepoListing,
    fetch_json,
    fetch_listing,
    read_range,
)
from localinfer.loading.gguf_file import GGUFFile

Format = Literal["gguf", "safetensors", "config"]
SHARD_READERS = 8  # safetensors headers read at once (a 70B model has ~30 shards)


@dataclass(frozen=True, slots=True)
class RemoteWeights:
    """A Hub model's weights as far as the budget is concerned."""

    repo_id: str
    commit: str
    format: Format
    files: tuple[str, ...]  # the files whose headers were read (a GGUF's parts, the shards)
    download_bytes: int  # their size on the Hub
    header: WeightsHeader | None  # None: a config alone (format "config")
    config: dict[str, Any] | None  # config.json (safetensors, config)
    projectors: tuple[str, ...]  # mmproj*.gguf files in the repo
    projector: Projector | None  # the one counted (--mmproj)
    from_cache_only: bool  # the Hub was not asked (offline)


def remote_weights(
    repo_id: str, quant: str | None, mmproj: str | None = None, *, cached_only: bool = False
) -> RemoteWeights:
    """The weights of ``repo_id`` at ``quant`` (None: the repo's default), from the cache or the
    Hub; ``mmproj``: "" for the repo's projector, a file name for that one, None for none;
    ``cached_only``: never ask the Hub (a listing of what was budgeted before)."""
    from huggingface_hub import constants

    cache = MetadataCache(repo_id)
    if cached_only or constants.is_offline_mode():
        why = "listing cached metadata only" if cached_only else "HF_HUB_OFFLINE is set"
        return _offline(cache, quant, mmproj, why)
    try:
        listing = fetch_listing(repo_id)
    except HubUnreachableError as exc:
        if cache.latest() is None:
            raise HubError(f"{exc}; no metadata of {repo_id} is cached either") from None
        return _offline(cache, quant, mmproj, "the Hub did not answer")
    record = cache.load(listing.commit) or RepoRecord(
        repo_id, listing.commit, dict(listing.sizes), listing.gated
    )
    before = record.to_json()
    weights = _select(record, quant, mmproj, _Fetcher(listing))
    if record.to_json() != before or cache.main_commit() != record.commit:
        cache.save(record)
    return weights


def _offline(
    cache: MetadataCache, quant: str | None, mmproj: str | None, why: str
) -> RemoteWeights:
    record = cache.latest()
    if record is None:
        raise HubError(
            f"metadata of {cache.repo_id} not cached: {why}; run `localinfer budget "
            f"{cache.repo_id}` once with the Hub reachable"
        )
    return _select(record, quant, mmproj, None, why)


class _Fetcher:
    """Reads headers of one listed revision from the Hub."""

    def __init__(self, listing: RepoListing) -> None:
        self.listing = listing

    def gguf(self, parts: tuple[str, ...]) -> WeightsHeader:
        first, *later = (self._gguf_part(name, i == 0) for i, name in enumerate(parts))
        with first:
            return gguf_weights_header(merge_split_parts(first, list(later)) if later else first)

    def projector(self, name: str) -> Projector:
        return projector_header(name, self._gguf_part(name, first=False))

    def _gguf_part(self, name: str, first: bool) -> GGUFFile:
        size = self.listing.sizes[name]

        def read(start: int, end: int) -> bytes:
            return read_range(self.listing, name, start, end)

        return read_header(f"{self.listing.repo_id}/{name}", size, read, first_part=first)

    def config(self) -> dict[str, Any]:
        data = fetch_json(self.listing, "config.json")
        if not isinstance(data, dict):
            raise ModelFileError(f"{self.listing.repo_id}/config.json", "not a JSON object")
        return data

    def safetensors(self, tied_embeddings: bool) -> tuple[tuple[str, ...], WeightsHeader]:
        shards = self._shards()
        with ThreadPoolExecutor(max_workers=SHARD_READERS) as pool:
            per_shard = list(pool.map(self._shard_tensors, shards))
        tensors = [t for shard in per_shard for t in shard]
        return shards, safetensors_weights_header(tensors, tied_embeddings)

    def _shards(self) -> tuple[str, ...]:
        if SAFETENSORS_SINGLE in self.listing.sizes:
            return (SAFETENSORS_SINGLE,)
        index = fetch_json(self.listing, SAFETENSORS_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            where = f"{self.listing.repo_id}/{SAFETENSORS_INDEX}"
            raise ModelFileError(where, "malformed index: no weight_map")
        return tuple(sorted(set(map(str, weight_map.values()))))  # weight_files' order

    def _shard_tensors(self, shard: str) -> list[SafetensorsTensor]:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import SafetensorsParsingError

        repo = self.listing.repo_id
        try:
            with repo_errors(repo, repo, f"no file {shard}"):
                meta = HfApi().parse_safetensors_file_metadata(
                    repo, shard, revision=self.listing.commit
                )
        except SafetensorsParsingError as exc:
            reason = f"malformed safetensors header: {exc}"
            raise ModelFileError(f"{repo}/{shard}", reason) from None
        return [
            SafetensorsTensor(name, info.dtype, tuple(info.shape), _span(info.data_offsets))
            for name, info in meta.tensors.items()
        ]


def _span(offsets: tuple[int, int]) -> int:
    return int(offsets[1]) - int(offsets[0])


def _select(
    record: RepoRecord,
    quant: str | None,
    mmproj: str | None,
    fetch: _Fetcher | None,
    offline_why: str = "",
) -> RemoteWeights:
    """The weights ``quant`` names in ``record``, reading what the record lacks (``fetch``: None
    offline, where a missing piece is an error)."""
    names = list(record.sizes)
    has_safetensors = SAFETENSORS_SINGLE in record.sizes or SAFETENSORS_INDEX in record.sizes
    wants_gguf = quant is not None and _gguf_quant(quant, names)
    header: WeightsHeader | None
    if model_ggufs(names) and (wants_gguf or not has_safetensors):
        files = pick_gguf(names, quant, record.repo_id)
        if files[0] not in record.gguf:
            fetcher = _need(fetch, record, quant, offline_why)
            header_json = header_to_json(fetcher.gguf(files))
            record.gguf[files[0]] = {"files": list(files), "header": header_json}
        fmt: Format = "gguf"
        header, config = header_from_json(record.gguf[files[0]]["header"]), None
    elif has_safetensors:
        if record.safetensors is None:
            record.safetensors = _read_safetensors(_need(fetch, record, quant, offline_why))
        files = tuple(record.safetensors["files"])
        config = record.safetensors["config"]
        fmt, header = "safetensors", header_from_json(record.safetensors["header"])
    elif "config.json" in record.sizes:
        if record.config is None:
            record.config = _need(fetch, record, quant, offline_why).config()
        fmt, files, header, config = "config", ("config.json",), None, record.config
    else:
        raise HubError(
            f"{record.repo_id} holds no model weights localinfer reads (GGUF files, "
            "model.safetensors or its index) and no config.json"
        )
    return RemoteWeights(
        repo_id=record.repo_id,
        commit=record.commit,
        format=fmt,
        files=files,
        download_bytes=sum(record.sizes.get(f, 0) for f in files),
        header=header,
        config=config,
        projectors=tuple(projector_ggufs(names)),
        projector=_projector(record, mmproj, fetch, offline_why) if mmproj is not None else None,
        from_cache_only=fetch is None,
    )


def _read_safetensors(fetch: _Fetcher) -> dict[str, Any]:
    config = fetch.config()
    arch = arch_from_hf_config(config, f"{fetch.listing.repo_id}/config.json")
    shards, header = fetch.safetensors(arch.tied_embeddings)
    return {"files": list(shards), "config": config, "header": header_to_json(header)}


def _gguf_quant(quant: str, names: list[str]) -> bool:
    """Whether ``quant`` names one of the repo's GGUF files (else it is a conversion target)."""
    try:
        pick_gguf(names, quant, "")
    except InvalidParameterError:
        return False
    return True


def _need(fetch: _Fetcher | None, record: RepoRecord, quant: str | None, why: str) -> _Fetcher:
    if fetch is None:
        what = f"{record.repo_id}:{quant}" if quant else record.repo_id
        raise HubError(
            f"metadata of {what} not cached: {why}; run `localinfer budget {what}` once with "
            "the Hub reachable"
        )
    return fetch


def _projector(record: RepoRecord, asked: str, fetch: _Fetcher | None, why: str) -> Projector:
    name = pick_projector(record.sizes, asked, record.repo_id)
    summary = record.projectors.get(name)
    if summary is None:
        summary = _projector_summary(_need(fetch, record, None, why), name)
        record.projectors[name] = summary
    elif "vision" not in summary and fetch is not None:  # cached before the encoder's shape was
        with contextlib.suppress(HubError):
            summary = record.projectors[name] = _projector_summary(fetch, name)
    vision = shape_from_dict(summary.get("vision"))
    return Projector(name, int(summary["weight_bytes"]), int(summary["params"]), vision)


def _projector_summary(fetch: _Fetcher, name: str) -> dict[str, Any]:
    projector = fetch.projector(name)
    vision = projector.vision.as_dict() if projector.vision is not None else None
    return {"weight_bytes": projector.weight_bytes, "params": projector.params, "vision": vision}


def cached_hub_models() -> list[str]:
    """The models whose metadata is cached, as `budget` takes them: ``ORG/REPO:TAG`` for each GGUF
    model read of a repo's latest revision, ``ORG/REPO`` for its safetensors weights or config."""
    specs = []
    for folder in sorted(MetadataCache.root().glob("models--*")):
        repo_id = folder.name.removeprefix("models--").replace("--", "/", 1)
        record = MetadataCache(repo_id).latest()
        if record is None:
            continue
        for first in record.gguf:
            specs.append(f"{repo_id}:{quant_tag(first) or first.rsplit('/', 1)[-1]}")
        if record.safetensors is not None or record.config is not None:
            specs.append(repo_id)
    return specs
