"""The multi-model server's load plan and its flags, without a server: which idle models a load
unloads (least recently used first), what it refuses with the numbers, and `--keep-alive`."""

from __future__ import annotations

import pytest

from localinfer.commands.serve import parse_keep_alive
from localinfer.errors import InvalidParameterError, OutOfMemoryBudgetError
from localinfer.server.memory_plan import BudgetNeed, Holder, plan_load


def need(n: int, cap: int = 100) -> BudgetNeed:
    return BudgetNeed("cpu", n, cap, f"m at {n}")


def test_plan_unloads_idle_models_least_recently_used_first() -> None:
    holders = [Holder("a", need(40), last_used=3.0), Holder("b", need(40), last_used=1.0)]
    assert plan_load("c", need(30), holders).victims == ("b",)
    assert plan_load("c", need(70), holders).victims == ("b", "a")
    assert plan_load("c", need(20), holders).victims == ()
    busy = [Holder("a", need(40), 3.0, "1 request in flight"), holders[1]]
    plan = plan_load("c", need(70), busy)
    assert plan.blocked and "1 request in flight" in plan.blocked and not plan.victims
    other_device = [Holder("x", BudgetNeed("cuda:0", 90, 100), 0.0, "2 requests in flight")]
    assert plan_load("c", need(90), other_device).victims == ()


def test_plan_refuses_what_can_never_fit_with_the_numbers() -> None:
    with pytest.raises(OutOfMemoryBudgetError, match="needs 120 B but cpu holds 100 B"):
        plan_load("c", need(120), [])
    pinned = [Holder("a", need(60), 0.0, "pinned")]
    with pytest.raises(OutOfMemoryBudgetError, match="pinned models hold 60 B"):
        plan_load("c", need(50), pinned)


def test_keep_alive_durations() -> None:
    assert parse_keep_alive("5m") == 300.0 and parse_keep_alive("30s") == 30.0
    assert parse_keep_alive("1h") == 3600.0 and parse_keep_alive("250ms") == 0.25
    assert parse_keep_alive("2") == 2.0 and parse_keep_alive("0") == 0.0
    assert parse_keep_alive("-1") is None
    with pytest.raises(InvalidParameterError, match="--keep-alive"):
        parse_keep_alive("soon")
