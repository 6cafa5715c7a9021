"""The KV RAM tier in the budget (issue #24): one rule for its default size (shared with the
session), its own row, counted in the total where it draws on the same memory as the model (CPU,
unified memory, a planned machine) and beside it on a GPU; `budget --kv-ram` and its errors."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from localinfer.backend_budget import compute_budget
from localinfer.budget import compute, kv_tier
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.kv_tier import KV_RAM_MAX, default_kv_ram_bytes, kv_ram_bytes, parse_kv_ram
from localinfer.budget.memory import DeviceMemory
from localinfer.budget.render import breakdown_table
from localinfer.cli import main
from localinfer.errors import InvalidParameterError

GiB = 2**30


def test_the_default_share_is_a_quarter_of_what_is_left_up_to_2_gib() -> None:
    assert default_kv_ram_bytes(4 * GiB) == GiB
    assert default_kv_ram_bytes(100 * GiB) == KV_RAM_MAX == 2 * GiB
    assert default_kv_ram_bytes(0) == 0 and default_kv_ram_bytes(-GiB) == 0


def test_kv_ram_sizes() -> None:
    assert parse_kv_ram(None) is None and parse_kv_ram("auto") is None
    assert parse_kv_ram("0") == 0 and parse_kv_ram("512MiB") == 512 * 2**20
    for bad in ("lots", "-1GiB", "12"):
        with pytest.raises(InvalidParameterError, match="--kv-ram"):
            parse_kv_ram(bad)
    with pytest.raises(InvalidParameterError, match="--kv-ram 8GiB is more than the 4 GiB"):
        kv_ram_bytes("8GiB", 4 * GiB)
    assert kv_ram_bytes("8GiB", 4 * GiB, model_fits=False) == 8 * GiB  # the verdict says it
    assert kv_ram_bytes(None, 4 * GiB) == GiB and kv_ram_bytes("0", 4 * GiB) == 0


def _budget(kv_ram: str | None, device: str = "8GiB") -> compute.BudgetReport:
    # 4,096 cells: the most sequences that fit stay under llama.cpp's own limit of 256.
    return compute_budget(BudgetRequest("smollm2-135m", ctx=4096, device=device, kv_ram=kv_ram))


def test_on_shared_memory_the_tier_is_in_the_total() -> None:
    bare = _budget(None)
    assert bare.kv_ram_bytes == 0 and "KV RAM tier" not in _table(bare)
    auto = _budget("auto")
    left = bare.available_bytes - bare.total_bytes
    assert auto.kv_ram_bytes == default_kv_ram_bytes(left) > 0 and auto.kv_ram_counted
    assert auto.total_bytes == bare.total_bytes + auto.kv_ram_bytes and auto.fits
    assert auto.max_concurrency < bare.max_concurrency  # the tier's memory is not the slots'
    assert "KV RAM tier" in _table(auto) and "--kv-ram" in _table(auto)
    explicit = _budget("1GiB")
    assert explicit.kv_ram_bytes == GiB and explicit.total_bytes == bare.total_bytes + GiB
    assert _budget("0").kv_ram_bytes == 0


def test_on_a_gpu_the_tier_is_host_ram_beside_the_device_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = DeviceMemory("cuda:0", "cuda", 20 * GiB, 24 * GiB, "free GPU memory")
    monkeypatch.setattr(compute, "device_memory", lambda device="auto": gpu)
    monkeypatch.setattr(kv_tier, "cpu_memory", lambda: (6 * GiB, 16 * GiB))
    bare = _budget(None, "cuda")
    auto = _budget("auto", "cuda")
    assert auto.kv_ram_bytes == int(6 * GiB * 0.25) and not auto.kv_ram_counted
    assert (auto.total_bytes, auto.fits, auto.max_context) == (
        bare.total_bytes,
        bare.fits,
        bare.max_context,
    )
    assert "host RAM" in _table(auto)
    with pytest.raises(InvalidParameterError, match="--kv-ram 7GiB is more than the 6 GiB"):
        _budget("7GiB", "cuda")


def test_budget_cli_kv_ram(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["budget", "smollm2-135m", "--device", "8GiB", "--json"]
    assert main([*argv, "--kv-ram", "512MiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_ram_bytes"] == 512 * 2**20 and data["kv_ram_counted"] is True
    assert main([*argv, "--kv-ram", "lots"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: --kv-ram") and err.count("\n") == 1


def _table(report: compute.BudgetReport) -> str:
    console = Console(width=160, record=True)
    console.print(breakdown_table(report))
    return console.export_text()
