"""Downloads from the Hugging Face Hub: only the files one model and quantization need, into the
hub's own cache, so `resolve_model` finds them offline afterwards.

Everything here goes through huggingface_hub (HF_ENDPOINT, HF_HUB_OFFLINE, HF_HUB_CACHE and the
token all work as they do for every other tool that shares the cache). The first request asks for
the repository's file listing with a short timeout, so a machine without a network learns it in
seconds instead of waiting on a download timeout; every failure becomes one typed HubError line.

A `pull` first removes what killed downloads of the repository left behind
(localinfer/hf_cache.py, :func:`remove_partial_downloads`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.catalog import (
    BundledSource,
    CatalogEntry,
    HFSource,
    LocalSource,
    catalog_entry_for,
    load_catalog,
)
from localinfer.errors import InvalidParameterError, LocalinferError, UnknownModelError
from localinfer.facts.quant import normalize_quant
from localinfer.hf_cache import hf_cache_dir
from localinfer.hf_cache import remove_cached as remove_cached  # re-exported: commands/rm.py
from localinfer.hf_cache import remove_partial_downloads as remove_partial_downloads  # pull.py
from localinfer.resolve import split_quant_tag

# What a safetensors checkpoint needs to load and chat: weights, configs, tokenizer, template.
SAFETENSORS_PATTERNS = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# First contact with the Hub: a dead network shows up as a connect timeout, a server that
# accepts and never answers as a read timeout; either way `pull` fails in seconds, not minutes.
# LOCALINFER_HUB_TIMEOUT_S (seconds, read at each request) replaces LISTING_TIMEOUT_S and caps
# the connect timeout: the test of a silent Hub waits a fraction of a second, not 5 s; unset,
# empty or not a positive number, these constants hold.
CONNECT_TIMEOUT_S = 3.0
LISTING_TIMEOUT_S = 5.0
HUB_TIMEOUT_ENV = "LOCALINFER_HUB_TIMEOUT_S"


class HubError(LocalinferError):
    """The Hub could not be reached, or refused or lacks what was asked for."""

    http_status = 502
    code = "hub_error"


class HubUnreachableError(HubError):
    """No answer from the Hub at all (no network, a dead endpoint): what was fetched before and
    cached may still serve."""


@dataclass(frozen=True, slots=True)
class DownloadPlan:
    """Which repository and which of its files one model + quantization need."""

    name: str  # catalog name, or the repo id for a model outside the catalog
    repo_id: str
    quant: str | None  # None: a repo outside the catalog pulled without --quant
    patterns: tuple[str, ...]  # allow_patterns (fnmatch, as huggingface_hub filters)
    entry: CatalogEntry | None

    def wants(self, path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) for p in self.patterns)


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str
    size: int
    cached: bool  # already complete in the local cache


@dataclass(frozen=True, slots=True)
class RemoteListing:
    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]  # only the files the plan wants

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def missing_bytes(self) -> int:
        return sum(f.size for f in self.files if not f.cached)


def plan_download(spec: str, quant: str | None = None) -> DownloadPlan:
    """What `localinfer pull spec --quant quant` fetches (spec may be MODEL:QUANT). Raises for
    models with nothing to fetch (bundled, local) and for a quantization the model does not
    offer. A repo outside the catalog gets patterns here; `pull` narrows them to the files its
    budget read (:func:`exact_files`)."""
    spec, quant = split_quant_tag(spec.strip(), quant)
    entry = catalog_entry_for(spec)
    if entry is None:
        return _plan_for_repo(spec, quant)
    source = entry.source
    if isinstance(source, BundledSource):
        raise InvalidParameterError(
            f"{entry.name} ships inside the pip package {source.package}; nothing to download"
        )
    if isinstance(source, LocalSource):
        raise InvalidParameterError(f"{entry.name} is a local model ({source.path}); not on a hub")
    assert isinstance(source, HFSource)
    if quant is None and spec == source.repo and "bf16" in entry.quants:
        quant = "bf16"  # the repo of the original weights means those weights
    wanted = entry.default_quant if quant is None else _quant_name(quant)
    if wanted not in entry.quants:
        raise InvalidParameterError(
            f"{entry.name} comes as {', '.join(entry.quants)}; there is no {wanted}"
        )
    if wanted == "bf16":
        return DownloadPlan(entry.name, source.repo, wanted, SAFETENSORS_PATTERNS, entry)
    filename = source.gguf_filename(wanted)
    if not source.gguf_repo or not filename:
        raise InvalidParameterError(f"the catalog names no GGUF file for {entry.name} {wanted}")
    return DownloadPlan(entry.name, source.gguf_repo, wanted, (filename,), entry)


def _check_repo_id(repo_id: str) -> None:
    """Refuse what the Hub would refuse ('../x', 'a/b c', 'org/..') before any request, in one
    line instead of huggingface_hub's HFValidationError traceback."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise InvalidParameterError(
            f"{repo_id!r} is not a Hugging Face repo id: org/name, each of letters, digits, '-', "
            "'_' and '.', without '--' or '..', at most 96 characters"
        ) from None


