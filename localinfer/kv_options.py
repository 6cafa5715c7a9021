"""--kv-ram and --kv-disk: the KV tiers below the slots (issue #24), spelled the same by every
command that runs a model, and the session keyword they become."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Parser = argparse.ArgumentParser | argparse._ArgumentGroup

KV_RAM_HELP = (
    "host-memory tier for the KV of reused slots, like 512MiB; a new request whose prompt starts "
    "as a stored one restores it instead of prefilling (default: a budgeted share of free RAM; "
    "0 turns it off)"
)
KV_DISK_HELP = (
    "directory for a disk tier of KV caches: kept at shutdown and when the RAM tier evicts, "
    "restored by a later process that sees the same prompt beginning (default: off)"
)
KV_DISK_CAP_HELP = (
    "most bytes the --kv-disk tier keeps per model and KV layout, least recently used out first "
    "(default: 4GiB)"
)


@dataclass(slots=True, frozen=True)
class KVTierOptions:
    """What the flags asked for; the session turns it into tiers (sizes checked there)."""

    ram: str | None = None  # --kv-ram as typed; None: the default share, "0": off
    disk: Path | None = None  # --kv-disk directory; None: no disk tier
    disk_cap: str | None = None  # --kv-disk-cap as typed; None: 4 GiB


def add_kv_options(
    parser: Parser, *, disk: bool = True, disk_help: str = KV_DISK_HELP, disk_metavar: str = "DIR"
) -> None:
    """--kv-ram SIZE and (with ``disk``) --kv-disk DIR and --kv-disk-cap SIZE; a command whose
    disk tier is on by default (chat) says so with ``disk_help``/``disk_metavar``."""
    parser.add_argument("--kv-ram", default=None, metavar="SIZE", help=KV_RAM_HELP)
    if disk:
        parser.add_argument(
            "--kv-disk", type=Path, default=None, metavar=disk_metavar, help=disk_help
        )
        parser.add_argument("--kv-disk-cap", default=None, metavar="SIZE", help=KV_DISK_CAP_HELP)


def kv_settings(args: argparse.Namespace) -> dict[str, Any]:
    """open_session's keyword for what add_kv_options parsed."""
    return {
        "kv": KVTierOptions(
            ram=args.kv_ram,
            disk=getattr(args, "kv_disk", None),
            disk_cap=getattr(args, "kv_disk_cap", None),
        )
    }
