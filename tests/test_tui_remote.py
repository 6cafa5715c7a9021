"""`localinfer chat --url`: the real chat app (headless, through its pilot) attached to a real
`localinfer serve` app on 127.0.0.1 over the embedded model, instead of loading one itself.

Covered: an answer streams from the server into the conversation, with the figures the chat
measures and the server's engine panel; a missing or wrong API key, an unreachable address and a
model the server does not serve each end as one line saying what to do; a server that stops
mid-answer leaves the part that arrived in the conversation, marked as cut short.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator

import pytest

from localinfer.commands import chat as chat_command
from localinfer.conversations import ConversationStore
from localinfer.errors import InvalidParameterError
from localinfer.server import ServerThread, create_app
from localinfer.session import Session
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn, Notice
from localinfer.tui.memory_bar import render_memory
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.remote_host import MEMORY_MAX_AGE_S, RemoteHost
from localinfer.tui.remote_metrics import engine_metrics_from
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stats_panel import StatsPanel
from tests.test_server_support import client_for, make_session, serving
from tests.tui_pilot import SIZE, ForwardGate, wait_until

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    s = make_session(slots=1, ctx=1024)
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(session: Session) -> Iterator[ServerThread]:
    with serving(session) as srv:
        yield srv


@pytest.fixture
def store(tmp_path) -> ConversationStore:
    return ConversationStore(tmp_path / "conversations")


class RecordingApp(ChatApp):
    """The real app, also keeping the answer as it stood after each streamed piece."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.partials: list[str] = []

    def on_answer_delta(self, message) -> None:  # beside the app's own handler
        self.partials.append((self.partials[-1] if self.partials else "") + message.text)


def remote_app(url: str, store: ConversationStore, api_key: str | None = None, **settings):
    base = {"temperature": 0.0, "max_tokens": 8}
    host = RemoteHost(url, ChatSettings(**{**base, **settings}), api_key=api_key)
    return RecordingApp(host, store), host


async def send(pilot, text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    await pilot.press("enter")


def error_notices(app: ChatApp) -> list[str]:
    return [str(n.content) for n in app.query(Notice) if n.has_class("error")]


async def attached(pilot, app: ChatApp) -> None:
    await wait_until(pilot, lambda: app.host.loaded and not app.loading, timeout=60)


async def test_answer_streams_from_the_server(session, server, store):
    question = "What is the capital of France?"
    app, host = remote_app(server.url, store)
    async with app.run_test(size=SIZE) as pilot:
        await attached(pilot, app)
        assert f"served by {server.url}" in app.sub_title
        await send(pilot, question)
        await wait_until(pilot, lambda: not app.answering)
        await app.workers.wait_for_complete()
        await pilot.pause()
        answer = app.query(AnswerTurn).first().source
        # Streamed piece by piece, and the same greedy answer the server gives any client.
        assert app.partials and all(answer.startswith(p) for p in app.partials)
        assert len(app.partials[0]) < len(answer)
        direct = client_for(server).chat.completions.create(
            model=session.model.name,
            messages=[{"role": "user", "content": question}],
            max_tokens=8,
            temperature=0.0,
        )
        assert answer == direct.choices[0].message.content
        # The chat's own figures: TTFT and rate measured here, token counts from the server.
        stats = app.query_one(StatsPanel).answer_text
        ttft = next(line for line in stats.splitlines() if line.startswith("TTFT"))
        assert "—" not in ttft and "completion 8 tok" in stats
        assert f"prompt     {direct.usage.prompt_tokens} tok" in stats
        engine = str(app.query_one("#engine-stats").content)
        assert "KV cells" in engine and "/1024" in engine and "/1 busy" in engine
        assert app.memory_bar.figures.served_by == f"served by {server.url}"
        assert f"served by {server.url}" in render_memory(app.memory_bar.figures).plain
        assert [m.role for m in app.conversation.messages] == ["user", "assistant"]
        assert app.conversation.model == session.model.name
        assert store.load(app.conversation.id).messages == app.conversation.messages
        # What needs a model in this process says why it is not there.
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert len(app.screen_stack) == 1
    host.close()


@pytest.mark.parametrize("key", [None, "wrong-key"])
async def test_the_api_key_is_asked_for_in_one_line(session, store, key):
    with serving(session, api_key=KEY) as srv:
        app, host = remote_app(srv.url, store, api_key=key)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: bool(error_notices(app)), timeout=60)
            (notice,) = error_notices(app)
            assert notice.startswith(f"Could not attach to {srv.url}")
            assert "--api-key" in notice and "Traceback" not in notice
            assert ("missing API key" if key is None else "invalid API key") in notice
            assert not host.loaded
            # Nothing is sent while not attached: the text stays in the prompt.
            await send(pilot, "hello")
            await pilot.pause()
            assert app.query_one(PromptInput).text == "hello" and not app.query(AnswerTurn)
        host.close()
        right = RemoteHost(srv.url, ChatSettings(), api_key=KEY)
        right.load(right.settings)
        assert right.model_name() == session.model.name
        right.close()


async def test_an_unreachable_server_is_one_line(store):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    app, host = remote_app(url, store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(error_notices(app)), timeout=60)
        (notice,) = error_notices(app)
        assert notice.startswith(f"Could not attach to {url}: cannot reach {url}")
        assert "localinfer serve" in notice and "Traceback" not in notice
    host.close()


async def test_a_model_the_server_does_not_serve_lists_what_it_serves(session, server, store):
    app, host = remote_app(server.url, store, model="no-such-model")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(error_notices(app)), timeout=60)
        (notice,) = error_notices(app)
        assert "'no-such-model' is not served" in notice
        assert f"it serves {session.model.name}" in notice
    host.close()


