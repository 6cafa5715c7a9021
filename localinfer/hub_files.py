"""A Hub repository before anything is downloaded: its listing (files, sizes, commit, gated),
byte ranges of one file, and small JSON files, all through huggingface_hub's HTTP session (so
HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE work as for every other tool). Nothing here writes to the
Hugging Face cache: a repo whose cache held only its config.json would look downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from localinfer.facts.gguf_names import model_ggufs, projector_ggufs
from localinfer.hub import HubError, repo_errors, short_timeout

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"


@dataclass(frozen=True, slots=True)
class RepoListing:
    """Every file of one revision of a Hub repo, with its size."""

    repo_id: str
    commit: str
    sizes: dict[str, int]
    gated: bool = False

    def ggufs(self) -> list[str]:
        return model_ggufs(self.sizes)

    def projectors(self) -> list[str]:
        return projector_ggufs(self.sizes)

    def has_safetensors(self) -> bool:
        return SAFETENSORS_SINGLE in self.sizes or SAFETENSORS_INDEX in self.sizes


# -- the Hub --------------------------------------------------------------------------------


def fetch_listing(repo_id: str) -> RepoListing:
    """The repo's files at the commit 'main' points to (one request, short timeouts)."""
    from huggingface_hub import HfApi

    with repo_errors(repo_id, repo_id):
        info = HfApi().model_info(repo_id, files_metadata=True, timeout=short_timeout())
    if not info.sha:
        raise HubError(f"the Hub sent no commit for {repo_id}")
    sizes = {}
    for sibling in info.siblings or []:
        size = sibling.lfs.size if sibling.lfs is not None else sibling.size
        sizes[sibling.rfilename] = int(size or 0)
    return RepoListing(repo_id, info.sha, sizes, bool(info.gated))


def read_range(listing: RepoListing, filename: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of one file at the listing's commit, by an HTTP range request.

    Streamed and cut at ``end``, so a server that ignores Range and sends the whole file costs
    only what was asked for."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    if end <= start:
        return b""
    url = hf_hub_url(
        listing.repo_id, filename, revision=listing.commit, endpoint=constants.ENDPOINT
    )
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{end - 1}"}
    data = bytearray()
    session = get_session()
    with (
        repo_errors(listing.repo_id, listing.repo_id, f"no file {filename}"),
        session.stream("GET", url, headers=headers, timeout=short_timeout()) as response,
    ):
        hf_raise_for_status(response)
        skip = start if response.status_code == 200 else 0  # Range ignored: the whole file
        for chunk in response.iter_bytes():
            if skip:
                dropped = min(skip, len(chunk))
                chunk, skip = chunk[dropped:], skip - dropped
            data += chunk
            if len(data) >= end - start:
                break
    return bytes(data[: end - start])


def fetch_json(listing: RepoListing, filename: str) -> object:
    """A small JSON file of the repo (config.json, the safetensors index), never cached by
    huggingface_hub: a repo whose cache held only its config would look downloaded."""
    raw = read_range(listing, filename, 0, listing.sizes.get(filename, 0) or 2**24)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(f"{listing.repo_id}/{filename} is not valid JSON ({exc})") from None