def _quant_name(quant: str) -> str:
    return "bf16" if quant.strip().lower() in ("none", "bf16") else normalize_quant(quant)


def _plan_for_repo(spec: str, quant: str | None) -> DownloadPlan:
    parts = spec.split("/")
    if len(parts) != 2 or not all(parts):
        raise UnknownModelError(spec, load_catalog().close_names(spec))
    _check_repo_id(spec)
    if quant is None or quant.strip().lower() in ("none", "bf16"):
        return DownloadPlan(spec, spec, None, SAFETENSORS_PATTERNS, None)
    q = quant.strip()
    # fnmatch is case-sensitive on POSIX and repos spell quantizations both ways.
    patterns = tuple(dict.fromkeys((f"*{q}*.gguf", f"*{q.upper()}*.gguf", f"*{q.lower()}*.gguf")))
    return DownloadPlan(spec, spec, q, patterns, None)


def exact_files(plan: DownloadPlan, files: tuple[str, ...], model_format: str) -> DownloadPlan:
    """The plan narrowed to the files the budget read of the repo (a GGUF's parts, a projector),
    so the model after download is the one that was budgeted; a safetensors model keeps its
    patterns (weights, config and tokenizer files)."""
    if model_format != "gguf":
        return plan
    return dataclasses.replace(plan, patterns=files)


# -- talking to the Hub ---------------------------------------------------------------------


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


@contextlib.contextmanager
def hub_errors(plan: DownloadPlan) -> Iterator[None]:
    """Turn huggingface_hub / network exceptions into one-line HubErrors."""
    with repo_errors(plan.name, plan.repo_id, f"no file matching {', '.join(plan.patterns)}"):
        yield


