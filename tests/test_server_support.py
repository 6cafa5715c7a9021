"""Shared set-up for the server tests: the real embedded model behind a real uvicorn socket.

The other tests/test_server_*.py files import from here (``from tests.test_server_support
import ...``); the checks at the bottom keep the helpers themselves honest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest

from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session

# Every server test runs greedy or seeded, with short answers: 2 shared cores.
SHORT = 8


def make_session(
    slots: int = 4, ctx: int = 512, max_queue: int = 64, backend: str = "torch"
) -> Session:
    # The torch runner on the file's blocks (the suite pins its kernels: conftest): a sequence's
    # logits do not depend on what else is in the batch, which the seeded-reproducibility and
    # route-equality tests need, on every machine (the default backend differs by CPU, and
    # llama.cpp's logits move with the batch's shape). One backend thread: a shared CPU.
    return open_session(
        None, backend=backend, slots=slots, ctx=ctx, max_queue=max_queue, threads=1,
        prefix_reuse=True,
    )  # fmt: skip


@contextmanager
def serving(session: Session, **app_options: object) -> Iterator[ServerThread]:
    with ServerThread(create_app(session, **app_options)) as server:  # type: ignore[arg-type]
        yield server


@contextmanager
def served_session(slots: int, ctx: int, max_queue: int) -> Iterator[tuple[Session, ServerThread]]:
    """A session of its own (make_session) behind a server of its own."""
    s = make_session(slots=slots, ctx=ctx, max_queue=max_queue)
    with serving(s) as srv:
        yield s, srv
    s.close()


def client_for(server: ServerThread, api_key: str = "unused", **options: object) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=300, **options
    )


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Poll ``predicate`` (a behaviour check, not a timing assertion: the timeout only stops a
    broken test from hanging)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def wait_idle(session: Session, timeout: float = 120.0) -> None:
    def idle() -> bool:
        m = session.engine.metrics()
        return m.slots_busy == 0 and m.queue_depth == 0

    wait_until(idle, timeout, "every slot free and the queue empty")


def sse_lines(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order."""
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    s = make_session()
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(session: Session) -> Iterator[ServerThread]:
    with serving(session) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return client_for(server)


@pytest.fixture(scope="module")
def model_name(session: Session) -> str:
    return session.model.name


def test_server_thread_binds_a_free_port_and_stops(session: Session) -> None:
    with serving(session) as srv:
        assert srv.host == "127.0.0.1" and srv.port > 0
        health = httpx.get(srv.url + "/health").json()
        assert health["status"] == "ok" and health["slots_total"] == 4
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/health")


def test_sse_lines_reads_data_payloads() -> None:
    body = b'data: {"a":1}\n\n: comment\n\ndata: [DONE]\n\n'
    response = httpx.Response(200, content=body)
    assert sse_lines(response) == ['{"a":1}', "[DONE]"]
