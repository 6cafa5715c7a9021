# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Many clients at once, clients that go away, and a full queue, on the real embedded model."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import openai
import pytest

from localinfer.engine import Request, SamplingParams
from localinfer.server import ServerThread
from localinfer.session import Session
from tests.engine_gate import engine_held
from tests.test_server_support import (  # noqa: F401 - fixtures
    client,
    model_name,
    served_session,
    server,
    session,
    sse_lines,
    wait_idle,
    wait_until,
)

TOPICS = ["cats", "rain", "chess", "bread", "rivers", "maths", "music", "trains"]


def prompts(n: int) -> list[list[dict]]:
    # A short system message keeps the template's long default one out (less prefill).
    return [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Say something about {TOPICS[i % 8]}, idea {i // 8}."},
        ]
        for i in range(n)
    ]


def send_raw(server: ServerThread, path: str, body: dict) -> socket.socket:
    """Send a request and return the open socket without reading the answer (a client that
    will hang up)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection((server.host, server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock.sendall(head + payload)
    return sock


def scrape(server: ServerThread, sample: str) -> float:
    """One sample's value from GET /metrics."""
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    raise AssertionError(f"{sample} not in /metrics")


LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}


# Four clients per slot: every slot is reused from the queue several times over (16 distinct
# conversations; 32 proved no more and cost twice the solo runs and the streams).
STREAMS = 16


