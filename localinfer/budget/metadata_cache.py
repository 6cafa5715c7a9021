"""Model metadata fetched from the Hub, kept on disk so a budget that worked once works offline.

One small JSON file per repo revision (``<cache>/hub-metadata/models--ORG--REPO/<commit>.json``)
holds the repo's file listing and the header summaries read so far (a GGUF model per
quantization, the safetensors weights with their config.json, vision projectors); ``main`` names
the revision last seen, as huggingface_hub's ``refs/main`` does. A revision's files never change,
so a record is only ever added to. Records written by another RECORD_VERSION are ignored (read
again from the Hub), so a change to what a summary holds never serves stale numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.budget.file_headers import WeightsHeader
from localinfer.facts.arch import ArchSpec
from localinfer.facts.held_weights import StoredTensor
from localinfer.paths import cache_dir

# 2: a GGUF summary holds its tensors (type, shape, bytes); 3: its arch says whether the model
# is an encoder, and a reranker by its classifier head (bge-reranker)
RECORD_VERSION = 3


@dataclass
class RepoRecord:
    """What is known of one revision of a Hub repo."""

    repo_id: str
    commit: str
    sizes: dict[str, int]
    gated: bool = False
    gguf: dict[str, dict[str, Any]] = field(default_factory=dict)  # first file -> summary
    projectors: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> summary
    safetensors: dict[str, Any] | None = None  # files, config, header
    config: dict[str, Any] | None = None  # config.json of a repo without weights we read

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "repo_id": self.repo_id,
            "commit": self.commit,
            "sizes": self.sizes,
            "gated": self.gated,
            "gguf": self.gguf,
            "projectors": self.projectors,
            "safetensors": self.safetensors,
            "config": self.config,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepoRecord | None:
        if data.get("version") != RECORD_VERSION:
            return None
        try:
            return cls(
                repo_id=str(data["repo_id"]),
                commit=str(data["commit"]),
                sizes={str(k): int(v) for k, v in data["sizes"].items()},
                gated=bool(data.get("gated")),
                gguf=dict(data.get("gguf") or {}),
                projectors=dict(data.get("projectors") or {}),
                safetensors=data.get("safetensors"),
                config=data.get("config"),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a damaged record is read again from the Hub


def header_to_json(header: WeightsHeader) -> dict[str, Any]:
    return {
        "weight_bytes": header.weight_bytes,
        "params": header.params,
        "quant": header.quant,
        "kept_block_bytes": header.kept_block_bytes,
        "tensors": [[t.name, t.type_name, list(t.shape), t.nbytes] for t in header.tensors],
        "arch": header.arch.model_dump(mode="json") if header.arch is not None else None,
    }


def header_from_json(data: dict[str, Any]) -> WeightsHeader:
    arch = data.get("arch")
    return WeightsHeader(
        weight_bytes=int(data["weight_bytes"]),
        params=int(data["params"]),
        quant=str(data["quant"]),
        arch=ArchSpec(**arch) if arch is not None else None,
        kept_block_bytes=data.get("kept_block_bytes"),
        tensors=tuple(
            StoredTensor(str(name), str(kind), tuple(int(d) for d in shape), int(nbytes))
            for name, kind, shape, nbytes in data.get("tensors") or ()
        ),
    )


class MetadataCache:
    """The records of one repo."""

    def __init__(self, repo_id: str) -> None:
        self.repo_id = repo_id
        self.folder = self.root() / ("models--" + repo_id.replace("/", "--"))

    @staticmethod
    def root() -> Path:
        return cache_dir() / "hub-metadata"

    def load(self, commit: str) -> RepoRecord | None:
        path = self.folder / f"{commit}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        record = RepoRecord.from_json(data) if isinstance(data, dict) else None
        if record is None or record.repo_id != self.repo_id or record.commit != commit:
            return None
        return record

    def main_commit(self) -> str | None:
        """The revision 'main' pointed to when the Hub was last asked."""
        try:
            commit = (self.folder / "main").read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return commit if commit.isalnum() else None

    def latest(self) -> RepoRecord | None:
        """The record of main_commit()."""
        commit = self.main_commit()
        return self.load(commit) if commit else None

    def save(self, record: RepoRecord) -> None:
        """Write the record and point 'main' at it (each file replaced atomically)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.folder / f"{record.commit}.json", json.dumps(record.to_json()))
        _write_atomic(self.folder / "main", record.commit)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