@contextlib.contextmanager
def repo_errors(name: str, repo_id: str, missing: str = "no such file") -> Iterator[None]:
    """Turn huggingface_hub / network exceptions met while asking about ``repo_id`` into
    one-line HubErrors; ``missing`` says what a 404 on a file means."""
    from huggingface_hub import errors

    transport = _hub_http()
    network_errors = (transport.TransportError,) if transport else ()
    try:
        yield
    except errors.OfflineModeIsEnabled:
        raise HubError(
            f"cannot download {name}: HF_HUB_OFFLINE is set, so the Hub is off limits "
            "(models already on disk still work; unset HF_HUB_OFFLINE to pull)"
        ) from None
    except errors.GatedRepoError:
        raise HubError(
            f"{repo_id} is gated: accept its terms at {hub_endpoint()}/{repo_id}, then log in "
            "with `hf auth login` or set HF_TOKEN"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"{repo_id} is not on the Hub at {hub_endpoint()} (or is private or gated: "
            "log in with `hf auth login`)"
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{repo_id} has no 'main' revision on the Hub") from None
    except errors.RemoteEntryNotFoundError:
        raise HubError(f"{repo_id} has {missing}") from None
    except (*network_errors, errors.LocalEntryNotFoundError) as exc:
        # LocalEntryNotFoundError: huggingface_hub fell back to the cache after a network error.
        raise HubUnreachableError(
            f"cannot reach the Hugging Face Hub at {hub_endpoint()} ({_first_line(exc)}); "
            "models already on disk still work offline"
        ) from None
    except errors.HfHubHTTPError as exc:
        raise HubError(f"the Hub refused {repo_id}: {_first_line(exc)}") from None
    except OSError as exc:  # a size check failed after retries, a full disk
        raise HubError(
            f"downloading {name} failed: {_first_line(exc)}; run the same pull again "
            "(completed files are kept)"
        ) from None


def _hub_http() -> Any:
    """The HTTP library huggingface_hub 2.x talks through (httpx2), for its error and timeout
    types; None if a future huggingface_hub moves to another one."""
    try:
        import httpx2
    except ImportError:
        return None
    return httpx2


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def cached_file(plan: DownloadPlan) -> Path | None:
    """The plan's one file when it is already in the cache (at the revision 'main' points to);
    found without any network. None for plans that name several files or patterns."""
    from huggingface_hub import try_to_load_from_cache

    if len(plan.patterns) != 1 or any(c in plan.patterns[0] for c in "*?["):
        return None
    hit = try_to_load_from_cache(plan.repo_id, plan.patterns[0], cache_dir=hf_cache_dir())
    return Path(hit) if isinstance(hit, str) and Path(hit).is_file() else None


def listing_timeout_s() -> float:
    """LISTING_TIMEOUT_S, or the positive number of seconds in LOCALINFER_HUB_TIMEOUT_S."""
    try:
        seconds = float(os.environ.get(HUB_TIMEOUT_ENV, ""))
    except ValueError:
        return LISTING_TIMEOUT_S
    return seconds if 0 < seconds < float("inf") else LISTING_TIMEOUT_S


def short_timeout() -> Any:
    """The timeouts of a first request to the Hub: fail in seconds on a dead network."""
    listing = listing_timeout_s()
    transport = _hub_http()
    if transport is None:
        return listing
    return transport.Timeout(listing, connect=min(CONNECT_TIMEOUT_S, listing))


def list_remote(plan: DownloadPlan) -> RemoteListing:
    """The files of `plan` on the Hub with their sizes, and whether each is already cached."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    with hub_errors(plan):
        info = HfApi().model_info(plan.repo_id, files_metadata=True, timeout=short_timeout())
    if not info.sha:
        raise HubError(f"the Hub sent no commit for {plan.repo_id}")
    files = []
    for sibling in info.siblings or []:
        if not plan.wants(sibling.rfilename):
            continue
        size = sibling.lfs.size if sibling.lfs is not None else sibling.size
        hit = try_to_load_from_cache(
            plan.repo_id, sibling.rfilename, cache_dir=hf_cache_dir(), revision=info.sha
        )
        cached = isinstance(hit, str) and Path(hit).is_file()
        files.append(RemoteFile(sibling.rfilename, int(size or 0), cached))
    if not files:
        raise HubError(f"{plan.repo_id} has no file matching {', '.join(plan.patterns)}")
    return RemoteListing(plan.repo_id, info.sha, tuple(files))


def free_disk_bytes() -> int:
    """Free space where the cache lives (its nearest existing parent)."""
    path = hf_cache_dir()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def download(plan: DownloadPlan, *, progress: bool = True) -> Path:
    """Fetch the plan's files into the Hugging Face cache; returns the snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    # huggingface_hub's own bars (bytes and files, on a terminal); --quiet turns them off for
    # this call only, leaving a user's HF_HUB_DISABLE_PROGRESS_BARS alone.
    silence = not progress and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    try:
        with hub_errors(plan):
            folder = snapshot_download(
                plan.repo_id, allow_patterns=list(plan.patterns), cache_dir=hf_cache_dir()
            )
    finally:
        if silence:
            enable_progress_bars()
    return Path(folder)