async def test_16_streams_on_4_slots_match_solo_runs(
    server: ServerThread, session: Session, model_name: str
) -> None:
    conversations = prompts(STREAMS)
    max_tokens = 5
    # The same prompts run alone, one at a time, straight through the engine.
    solo = []
    for messages in conversations:
        ids = session.chat_prompt_ids(messages)
        solo.append(
            session.engine.generate(Request(ids, SamplingParams(max_tokens=max_tokens))).text
        )
    assert len(set(solo)) > 8, "prompts too alike to show cross-talk"
    before = session.engine.metrics()

    aclient = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )

    async def one(messages: list[dict]) -> tuple[str, str | None]:
        stream = await aclient.chat.completions.create(
            model=model_name,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        text, finish = [], None
        async for chunk in stream:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        return "".join(text), finish

    results = await asyncio.gather(*(one(m) for m in conversations))
    await aclient.close()

    assert [text for text, _ in results] == solo
    assert all(finish in ("stop", "length") for _, finish in results)
    wait_idle(session)
    after = session.engine.metrics()
    assert after.slots_busy == 0 and after.queue_depth == 0
    assert after.requests_finished - before.requests_finished == STREAMS
    assert after.finish_reasons.get("abort", 0) == before.finish_reasons.get("abort", 0)


def test_disconnect_mid_stream_frees_the_slot(
    server: ServerThread, session: Session, client: openai.OpenAI, model_name: str
) -> None:
    wait_idle(session)
    before = session.engine.metrics()
    disconnects = scrape(server, "localinfer_client_disconnects_total")
    body = {"model": model_name, "messages": prompts(1)[0], "stream": True, **LONG}
    # Three forwards (the prompt, two decodes) give the role chunk and two content chunks; the
    # engine then waits, so the request is mid-answer however fast this machine is.
    with engine_held(session.engine, free=3) as gate:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            # Held in a name: a line iterator dropped mid-body closes the connection.
            lines, seen = r.iter_lines(), 0
            for line in lines:
                seen += line.startswith("data: ")
                if seen >= 3:  # role chunk + two content chunks: the request holds a slot
                    break
            gate.wait_held()
            assert session.engine.metrics().slots_busy == 1
        # The connection is closed here, mid-answer; the server notices while the engine waits.
        wait_until(
            lambda: scrape(server, "localinfer_client_disconnects_total") == disconnects + 1,
            what="the disconnect to be counted",
        )
    wait_idle(session)
    after = session.engine.metrics()
    assert after.finish_reasons.get("abort", 0) == before.finish_reasons.get("abort", 0) + 1
    generated = after.completion_tokens_total - before.completion_tokens_total
    assert generated <= 4  # stopped at the gate's step, not run to the end
    # And the server keeps serving.
    reply = client.chat.completions.create(
        model=model_name, messages=prompts(1)[0], max_tokens=2, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_disconnect_before_a_non_streaming_answer_frees_the_slot(
    server: ServerThread, session: Session, model_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    wait_idle(session)
    before = session.engine.metrics()
    disconnects = scrape(server, "localinfer_client_disconnects_total")
    body = {"model": model_name, "prompt": "Once upon a time", **LONG}
    # Its (short) prompt is prefilled and tokens are being generated when the client leaves.
    with engine_held(session.engine, free=4) as gate:
        sock = send_raw(server, "/v1/completions", body)
        gate.wait_held()
        sock.close()
        wait_until(
            lambda: scrape(server, "localinfer_client_disconnects_total") == disconnects + 1,
            what="the disconnect to be counted",
        )
    wait_idle(session)
    after = session.engine.metrics()
    assert after.finish_reasons.get("abort", 0) == before.finish_reasons.get("abort", 0) + 1
    assert after.completion_tokens_total - before.completion_tokens_total <= 5
    assert server_errors(caplog) == []


@pytest.fixture(scope="module")
def tiny_server() -> tuple[Session, ServerThread]:
    """One slot and one queue place, so a third request finds the queue full."""
    with served_session(slots=1, ctx=256, max_queue=1) as pair:
        yield pair


def test_full_queue_answers_503_with_retry_after(tiny_server: tuple[Session, ServerThread]) -> None:
    session, server = tiny_server
    name = session.model.name
    with engine_held(session.engine, free=2) as gate:  # "One" holds the slot while the test runs
        running = send_raw(server, "/v1/completions", {"model": name, "prompt": "One", **LONG})
        gate.wait_held()
        queued = send_raw(server, "/v1/completions", {"model": name, "prompt": "Two", **LONG})
        wait_until(lambda: session.engine.metrics().queue_depth == 1, what="the queue to fill")

        r = httpx.post(
            server.url + "/v1/completions", json={"model": name, "prompt": "Three", "max_tokens": 1}
        )
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "server_busy" and "queue" in err["message"]

        running.close()
        queued.close()
    wait_idle(session)
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": name, "prompt": "Three", "max_tokens": 1, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 1


def test_disconnect_while_queued_is_counted_and_frees_the_place(
    tiny_server: tuple[Session, ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    session, server = tiny_server
    wait_idle(session)
    name = session.model.name
    before = session.engine.metrics()
    disconnects = scrape(server, "localinfer_client_disconnects_total")

    def disconnects_counted(n: int) -> None:
        wait_until(
            lambda: scrape(server, "localinfer_client_disconnects_total") == disconnects + n,
            what=f"{n} disconnects to be counted",
        )

    with engine_held(session.engine, free=2) as gate:  # "One" holds the slot while the test runs
        running = send_raw(server, "/v1/completions", {"model": name, "prompt": "One", **LONG})
        gate.wait_held()
        assert session.engine.metrics().slots_busy == 1
        queued = send_raw(server, "/v1/completions", {"model": name, "prompt": "Two", **LONG})
        wait_until(lambda: session.engine.metrics().queue_depth == 1, what="the queue to fill")
        queued.close()
        disconnects_counted(1)
        gate.advance()  # one step: the queued request is dropped, the running one decodes on
        assert session.engine.metrics().queue_depth == 0
        assert session.engine.metrics().slots_busy == 1  # the running answer is untouched
        running.close()
        disconnects_counted(2)
    wait_idle(session)
    after = session.engine.metrics()
    assert after.finish_reasons.get("abort", 0) == before.finish_reasons.get("abort", 0) + 2
    assert server_errors(caplog) == []
