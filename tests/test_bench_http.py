"""The HTTP load generator against scripted OpenAI-style streams (httpx.MockTransport): token
counting from usage or from chunks, errors, concurrency; and against a real `localinfer serve`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys

import httpx
import pytest

from localinfer.bench.loadgen import LoadPlan, run_level, run_levels
from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.targets import HttpTarget, api_base

PROMPT = BenchPrompt("p", "short", ({"role": "user", "content": "Hi"},))

# The PNG is optional (matplotlib is the `plot` extra); the figures are not.
HAS_PLOT = importlib.util.find_spec("matplotlib") is not None


def sse_body(*events: object) -> bytes:
    out = []
    for ev in events:
        out.append(f"data: {ev if isinstance(ev, str) else json.dumps(ev)}\n\n")
    return "".join(out).encode()


def chunk(text: str | None = None, finish: str | None = None) -> dict:
    delta = {"content": text} if text is not None else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def target_for(handler) -> HttpTarget:  # noqa: ANN001
    return HttpTarget("http://bench.test", model="m", transport=httpx.MockTransport(handler))


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_api_base() -> None:
    assert api_base("http://h:1") == "http://h:1/v1"
    assert api_base("http://h:1/v1/") == "http://h:1/v1"


def test_counts_text_chunks_when_the_server_sends_no_usage() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = sse_body(chunk(""), chunk("Hel"), chunk("lo"), chunk("!"), chunk(finish="stop"),
                        "[DONE]")  # fmt: skip
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    target = target_for(handler)
    record = run(target.run(PROMPT, 16))
    assert record.ok and record.output_tokens == 3 and record.token_source == "chunks"
    assert 0 <= record.ttft_s <= record.last_token_s <= record.e2e_s
    body = seen[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "m" and body["max_tokens"] == 16
    assert body["messages"] == [{"role": "user", "content": "Hi"}]


def test_prefers_the_usage_chunk() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
        body = sse_body(chunk("ab"), chunk("cd", "length"), usage, "[DONE]")
        return httpx.Response(200, content=body)

    record = run(target_for(handler).run(PROMPT, 5))
    assert record.ok and (record.output_tokens, record.prompt_tokens) == (5, 9)
    assert record.token_source == "usage"


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(503, json={"error": {"message": "queue full"}}), "HTTP 503: queue full"),
        (httpx.Response(200, content=sse_body(chunk("a"))), "without a finish_reason"),
        (httpx.Response(200, content=sse_body({"error": {"message": "boom"}})), "boom"),
    ],
)
def test_failures_are_records_not_exceptions(response: httpx.Response, error: str) -> None:
    record = run(target_for(lambda request: response).run(PROMPT, 4))
    assert not record.ok and error in record.error


def test_unreachable_server_is_an_error_record() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    record = run(target_for(handler).run(PROMPT, 4))
    assert not record.ok and "ConnectError" in record.error


def test_model_name_comes_from_the_server() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"data": [{"id": "served-name"}, {"id": "other"}]})

    target = HttpTarget("http://bench.test", transport=httpx.MockTransport(handler))
    assert run(target.resolve_model()) == "served-name"


def test_closed_loop_keeps_exactly_c_requests_in_flight() -> None:
    in_flight = peak = 0
    order: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        order.append(json.loads(request.content)["messages"][0]["content"])
        for _ in range(3):
            await asyncio.sleep(0)  # let the other clients send theirs
        in_flight -= 1
        return httpx.Response(200, content=sse_body(chunk("x"), chunk("y", "stop")))

    prompts = [BenchPrompt(str(i), "short", ({"role": "user", "content": str(i)},))
               for i in range(3)]  # fmt: skip
    target = HttpTarget("http://b.test", model="m", transport=httpx.MockTransport(handler))
    level = run(run_level(target, prompts, concurrency=3, requests=7, max_tokens=2))
    assert peak == 3 and len(level.records) == 7 and level.errors == 0
    assert sorted(order) == sorted(["0", "1", "2", "0", "1", "2", "0"])
    assert [r.prompt_id for r in level.records] == ["0", "1", "2", "0", "1", "2", "0"]
    assert level.output_tokens == 14

    peak = 0
    plan = LoadPlan(prompts, [1, 4], requests=2, max_tokens=2, warmup=1)
    levels = run(run_levels(target, plan))
    assert [len(lv.records) for lv in levels] == [2, 4]  # a level sends at least c requests
    assert peak == 4


# -- a real server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A real `localinfer serve` on a tiny random model (with a tokenizer and a chat template):
    the load generator's HTTP, SSE and counting are under test, not the model, and a tiny one
    loads and answers at once."""
    pytest.importorskip("llama_cpp")
    from tests.model_files import TINY_VOCAB_SIZE, write_gguf
    from tests.serve_process import running_server
    from tests.tiny import tiny_config, tiny_weights

    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE)
    weights = tiny_weights(config)
    model = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_gguf(model, config, {n: weights.get(n) for n in weights.names()})
    args = [str(model), "--port", "0", "--backend", "llamacpp", "--slots", "2", "--ctx", "512",
            "--threads", "1", "--log-level", "warning"]  # fmt: skip
    with running_server(args, what="the server to load") as url:
        yield url


def test_bench_a_real_localinfer_server(server_url: str, tmp_path, capsys) -> None:
    # In this process: test_bench_table_against_a_real_server runs the command's own process.
    from localinfer.cli import main

    png = tmp_path / "bench.png"
    plot = ["--plot", str(png)] if HAS_PLOT else []
    args = ["bench", "--url", server_url, "--concurrency", "1,2", "--requests", "2",
            "--max-tokens", "4", "--sizes", "short", "--ignore-eos", "--json", "--no-progress",
            *plot]  # fmt: skip
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == server_url + "/v1" and report["model"]
    for level, c in zip(report["levels"], (1, 2), strict=True):
        assert level["concurrency"] == c and level["ok"] == 2 and level["errors"] == 0
        assert level["output_tokens"] == 2 * 4  # ignore_eos: every answer is max_tokens long
        assert level["token_count_from"] == ["usage"]  # localinfer sends the usage chunk
        assert level["ttft_s"]["count"] == 2
        assert 0 < level["ttft_s"]["p50"] <= level["e2e_s"]["p50"]
        assert level["tpot_s"]["p50"] > 0
        assert level["output_tok_s"] > 0 and level["requests_per_s"] > 0
    assert not HAS_PLOT or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_table_against_a_real_server(server_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "--url", server_url, "--concurrency", "2",
         "--requests", "2", "--max-tokens", "3", "--sizes", "short", "--no-progress",
         "--warmup", "0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "TTFT" in done.stdout and "out tok/s" in done.stdout
    assert "p50/p95/p99" in done.stdout


def test_failed_requests_make_exit_status_4(capsys) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from localinfer.cli import main

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - /v1/models
            self._send(200, {"data": [{"id": "busy-model"}]})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send(503, {"error": {"message": "queue full", "type": "server_busy"}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = ["bench", "--url", url, "--concurrency", "1,2", "--requests", "2", "--warmup",
                "0", "--json", "--no-progress"]  # fmt: skip
        assert main(args) == 4
    finally:
        server.shutdown()
        server.server_close()
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "busy-model"
    for level in report["levels"]:
        assert level["errors"] == 2 and level["ok"] == 0 and level["output_tokens"] == 0
        assert level["error_messages"] == ["HTTP 503: queue full"]
        assert level["ttft_s"]["count"] == 0 and level["ttft_s"]["p50"] is None
