"""The session's KV tiers (issue #24): a RAM tier spilling into a disk tier, built from what
``--kv-ram`` / ``--kv-disk`` asked, sized by the budget, and described for display.

The RAM tier's cap is the budget's ``kv_ram_bytes`` (the same rule `localinfer budget --kv-ram`
shows: budget/kv_tier.py); with ``--force`` there is no budget, and the default share is taken
of the RAM free once the weights are loaded. The disk tier's folder is
``DIR/<model hash>-<layout hash>/``: the model file's sha256 (model_hash.py) and the runner's KV
layout, so two models, or one model at two dtypes, never read each other's files.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backends.base import KVTransfer, Runner
from localinfer.budget.kv_tier import AUTO, kv_ram_bytes, without_kv_ram
from localinfer.budget.memory import cpu_memory, parse_size
from localinfer.budget.report import BudgetReport
from localinfer.engine.kv_disk import DiskKVStore
from localinfer.engine.kv_ram import RamKVStore
from localinfer.engine.kv_store import KVStore
from localinfer.errors import InvalidParameterError
from localinfer.kv_options import KVTierOptions
from localinfer.model_hash import model_content_hash

if TYPE_CHECKING:
    from localinfer.session import BuiltRunner

log = logging.getLogger(__name__)

DEFAULT_KV_DISK_CAP = 4 * 2**30  # a few long conversations of an 8B model; many of a small one


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


def parse_disk_cap(asked: str | None) -> int:
    if asked is None:
        return DEFAULT_KV_DISK_CAP
    try:
        return parse_size(asked)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"--kv-disk-cap wants a size like 4GiB or 500MiB, got '{asked}'"
        ) from None


def budgeted_kv_ram(kv: KVTierOptions | None, prefix_reuse: bool = True) -> str | None:
    """What the budget is asked about the RAM tier (``BudgetRequest.kv_ram``: None for no tiers,
    "auto" for the default share; None without ``prefix_reuse``, which the tiers need); refuses
    bad disk flags before any weight loads (the RAM size is checked by the budget, against the
    memory it sees)."""
    if kv is None:
        return None
    parse_disk_cap(kv.disk_cap)
    if kv.disk is not None and kv.disk.exists() and not kv.disk.is_dir():
        raise InvalidParameterError(f"--kv-disk {kv.disk} is a file, not a directory")
    return (kv.ram or AUTO) if prefix_reuse else None


def build_kv_tiers(kv: KVTierOptions | None, built: BuiltRunner, *, prefix_reuse: bool) -> KVTiers:
    """The tiers ``kv`` asks for on ``built``'s runner (None: no tiers). Tiers need a runner that
    moves its KV (``KVTransfer``) and prefix reuse; without them they are off with one notice,
    and ``built.budget`` loses the RAM tier's row."""
    tiers = _tiers(kv, built.runner, built.model.path, built.budget, prefix_reuse)
    if tiers.ram is None and built.budget is not None:
        built.budget = without_kv_ram(built.budget)
    return tiers


def _tiers(
    kv: KVTierOptions | None,
    runner: Runner,
    model_path: Path,
    report: BudgetReport | None,
    prefix_reuse: bool,
) -> KVTiers:
    if kv is None:
        return KVTiers()
    why = None
    if not isinstance(runner, KVTransfer):
        why = "this backend's runner cannot move its KV cache"
    elif not prefix_reuse:
        why = "prefix reuse is off"
    if why is not None:
        notice = f"KV tiers (--kv-ram/--kv-disk) off: {why}"
        log.info(notice)
        return KVTiers(notice=notice)
    if report is not None:
        ram_cap = report.kv_ram_bytes
    else:  # --force: no budget; the weights are loaded, so free RAM is what is left after them
        ram_cap = kv_ram_bytes(kv.ram, cpu_memory()[0])
    disk = None
    if kv.disk is not None:
        disk = _disk_tier(kv, runner, model_path)
    ram = RamKVStore(ram_cap, spill=disk) if ram_cap > 0 else None
    return KVTiers(ram, disk)


def _disk_tier(kv: KVTierOptions, runner: KVTransfer, model_path: Path) -> DiskKVStore:
    assert kv.disk is not None
    try:
        kv.disk.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidParameterError(f"--kv-disk {kv.disk}: {exc.strerror or exc}") from None
    layout = runner.kv_layout()
    key = disk_model_key(model_content_hash(model_path), layout)
    return DiskKVStore(kv.disk, key, parse_disk_cap(kv.disk_cap), layout=layout)


def disk_model_key(content_hash: str, layout: str) -> str:
    """The disk tier's folder name: the model file's hash, then a hash of the runner's layout."""
    return f"{content_hash[:24]}-{hashlib.sha256(layout.encode()).hexdigest()[:12]}"
