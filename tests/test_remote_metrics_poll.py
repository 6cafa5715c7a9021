"""`chat --url`: the server's /metrics is read off the answer path, and /v1/models no more often
than the memory bar needs.

A small real HTTP server on 127.0.0.1 stands in for `localinfer serve`: its /metrics can be held
(blocked until the test lets it go) and its chat completion streams only once a /metrics read is
held, so every token crosses the wire while the engine figures cannot arrive. The answer must
still come whole, with the figures read before it (a blocking read would give none).
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from localinfer.engine.types import EngineMetrics, SamplingParams
from localinfer.tui.answer_source import PreparedPrompt
from localinfer.tui.live_stats import LiveStats, StatsSnapshot
from localinfer.tui.remote_host import MEMORY_MAX_AGE_S, RemoteHost
from localinfer.tui.remote_poll import MetricsPoller
from localinfer.tui.stream_pump import pump_answer
from tests.test_server_support import wait_until

HANG_S = 30.0  # only stops a broken test from hanging
TOKENS = [f"tok{i} " for i in range(12)]


class FakeServe:
    """What the chat reads from `localinfer serve`, with a /metrics that can be held."""

    def __init__(self) -> None:
        self.hold_metrics = False
        self.release = threading.Event()  # lets held /metrics reads answer
        self.metrics_held = threading.Event()  # a /metrics read is being held now
        self.metrics_reads = 0
        self.model_reads = 0
        self.budget = 1 << 30

    def metrics_page(self) -> str:
        self.metrics_reads += 1
        gauges = {"slots_total": 1, "slots_busy": 0, "queue_depth": 0}
        gauges |= {"kv_cache_cells_used": self.metrics_reads, "kv_cache_cells_total": 256}
        return "".join(f"localinfer_{name} {value}\n" for name, value in gauges.items())

    def models_page(self) -> dict:
        self.model_reads += 1
        card = {"id": "m", "object": "model", "state": "loaded", "device": "cpu"}
        return {"object": "list", "data": [card | {"budget_bytes": self.budget}]}

    def chat_events(self) -> Iterator[str]:
        def chunk(delta: dict, finish: str | None = None) -> dict:
            return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield json.dumps(chunk({"role": "assistant"}))
        for token in TOKENS:
            yield json.dumps(chunk({"content": token}))
        yield json.dumps(chunk({}, "stop"))
        usage = {"prompt_tokens": 5, "completion_tokens": len(TOKENS), "total_tokens": 17}
        yield json.dumps({"choices": [], "usage": usage})
        yield "[DONE]"


def handler_for(serve: FakeServe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the stream ends when the connection closes

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/metrics":
                if serve.hold_metrics:
                    serve.metrics_held.set()
                    serve.release.wait(HANG_S)
                self._send(200, "text/plain", serve.metrics_page().encode())
            elif self.path == "/v1/models":
                self._send(200, "application/json", json.dumps(serve.models_page()).encode())
            else:
                self._send(404, "application/json", b'{"error": {"message": "no such route"}}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            # Not one token before the engine figures are stuck behind a held /metrics read
            # (`serve` sends its headers with the first event: after the prefill).
            assert serve.metrics_held.wait(HANG_S)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for data in serve.chat_events():
                self.wfile.write(f"data: {data}\r\n\r\n".encode())
                self.wfile.flush()

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def fake_serve() -> Iterator[tuple[FakeServe, str]]:
    serve = FakeServe()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(serve))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield serve, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        serve.release.set()
        httpd.shutdown()
        httpd.server_close()


class RecordingSink:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.engines: list[EngineMetrics | None] = []

    def text(self, delta: str) -> None:
        self.texts.append(delta)

    def stats(self, snapshot: StatsSnapshot, engine: EngineMetrics | None) -> None:
        self.engines.append(engine)


def test_tokens_all_arrive_while_metrics_is_held() -> None:
    with fake_serve() as (serve, url):
        host = RemoteHost(url)
        host.load(host.settings)
        before = host.engine_metrics()  # read while attaching
        assert before is not None and before.kv_cells_used == 1
        serve.hold_metrics = True
        prompt = PreparedPrompt([{"role": "user", "content": "Hi"}])
        events = host.stream(prompt, SamplingParams(max_tokens=len(TOKENS)), "r1")
        sink = RecordingSink()
        # Engine figures asked for after every token, as often as the pump ever would.
        end = pump_answer("r1", events, LiveStats(), sink, host.engine_metrics, stats_interval=0)
        assert end.finish_reason == "stop" and end.text == "".join(TOKENS)
        assert "".join(sink.texts) + end.tail == end.text
        assert serve.metrics_held.is_set() and not serve.release.is_set()  # still held
        # The pump's figures were the last ones read, every time: none waited for the server.
        assert sink.engines and all(e == before for e in sink.engines) and end.engine == before
        assert end.stats.completion_tokens == len(TOKENS)
        serve.release.set()
        wait_until(lambda: (host.engine_metrics() or before).kv_cells_used > 1, HANG_S, "a read")
        host.close()


def test_the_memory_bar_reads_the_model_list_only_when_its_figures_are_old() -> None:
    now = [0.0]
    with fake_serve() as (serve, url):
        host = RemoteHost(url, clock=lambda: now[0])
        host.load(host.settings)
        assert serve.model_reads == 1
        for _ in range(3):  # after each answer
            assert host.memory().served_budget == 1 << 30
        assert serve.model_reads == 1  # what attaching read still stands
        serve.budget = 2 << 30  # the server reloaded the model at other settings
        now[0] += MEMORY_MAX_AGE_S
        assert host.memory().served_budget == 2 << 30
        assert serve.model_reads == 2
        host.close()


def figures_with(kv_cells_used: int) -> EngineMetrics:
    return EngineMetrics(
        slots_total=1, slots_busy=0, queue_depth=0, kv_cells_used=kv_cells_used,
        kv_cells_total=256, requests_finished=0, prompt_tokens_total=0, completion_tokens_total=0,
    )  # fmt: skip


def test_a_failing_read_keeps_the_last_figures_and_the_poller_goes_on() -> None:
    first, later = figures_with(3), figures_with(4)
    outcomes: list[object] = [first, OSError("connection reset"), later]
    failed = threading.Event()

    def fetch() -> EngineMetrics | None:
        outcome = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        if isinstance(outcome, Exception):
            failed.set()
            raise outcome
        return outcome  # type: ignore[return-value]

    poller = MetricsPoller(fetch, interval_s=0.01)
    assert poller.poll_now() == first
    assert poller.poll_now() == first  # the failure is no exception, and blanks nothing
    assert failed.is_set()
    poller.begin()
    wait_until(lambda: poller.latest() == later, HANG_S, "the reads after the failure")
    poller.end()
    poller.close()


def test_a_server_without_figures_is_none() -> None:
    poller = MetricsPoller(lambda: None)
    assert poller.poll_now() is None
    poller.close()


def test_a_slow_read_never_overwrites_a_newer_one() -> None:
    """Attaching's read may answer after the poll thread's first one: the newer stands."""
    old, new = figures_with(1), figures_with(2)
    slow_started, slow_go = threading.Event(), threading.Event()
    calls = [0]

    def fetch() -> EngineMetrics | None:
        calls[0] += 1
        if calls[0] == 1:  # the first read started, answered last
            slow_started.set()
            assert slow_go.wait(HANG_S)
            return old
        return new

    poller = MetricsPoller(fetch)
    slow = threading.Thread(target=poller.poll_now)
    slow.start()
    assert slow_started.wait(HANG_S)
    assert poller.poll_now() == new  # started after the slow one, answered first
    slow_go.set()
    slow.join(HANG_S)
    assert poller.latest() == new
    poller.close()


def test_a_metrics_page_that_fails_keeps_the_engine_panel() -> None:
    import httpx

    gauges = {"slots_total": 1, "slots_busy": 0, "queue_depth": 0}
    gauges |= {"kv_cache_cells_used": 7, "kv_cache_cells_total": 256}
    pages = ["".join(f"localinfer_{name} {value}\n" for name, value in gauges.items())]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=pages[0]) if pages else httpx.Response(500)
        card = {"id": "m", "object": "model", "state": "loaded"}
        return httpx.Response(200, json={"object": "list", "data": [card]})

    host = RemoteHost("http://server", transport=httpx.MockTransport(answer))
    host.load(host.settings)  # reads /metrics once
    shown = host.engine_metrics()
    assert shown is not None and shown.kv_cells_used == 7
    pages.clear()  # the server's /metrics now answers 500
    assert host._poller.poll_now() == shown
    assert host.engine_metrics() == shown
    host.close()


def sse_host(body: str) -> RemoteHost:
    """A host whose server streams ``body`` as its chat completion (no /metrics page)."""
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        if request.url.path == "/v1/models":
            card = {"id": "m", "object": "model", "state": "loaded"}
            return httpx.Response(200, json={"object": "list", "data": [card]})
        return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})

    host = RemoteHost("http://server", transport=httpx.MockTransport(answer))
    host.load(host.settings)
    return host


def chat_stream(*deltas: str) -> str:
    chunks = [{"choices": [{"index": 0, "delta": {"content": d}}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_an_answer_never_iterated_ends_its_polling_when_dropped() -> None:
    host = sse_host(chat_stream("a", "b"))
    prompt = PreparedPrompt([{"role": "user", "content": "Hi"}])
    events = host.stream(prompt, SamplingParams(max_tokens=4), "r1")
    assert host._poller._answers == 1  # polling from the request on: the prefill's figures
    del events  # never iterated (a caller that failed before it could)
    gc.collect()
    assert host._poller._answers == 0 and host._answers == {}
    host.close()


def test_every_answer_started_ends_its_polling_once() -> None:
    host = sse_host(chat_stream("a", "b"))
    prompt = PreparedPrompt([{"role": "user", "content": "Hi"}])
    whole = host.stream(prompt, SamplingParams(max_tokens=4), "r1")
    assert "".join(e.text for e in whole) == "ab"
    assert host._poller._answers == 0 and host._answers == {}
    assert list(whole) == []  # a response is read once
    abandoned = iter(host.stream(prompt, SamplingParams(max_tokens=4), "r2"))
    assert next(abandoned).text == "a"
    assert host._poller._answers == 1  # polling while it streams
    del abandoned  # the caller stops iterating half way
    gc.collect()
    assert host._poller._answers == 0 and host._answers == {}
    closed = host.stream(prompt, SamplingParams(max_tokens=4), "r3")
    closed.close()  # type: ignore[attr-defined]
    assert list(closed) == [] and host._poller._answers == 0 and host._answers == {}
    host.close()