async def test_a_server_stopping_mid_answer_keeps_the_part_that_arrived(
    session, store, monkeypatch
):
    gate = ForwardGate(session.engine.runner.forward)  # mid-stream however fast this machine is
    monkeypatch.setattr(session.engine.runner, "forward", gate)
    srv = ServerThread(create_app(session)).start()
    app, host = remote_app(srv.url, store, max_tokens=900, temperature=0.8)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "Write a very long story about a dragon and a knight.")
            await wait_until(
                pilot,
                lambda: gate.allow_one() or (app._answer is not None and bool(app._answer.source)),
            )
            # The process going away: uvicorn stops without waiting for the stream to end.
            srv.server.force_exit = True
            srv.stop()
            gate.open()
            await wait_until(pilot, lambda: not app.answering, timeout=60)
            await pilot.pause()
            answer = app.query(AnswerTurn).last()
            assert answer.source and answer.note == "⚠ cut short"
            (notice,) = error_notices(app)
            assert "broke off" in notice and "is kept" in notice and srv.url in notice
            assert app.conversation.messages[-1].role == "assistant"
            assert app.conversation.messages[-1].content == answer.source
            # The next message cannot reach it: one line, and the question back in the prompt.
            await send(pilot, "And then?")
            await wait_until(pilot, lambda: len(error_notices(app)) == 2, timeout=60)
            assert error_notices(app)[1].startswith(f"Not answered: cannot reach {srv.url}")
            assert app.query_one(PromptInput).text == "And then?"
            assert app.conversation.messages[-1].role == "assistant"
    finally:
        srv.stop()
        host.close()


def test_engine_figures_are_read_from_the_metrics_page():
    page = "\n".join(
        [
            "# TYPE localinfer_slots_total gauge",
            'localinfer_slots_total{model="a"} 4',
            'localinfer_slots_total{model="b"} 2',
            'localinfer_slots_busy{model="b"} 1',
            'localinfer_requests_total{finish_reason="stop"} 3',
            "localinfer_queue_depth 5",
            'localinfer_kv_cache_cells_used{model="b"} 100',
            'localinfer_kv_cache_cells_total{model="b"} 2048',
            'localinfer_spec_proposed_tokens_total{model="b"} 10',
        ]
    )
    m = engine_metrics_from(page, "b")
    assert m is not None
    assert (m.slots_total, m.slots_busy, m.queue_depth) == (2, 1, 5)
    assert (m.kv_cells_used, m.kv_cells_total, m.spec_proposed) == (100, 2048, 10)
    assert engine_metrics_from(page, "a") is None  # no busy slots or KV figures for "a"
    assert engine_metrics_from("not prometheus") is None


def _chat_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chat_command.register(parser.add_subparsers())
    return parser.parse_args(["chat", *argv])


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--url", "127.0.0.1:8000"], "--url"),
        (["--url", "ftp://example"], "--url"),
        (["--api-key", "k"], "--api-key"),
        (["--url", "http://127.0.0.1:8000", "--api-key", " "], "--api-key"),
    ],
)
def test_chat_url_flags_are_checked_before_anything_starts(argv, flag):
    with pytest.raises(InvalidParameterError, match=flag):
        chat_command.run(_chat_args(*argv))


def test_a_key_exported_for_serve_does_not_stop_a_local_chat(monkeypatch):
    monkeypatch.setenv(chat_command.API_KEY_ENV, "k")
    assert chat_command._api_key(_chat_args()) is None  # no --url: the chat runs its own model
    assert chat_command._api_key(_chat_args("--url", "http://127.0.0.1:8000")) == "k"


def test_a_v1_address_means_the_same_server():
    assert chat_command._remote_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


def test_the_memory_panel_shows_what_the_server_lists():
    import httpx

    card = {"id": "m", "object": "model", "state": "loaded", "budget_bytes": 3 << 30}
    card["device"] = "cpu"

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":  # read while attaching, for the engine panel
            return httpx.Response(404)
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"object": "list", "data": [card]})

    now = [0.0]
    transport = httpx.MockTransport(answer)
    host = RemoteHost("http://server", transport=transport, clock=lambda: now[0])
    host.load(host.settings)
    shown = render_memory(host.memory()).plain
    assert shown.splitlines() == ["served by http://server", "budget      3.0 GiB (loaded) on cpu"]
    del card["budget_bytes"]
    now[0] += MEMORY_MAX_AGE_S  # the list is read again once what the bar shows is this old
    assert "publishes no memory figures" in render_memory(host.memory()).plain
    host.close()


def _answer_to(body: str) -> list:
    import httpx

    from localinfer.tui.remote_stream import RemoteAnswer

    response = httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})
    return list(RemoteAnswer("r1", response))


def test_a_connection_cut_inside_an_event_ends_before_the_answer():
    delta = '{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}'
    cut = f"data: {delta}\n\n" + 'data: {"choices": [{"index": 0, "del'  # half a chunk
    *texts, end = _answer_to(cut)
    assert [e.text for e in texts] == ["Hel"]
    assert end.finish_reason == "error"
    assert end.error == "the server ended the stream before the answer"


def test_an_empty_event_is_skipped():
    delta = '{"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}'
    *texts, end = _answer_to(f"data:\n\ndata: \n\ndata: {delta}\n\ndata: [DONE]\n\n")
    assert [e.text for e in texts] == ["Hi"]
    assert (end.finish_reason, end.error) == ("stop", None)
