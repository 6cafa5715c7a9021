"""The KV tiers' sizes (issue #24): what `--kv-ram` asks for, the default share of free RAM that
chat and serve take when it is not given, and the disk tier's cap (`--kv-disk-cap`). The session
sizes its tiers and the budget shows the RAM tier's row with these same functions, so the two
never disagree. The tiers themselves are the engine's (localinfer/engine/kv/).

The default is min(25% of the host RAM left after the model's budget, 2 GiB). A quarter leaves
three quarters of what is free to the rest of the machine (and to the page cache the weights are
mapped through on CPU backends); 2 GiB holds the KV of tens of long conversations of a small
model (the embedded model: 45 KiB per token in float32, so ~46,000 tokens), past which more RAM
buys little for a chat or an editor and only competes with other programs. On a GPU backend the
tier lives in host RAM beside the device's budget; on CPU and Apple unified memory it is the same
memory as the model's, so it counts in the total.
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.budget.memory import cpu_memory, human_bytes, parse_size
from localinfer.budget.report import BudgetReport
from localinfer.errors import InvalidParameterError

KV_RAM_SHARE = 0.25
KV_RAM_MAX = 2 * 2**30
AUTO = "auto"  # BudgetRequest.kv_ram: the default share
DEFAULT_KV_DISK_CAP = 4 * 2**30  # a few long conversations of an 8B model; many of a small one


@dataclass(frozen=True, slots=True)
class KVRamTier:
    """The tier's cap and whether it is drawn from the memory the budget counts."""

    bytes: int
    counted: bool  # True: in the device's total (CPU, unified memory); False: host RAM beside it


def default_kv_ram_bytes(host_left: int) -> int:
    """The default cap from the host RAM left once the model is budgeted (0 when none is)."""
    return max(0, min(int(host_left * KV_RAM_SHARE), KV_RAM_MAX))


def parse_kv_ram(asked: str | None) -> int | None:
    """``--kv-ram`` as bytes: None (not given, or "auto") for the default share, 0 for off."""
    if asked is None or asked.strip().lower() == AUTO:
        return None
    text = asked.strip()
    if text in ("0", "off", "none"):
        return 0
    try:
        return parse_size(text)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"--kv-ram wants a size like 512MiB or 2GiB, 0 to turn the tier off, got '{asked}'"
        ) from None


def parse_disk_cap(asked: str | None) -> int:
    """``--kv-disk-cap`` as bytes (not given: DEFAULT_KV_DISK_CAP)."""
    if asked is None:
        return DEFAULT_KV_DISK_CAP
    try:
        return parse_size(asked)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"--kv-disk-cap wants a size like 4GiB or 500MiB, got '{asked}'"
        ) from None


def kv_ram_bytes(asked: str | None, host_left: int, *, model_fits: bool = True) -> int:
    """The tier's cap for ``--kv-ram asked`` with ``host_left`` bytes of host RAM free after the
    model. An explicit size larger than that is refused (naming --kv-ram) when the model itself
    fits; when it does not, the budget's verdict already says so."""
    explicit = parse_kv_ram(asked)
    if explicit is None:
        return default_kv_ram_bytes(host_left)
    if explicit and model_fits and explicit > host_left:
        raise InvalidParameterError(
            f"--kv-ram {asked.strip()} is more than the {human_bytes(max(host_left, 0))} of RAM "  # type: ignore[union-attr]
            "left after the model"
        )
    return explicit


def kv_ram_tier(asked: str | None, device_kind: str, available: int, model_total: int) -> KVRamTier:
    """The tier for a budget on a device of ``device_kind`` with ``available`` bytes, of which the
    model takes ``model_total``. On CUDA the tier's RAM is the host's, read here."""
    counted = device_kind != "cuda"
    host_left = available - model_total if counted else cpu_memory()[0]
    fits = model_total <= available
    return KVRamTier(kv_ram_bytes(asked, host_left, model_fits=fits), counted)


def without_kv_ram(report: BudgetReport) -> BudgetReport:
    """``report`` without its RAM tier row (a session whose runner cannot use the tier)."""
    if not report.kv_ram_bytes:
        return report
    total = report.total_bytes - (report.kv_ram_bytes if report.kv_ram_counted else 0)
    update = {"kv_ram_bytes": 0, "kv_ram_counted": False, "total_bytes": total}
    return report.model_copy(update={**update, "fits": total <= report.available_bytes})
