"""Admission counts free slots first: ``--slots N --max-queue Q`` accepts N + Q requests at once,
on an idle server too, whatever the engine thread is doing at the moment they arrive."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from localinfer.backends.base import SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.errors import QueueFullError
from localinfer.server import ServerThread
from localinfer.session import Session
from tests.test_engine_model import ByteTokenizer, HashRunner
from tests.test_server_load import LONG, send_raw
from tests.test_server_support import served_session, wait_idle, wait_until

SHORT_BODY = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}


# -- the engine's rule ----------------------------------------------------------------------------


def test_slots_plus_queue_are_accepted_before_any_step() -> None:
    engine = Engine(HashRunner(slots=4), ByteTokenizer(), background=False, max_queue=4)
    handles = [engine.submit(Request([i + 1], SamplingParams(max_tokens=2))) for i in range(8)]
    with pytest.raises(QueueFullError, match="busy"):
        engine.submit(Request([9], SamplingParams(max_tokens=2)))
    while engine.has_work():
        engine.step()
    assert [h.result().finish_reason for h in handles] == ["length"] * 8


def test_max_queue_0_takes_one_request_per_free_slot() -> None:
    engine = Engine(HashRunner(slots=2), ByteTokenizer(), background=False, max_queue=0)
    first = engine.submit_all([Request([1], SamplingParams(max_tokens=3)) for _ in range(2)])
    with pytest.raises(QueueFullError):
        engine.submit(Request([2], SamplingParams(max_tokens=3)))
    engine.step()  # both placed; still no free slot
    with pytest.raises(QueueFullError):
        engine.submit(Request([2], SamplingParams(max_tokens=3)))
    while engine.has_work():
        engine.step()
    assert all(h.result().finish_reason == "length" for h in first)
    assert engine.submit(Request([3], SamplingParams(max_tokens=1))).request_id


class SlowRunner(HashRunner):
    """A HashRunner whose forwards take a moment, so requests stay in their slots while other
    threads submit (a pace, not a measurement)."""

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        time.sleep(0.002)
        return super().forward(batch)


def test_submissions_racing_the_engine_thread_get_exactly_slots_plus_queue() -> None:
    engine = Engine(SlowRunner(slots=4, max_ctx=4096), ByteTokenizer(), max_queue=4)
    start = threading.Barrier(24)

    def submit(i: int) -> str | None:
        start.wait()
        try:
            return engine.submit(Request([i % 200 + 1], SamplingParams(max_tokens=4000))).request_id
        except QueueFullError:
            return None

    try:
        for _ in range(3):
            with ThreadPoolExecutor(24) as pool:
                ids = [rid for rid in pool.map(submit, range(24)) if rid is not None]
            assert len(ids) == 8  # nothing finished meanwhile: 4 slots + 4 queue places
            for rid in ids:
                engine.abort(rid)
            wait_until(lambda: not engine.has_work(), what="the aborted requests to leave")
    finally:
        engine.close()


# -- through the real server --------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_queue() -> Iterator[tuple[Session, ServerThread]]:
    with served_session(slots=4, ctx=256, max_queue=0) as pair:
        yield pair


def test_max_queue_0_serves_an_idle_server(no_queue: tuple[Session, ServerThread]) -> None:
    session, server = no_queue
    r = httpx.post(server.url + "/v1/completions", json=SHORT_BODY, timeout=120)
    assert r.status_code == 200, r.text


@contextmanager
def four_busy_slots(session: Session, server: ServerThread, word: str) -> Iterator[None]:
    """Four long answers hold the ``no_queue`` server's slots while the block runs."""
    wait_idle(session)
    socks = [
        send_raw(server, "/v1/completions", {"prompt": f"{word} {i}", **LONG}) for i in range(4)
    ]
    try:
        wait_until(lambda: session.engine.metrics().slots_busy == 4, what="4 busy slots")
        yield
    finally:
        for sock in socks:
            sock.close()
    wait_idle(session)


