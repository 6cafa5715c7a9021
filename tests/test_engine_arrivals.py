# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""An idle engine waits for the requests its server is still reading, so a burst starts in one
step (engine/arrivals.py); the server counts each request until it reaches an engine or is
answered. The waits are forced: the bound is set far beyond the test, so only the count decides."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence

import httpx
import pytest

from localinfer.backends.base import SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine import arrivals as arrivals_module
from localinfer.engine.arrivals import Arrivals
from localinfer.server import ServerThread
from tests.test_engine import reference_greedy
from tests.test_engine_model import ByteTokenizer, HashRunner
from tests.test_server_support import server, session, wait_until  # noqa: F401 - fixtures


class RecordingRunner(HashRunner):
    """Records the slots of each forward."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots=slots)
        self.forwards: list[list[int]] = []

    def forward(self, batch: Sequence[SlotWork]) -> list:
        self.forwards.append([w.slot for w in batch])
        return super().forward(batch)


@pytest.fixture
def no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrivals_module, "GATHER_WAIT_S", 600.0)


def test_an_idle_engine_takes_a_burst_being_read_in_one_step(no_deadline: None) -> None:
    runner = RecordingRunner(slots=4)
    engine = Engine(runner, ByteTokenizer(), prefill_chunk=64)
    arrivals = Arrivals()
    engine.arrivals = arrivals
    try:
        reading = [arrivals.arrive() for _ in range(3)]
        reading[0].settle()
        first = engine.submit(Request([1, 2, 3], SamplingParams(max_tokens=4)))
        assert not runner.forwards  # two more are being read: nothing runs yet
        rest = []
        for i, arrival in enumerate(reading[1:]):
            rest.append(engine.submit(Request([4 + i, 5, 6], SamplingParams(max_tokens=4))))
            arrival.settle()
        answers = [h.result().token_ids for h in [first, *rest]]
    finally:
        engine.close()
    assert sorted(runner.forwards[0]) == [0, 1, 2]  # the three prompts in the first forward
    prompts = [[1, 2, 3], [4, 5, 6], [5, 5, 6]]
    assert [list(a) for a in answers] == [reference_greedy(p, 4) for p in prompts]
    assert arrivals.pending() == 0


def test_a_lone_request_waits_for_nothing(no_deadline: None) -> None:
    engine = Engine(HashRunner(slots=2), ByteTokenizer())
    engine.arrivals = Arrivals()
    done = threading.Event()
    try:
        handle = engine.submit(Request([1, 2], SamplingParams(max_tokens=3)))
        threading.Thread(target=lambda: (handle.result(), done.set()), daemon=True).start()
        assert done.wait(120)  # the bound only stops a broken test: the wait is 600 s
    finally:
        engine.close()


def test_an_arrival_settles_once() -> None:
    arrivals = Arrivals()
    one, two = arrivals.arrive(), arrivals.arrive()
    one.settle()
    one.settle()
    assert arrivals.pending() == 1
    two.settle()
    assert arrivals.pending() == 0


def test_the_server_counts_a_request_from_its_head_until_handed_over_or_answered(
    server: ServerThread,
) -> None:
    arrivals: Arrivals = server.server.config.app.state.arrivals
    wait_until(lambda: arrivals.pending() == 0, what="no request being read")
    httpx.get(f"{server.url}/health", timeout=60).raise_for_status()
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert arrivals.pending() == 0  # handed to the engine before the first byte went out
        r.read()
    assert arrivals.pending() == 0
    # A head whose body never comes: counted while the server waits for it, not after the
    # client goes.
    host, port = server.url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        wait_until(lambda: arrivals.pending() == 1, what="the head counted")
    wait_until(lambda: arrivals.pending() == 0, what="the closed connection settled")
