"""The local Hugging Face hub cache: where it is, which model repos it holds, and removing them.

Models from the Hub live in huggingface_hub's own cache (HF_HUB_CACHE, HF_HOME), shared with every
other tool that uses it; everything here goes through huggingface_hub's cache functions and never
touches the network.

Interrupted downloads: huggingface_hub resumes a dropped connection with a Range request (up to
five times per file) within one `pull`. It does not keep partial files between runs (2.x writes
to a per-process temporary file), so a `pull` stopped with Ctrl-C starts that file again, while
files that completed are not fetched twice. It deletes that temporary when a download fails, but
a killed process leaves it behind (``blobs/<etag>.<random>.incomplete``, never resumed since its
name belongs to that process): `pull` deletes such leftovers of the repository first, once no
process holds the download's lock (:func:`remove_partial_downloads`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.catalog import BundledSource, HFSource, LocalSource, catalog_entry_for
from localinfer.errors import InvalidParameterError
from localinfer.stale_files import age_s

# Where the download lock cannot be checked (no flock on the filesystem): a partial file nobody
# has written to for this long belongs to no running download.
STALE_PARTIAL_S = 3600.0


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (tests move it)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder of `repo_id`'s cached revision of 'main', if there is one.

    Read from the cache's layout (refs/main names the commit) rather than with
    snapshot_download(local_files_only=True): huggingface_hub 2.4 refuses a snapshot holding only
    some of the repo's files (IncompleteSnapshotError), and one quantization of a GGUF repo is
    exactly that."""
    from huggingface_hub.file_download import repo_folder_name

    folder = hf_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")
    try:
        commit = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    snapshot = folder / "snapshots" / commit
    if not commit or not snapshot.is_dir() or not any(snapshot.iterdir()):
        return None
    return snapshot


def _scan_cache() -> Any:
    """huggingface_hub's HFCacheInfo of the cache, or None when there is no cache yet."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = hf_cache_dir()
    if not cache.is_dir():
        return None
    try:
        return scan_cache_dir(cache)
    except CacheNotFound:
        return None


def _model_repos(info: Any) -> list[Any]:
    return [r for r in info.repos if r.repo_type == "model"] if info is not None else []


@dataclass(frozen=True, slots=True)
class CachedRepo:
    """A model repo found in the local Hugging Face cache."""

    repo_id: str
    size_on_disk: int
    snapshot: Path | None


def list_cached_repos() -> list[CachedRepo]:
    """Model repos in the Hugging Face cache, by repo id (an absent cache is an empty list)."""
    repos = sorted(_model_repos(_scan_cache()), key=lambda r: r.repo_id)
    return [CachedRepo(r.repo_id, r.size_on_disk, cached_snapshot(r.repo_id)) for r in repos]


# -- partial downloads left by a killed pull ------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartialCleanup:
    files: int
    freed_bytes: int


def remove_partial_downloads(repo_id: str) -> PartialCleanup:
    """Delete the partial files that killed downloads of ``repo_id`` left in the cache.

    huggingface_hub writes a blob to ``blobs/<etag>.<random>.incomplete`` while it holds
    ``.locks/<repo folder>/<etag>.lock``. A partial file whose lock nobody holds has no writer
    (a concurrent pull of the same file holds it, so its file stays). On a filesystem without
    flock the lock says nothing, and a partial file goes after STALE_PARTIAL_S without change.
    """
    from huggingface_hub.file_download import repo_folder_name

    name = repo_folder_name(repo_id=repo_id, repo_type="model")
    blobs = hf_cache_dir() / name / "blobs"
    locks = hf_cache_dir() / ".locks" / name
    files = freed = 0
    for path in sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []:
        etag = path.name.split(".", 1)[0]
        try:
            if not _writer_gone(locks / f"{etag}.lock", path):
                continue
            size = path.stat().st_size
            path.unlink()
        except OSError:  # finished or removed meanwhile, or not ours to remove
            continue
        files, freed = files + 1, freed + size
    return PartialCleanup(files, freed)


def _writer_gone(lock_path: Path, partial: Path) -> bool:
    held = _lock_held(lock_path)
    if held is None:
        return age_s(partial) > STALE_PARTIAL_S
    return not held


def _lock_held(lock_path: Path) -> bool | None:
    """Whether some process holds this download lock; None when the filesystem cannot say."""
    if not lock_path.exists():
        return False
    # filelock is what huggingface_hub locks with (one of its own dependencies).
    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    except (NotImplementedError, OSError):
        return None
    lock.release()
    return False


# -- removing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Removal:
    repos: tuple[str, ...]
    revisions: int
    freed_bytes: int


def remove_cached(spec: str, *, dry_run: bool = False) -> Removal:
    """Delete every cached revision of `spec`'s repos with huggingface_hub's deletion strategy
    (snapshots, blobs no other revision uses, refs; the repo folder when nothing is left)."""
    wanted = _repo_ids_for(spec)
    info = _scan_cache()
    cached = [repo for repo in _model_repos(info) if repo.repo_id in wanted]
    present = {repo.repo_id for repo in cached}
    repos = [r for r in wanted if r in present]
    if not repos:
        return Removal((), 0, 0)
    hashes = [rev.commit_hash for repo in cached for rev in repo.revisions]
    freed = 0
    if hashes:
        strategy = info.delete_revisions(*hashes)
        freed = strategy.expected_freed_size
        if not dry_run:
            strategy.execute()
    if not dry_run:
        _remove_leftovers(repos)
    return Removal(tuple(repos), len(hashes), freed)


def _repo_ids_for(spec: str) -> list[str]:
    """The Hub repos that hold `spec`: a catalog model's GGUF and original repos, else `spec`."""
    entry = catalog_entry_for(spec)
    if entry is None:
        return [spec]
    src = entry.source
    if isinstance(src, BundledSource):
        raise InvalidParameterError(
            f"{entry.name} ships inside the pip package {src.package}, not the Hub cache; "
            f"`pip uninstall {src.package}` removes it"
        )
    if isinstance(src, LocalSource):
        raise InvalidParameterError(f"{entry.name} is a local model ({src.path}); not cached")
    assert isinstance(src, HFSource)
    return [r for r in (src.gguf_repo, src.repo) if r]


def _remove_leftovers(repos: list[str]) -> None:
    """A repo folder with no revision left (only an interrupted download's temporary files, or an
    empty refs/): the deletion strategy skips those, so remove the folder itself."""
    from huggingface_hub.file_download import repo_folder_name

    for repo_id in repos:
        name = repo_folder_name(repo_id=repo_id, repo_type="model")
        folder = hf_cache_dir() / name
        snapshots = folder / "snapshots"
        if folder.is_dir() and not (snapshots.is_dir() and any(snapshots.iterdir())):
            shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():  # download locks of a repo that is gone
            shutil.rmtree(hf_cache_dir() / ".locks" / name, ignore_errors=True)