def test_max_queue_0_accepts_one_request_per_slot(no_queue: tuple[Session, ServerThread]) -> None:
    session, server = no_queue
    with four_busy_slots(session, server, "Story"):
        r = httpx.post(server.url + "/v1/completions", json=SHORT_BODY, timeout=120)
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy"


# One short request per generating API; ``stream`` is set per request.
API_BODIES: dict[str, dict] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/messages": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
}


def refusal(server: ServerThread, path: str, stream: bool, **fields: object) -> tuple[int, dict]:
    """Status and error of a request that must be refused before any answer starts: a JSON
    error, never a 200 event stream that carries it."""
    body = {**API_BODIES[path], **fields, "stream": stream}
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    if path == "/v1/messages":  # Anthropic's shape
        assert r.json()["type"] == "error" and error["message"]
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) >= 1
    return r.status_code, error


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_full_engine_refuses_every_api_with_503(
    no_queue: tuple[Session, ServerThread], stream: bool
) -> None:
    # Engine.stream raises QueueFullError at once: the route turns it into the status line.
    session, server = no_queue
    with four_busy_slots(session, server, "Fable"):
        for path in API_BODIES:
            status, error = refusal(server, path, stream)
            assert status == 503, (path, error)
            if path == "/v1/messages":
                assert error["type"] == "overloaded_error", error
            else:
                assert error["code"] == "server_busy", (path, error)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_prompt_past_the_context_is_400_on_every_api(
    no_queue: tuple[Session, ServerThread], stream: bool
) -> None:
    session, server = no_queue
    text = "word " * 400  # over the 256-token context
    long_prompt = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}]},
        "/v1/completions": {"prompt": text},
        "/v1/messages": {"messages": [{"role": "user", "content": text}]},
        "/v1/responses": {"input": text},
    }
    for path, fields in long_prompt.items():
        status, error = refusal(server, path, stream, **fields)
        assert status == 400, (path, error)
        # The words clients act on: OpenAI's (litellm, LangChain trim and retry) and
        # Anthropic's (Claude Code compacts the conversation).
        if path == "/v1/messages":
            assert error["message"].startswith("prompt is too long: "), error
        else:
            assert error["code"] == "context_length_exceeded", (path, error)
            assert error["message"].startswith("This model's maximum context length is 256"), error
            assert "(context_length_exceeded)" in error["message"], error
    assert session.engine.metrics().slots_busy == 0


@pytest.fixture(scope="module")
def four_and_four() -> Iterator[tuple[Session, ServerThread]]:
    with served_session(slots=4, ctx=256, max_queue=4) as pair:
        yield pair


def test_a_burst_of_slots_plus_queue_is_all_served(
    four_and_four: tuple[Session, ServerThread],
) -> None:
    session, server = four_and_four

    def post(i: int) -> int:
        body = {**SHORT_BODY, "prompt": f"Burst {i}"}
        return httpx.post(server.url + "/v1/completions", json=body, timeout=300).status_code

    for _ in range(3):
        wait_idle(session)
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(post, range(8))) == [200] * 8


def test_the_request_after_slots_plus_queue_gets_503(
    four_and_four: tuple[Session, ServerThread],
) -> None:
    session, server = four_and_four
    wait_idle(session)
    socks = [send_raw(server, "/v1/completions", {"prompt": f"Tale {i}", **LONG}) for i in range(8)]
    try:

        def full() -> bool:
            m = session.engine.metrics()
            return m.slots_busy == 4 and m.queue_depth == 4

        wait_until(full, what="4 busy slots and 4 waiting")
        r = httpx.post(server.url + "/v1/completions", json=SHORT_BODY, timeout=120)
        assert r.status_code == 503 and "retry-after" in r.headers
    finally:
        for sock in socks:
            sock.close()
    wait_idle(session)
