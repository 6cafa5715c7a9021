"""The model pool's waiters wake on the change they wait for (a lease given back, a load done or
failed, shutdown), notified by the thread that made it: no polling. A fake supply stands in for
the models (loads are instant, or held by a gate), so every step's order is the test's.

Timeouts here only stop a broken test from hanging: they are far below the pool's own wait, so
a waiter that is never notified fails the test instead of being rescued by its deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from localinfer.errors import LocalinferError
from localinfer.server.errors import APIError
from localinfer.server.memory_plan import BudgetNeed
from localinfer.server.model_pool import ModelPool, PoolSettings
from localinfer.server.pool_model import ModelSource
from localinfer.server.state_signal import StateSignal

POOL_WAIT_S = 600.0  # the pool's --load-wait: never reached by a passing test
HANG_S = 30.0  # a broken test's guard


class FakeSession:
    def __init__(self, name: str, log: list[str]) -> None:
        self.model = SimpleNamespace(name=name, path=Path(f"/models/{name}.gguf"))
        self.busy = 0  # requests its engine still runs
        self.engine = SimpleNamespace(metrics=self._metrics)
        self._log = log

    def _metrics(self) -> SimpleNamespace:
        return SimpleNamespace(slots_busy=self.busy, queue_depth=0)

    def close(self) -> None:
        self._log.append(f"close {self.model.name}")


class FakeSupply:
    """Models "a" and "b", each 60 of a memory of 100: only one fits."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.sessions: dict[str, FakeSession] = {}
        self.gates: dict[str, threading.Event] = {}
        self.failing: set[str] = set()

    def find(self, name: str) -> ModelSource | None:
        return ModelSource(key=name, id=name, spec=name) if name in ("a", "b") else None

    def listed(self) -> list[ModelSource]:
        return [ModelSource(key=n, id=n, spec=n) for n in ("a", "b")]

    def need(self, source: ModelSource) -> BudgetNeed:
        return BudgetNeed(device="cpu", bytes=60, capacity=100)

    def open(self, source: ModelSource) -> FakeSession:
        gate = self.gates.get(source.spec)
        if gate is not None:
            assert gate.wait(HANG_S)
        if source.spec in self.failing:
            self.log.append(f"failed {source.spec}")
            raise LocalinferError(f"{source.spec} is broken")
        self.log.append(f"open {source.spec}")
        session = self.sessions[source.spec] = FakeSession(source.spec, self.log)
        return session


def pool_with_a_loaded(supply: FakeSupply) -> ModelPool:
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None, wait_s=POOL_WAIT_S))
    source = supply.find("a")
    assert source is not None
    pool.start([source])
    return pool


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(HANG_S / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_waiter_wakes_when_the_lease_in_its_way_is_released() -> None:
    supply = FakeSupply()
    pool = pool_with_a_loaded(supply)
    lease = await pool.acquire("a")
    waiter = asyncio.create_task(pool.acquire("b"))
    await until(lambda: pool._changes.waiting == 1, "the request for b to park")
    assert not waiter.done() and supply.log == ["open a"]  # a is in use: b may not load yet
    supply.log.append("released a")
    lease.release()
    b = await asyncio.wait_for(waiter, HANG_S)
    assert b.id == "b"
    assert supply.log == ["open a", "released a", "close a", "open b"]
    b.release()
    pool.close()


async def test_an_engine_winding_down_is_looked_at_again() -> None:
    """A client that left frees its lease before the engine ends its request; the engine tells
    the pool nothing, so the waiter looks again until the engine is idle."""
    supply = FakeSupply()
    pool = pool_with_a_loaded(supply)
    lease = await pool.acquire("a")
    supply.sessions["a"].busy = 1
    waiter = asyncio.create_task(pool.acquire("b"))
    await until(lambda: pool._changes.waiting == 1, "the request for b to park")
    lease.release()
    await asyncio.sleep(0.2)  # several looks: a is still finishing, so b still waits
    assert not waiter.done() and supply.log == ["open a"]
    supply.sessions["a"].busy = 0  # no notification: only a second look finds it idle
    b = await asyncio.wait_for(waiter, HANG_S)
    assert supply.log == ["open a", "close a", "open b"]
    b.release()
    pool.close()


async def test_every_waiter_on_a_load_hears_that_it_failed() -> None:
    supply = FakeSupply()
    supply.gates["b"] = threading.Event()
    supply.failing.add("b")
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None, wait_s=POOL_WAIT_S))
    waiters = [asyncio.create_task(pool.load("b")) for _ in range(2)]
    await until(lambda: pool._changes.waiting == 2, "both requests to park on the load")
    supply.gates["b"].set()
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), HANG_S)
    assert supply.log == ["failed b"]  # one load for both
    for result in results:
        assert isinstance(result, APIError) and "b is broken" in str(result)
    pool.close()


async def test_a_waiter_parked_before_a_load_that_failed_hears_of_it() -> None:
    """A request parked while its model could not load yet (memory) may never see the LOADING
    state of a load another request started, when that load fails before it looks again: it
    answers with that failure instead of loading once more."""
    supply = FakeSupply()
    pool = pool_with_a_loaded(supply)
    lease = await pool.acquire("a")
    supply.failing.add("b")
    waiter = asyncio.create_task(pool.acquire("b"))
    await until(lambda: pool._changes.waiting == 1, "the request for b to park")
    # Blocking this loop, so the parked request looks again only after the whole failed load:
    # another loop's request (in a thread) frees a, loads b and fails.
    lease.release()
    other: list[BaseException] = []

    def load_b_elsewhere() -> None:
        try:
            asyncio.run(pool.load("b"))
        except APIError as exc:
            other.append(exc)

    elsewhere = threading.Thread(target=load_b_elsewhere)
    elsewhere.start()
    elsewhere.join(HANG_S)
    assert len(other) == 1 and supply.log == ["open a", "close a", "failed b"]
    with pytest.raises(APIError, match="b is broken"):
        await asyncio.wait_for(waiter, HANG_S)
    assert supply.log == ["open a", "close a", "failed b"]  # no second load
    pool.close()


async def test_shutdown_wakes_waiters_with_a_503() -> None:
    supply = FakeSupply()
    supply.gates["b"] = threading.Event()
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None, wait_s=POOL_WAIT_S))
    waiter = asyncio.create_task(pool.acquire("b"))
    await until(lambda: pool._changes.waiting == 1, "the request to park on the load")
    pool.close()
    with pytest.raises(APIError) as refused:
        await asyncio.wait_for(waiter, HANG_S)
    assert refused.value.status == 503
    supply.gates["b"].set()


async def test_the_signal_keeps_a_change_made_before_the_waiter_parks() -> None:
    signal = StateSignal()
    seen = signal.version
    signal.notify()  # between a look at the state and the wait
    assert await signal.wait(seen, POOL_WAIT_S) is True
    assert await signal.wait(signal.version, 0.01) is False  # nothing new: its timeout


async def test_the_signal_wakes_a_waiter_from_another_thread() -> None:
    signal = StateSignal()
    seen = signal.version
    parked = asyncio.create_task(signal.wait(seen, POOL_WAIT_S))
    await until(lambda: signal.waiting == 1, "the waiter to park")
    threading.Thread(target=signal.notify).start()
    assert await asyncio.wait_for(parked, HANG_S) is True
    assert signal.waiting == 0
