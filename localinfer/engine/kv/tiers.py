"""The KV tiers a session gives its engine (issue #24): a RAM tier spilling into a disk tier, opened
on the runner's KV cache, and described for display.

The sizes come from above: the RAM tier's cap is the budget's ``kv_ram_bytes`` (or, with
``--force``, the same rule applied to the RAM free after loading: budget/kv_tier.py), the disk
tier's cap is ``--kv-disk-cap``. The session wires them (runner_setup.build_kv_tiers). The disk
tier's folder is ``DIR/<model hash>-<layout hash>/``: the model file's sha256 (model_hash.py) and
the KV cache's layout, so two models, or one model at two dtypes, never read each other's files.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from localinfer.backends.base import KVTransfer, Runner, kv_transfer
from localinfer.engine.kv.disk_tier import DiskKVStore
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.store import KVStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVTierInfo:
    """One tier as the chat or a status line shows it."""

    name: str  # "ram" | "disk"
    cap_bytes: int
    held_bytes: int  # payloads held now
    entries: int
    where: str  # "host RAM" or the disk tier's folder


@dataclass(slots=True)
class KVTiers:
    """The tiers a session's engine was given (none: ``stores`` is empty)."""

    ram: RamKVStore | None = None
    disk: DiskKVStore | None = None
    notice: str | None = None  # one line when tiers were asked for and are off
    stores: tuple[KVStore, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.stores = tuple(s for s in (self.ram, self.disk) if s is not None)

    def describe(self) -> list[KVTierInfo]:
        out = []
        if self.ram is not None:
            ram = self.ram
            out.append(KVTierInfo("ram", ram.capacity_bytes, ram.nbytes(), len(ram), "host RAM"))
        if self.disk is not None:
            disk = self.disk
            info = KVTierInfo("disk", disk.cap_bytes, disk.nbytes(), len(disk), str(disk.folder))
            out.append(info)
        return out


@dataclass(frozen=True, slots=True)
class DiskTierPlace:
    """Where the disk tier keeps its files: under ``directory`` (made already), in the folder of
    the model whose file hashes to ``content_hash``, at most ``cap_bytes`` of files."""

    directory: Path
    content_hash: str
    cap_bytes: int


def tiers_off(runner: Runner, prefix_reuse: bool) -> KVTiers | None:
    """Tiers off, with their one-line notice, when ``runner`` cannot serve them: they need prefix
    reuse and a KV cache that moves its cells (KVTransfer); None when it can."""
    why = None
    if kv_transfer(runner) is None:
        why = "this backend's runner cannot move its KV cache"
    elif not prefix_reuse:
        why = "prefix reuse is off"
    if why is None:
        return None
    notice = f"KV tiers (--kv-ram/--kv-disk) off: {why}"
    log.info(notice)
    return KVTiers(notice=notice)


def open_tiers(cache: KVTransfer, ram_cap: int, disk: DiskTierPlace | None) -> KVTiers:
    """A RAM tier of ``ram_cap`` bytes (none at 0) spilling into the disk tier at ``disk``, both
    holding snapshots of ``cache``'s layout."""
    disk_tier = None
    if disk is not None:
        layout = cache.layout()
        key = disk_model_key(disk.content_hash, layout)
        disk_tier = DiskKVStore(disk.directory, key, disk.cap_bytes, layout=layout)
    ram = RamKVStore(ram_cap, spill=disk_tier) if ram_cap > 0 else None
    return KVTiers(ram, disk_tier)


def disk_model_key(content_hash: str, layout: str) -> str:
    """The disk tier's folder name: the model file's hash, then a hash of the KV cache's layout."""
    return f"{content_hash[:24]}-{hashlib.sha256(layout.encode()).hexdigest()[:12]}"
