"""Server pieces on their own: Prometheus text, response JSON, request translation, and the
loading / failed-to-load states of the app."""

from __future__ import annotations

import threading

import httpx
import pytest

from localinfer.engine.types import EngineMetrics, RequestMetrics, TokenLogprob
from localinfer.errors import ContextOverflowError, UnknownModelError
from localinfer.server import ServerThread, create_app
from localinfer.server.errors import APIError
from localinfer.server.openai_render import ResponseBuilder, completion_logprobs, usage
from localinfer.server.prometheus import Histogram, ServerMetrics
from localinfer.server.schemas import ChatCompletionRequest
from localinfer.server.translate import sampling_params
from tests.test_server_support import make_session, wait_until


def parse_prometheus(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_histogram_is_cumulative_with_inf_sum_and_count() -> None:
    h = Histogram([0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    s = parse_prometheus("\n".join(h.lines("x")))
    assert s['x_bucket{le="0.1"}'] == 2  # le is inclusive
    assert s['x_bucket{le="1.0"}'] == 3
    assert s['x_bucket{le="+Inf"}'] == 4 == s["x_count"]
    assert s["x_sum"] == pytest.approx(3.65)


def test_metrics_text_from_engine_snapshot_and_requests() -> None:
    m = ServerMetrics()
    m.observe_request(RequestMetrics(5, 3, ttft_s=0.2, tpot_s=0.01))
    m.observe_request(RequestMetrics(5, 1, ttft_s=0.3))  # one token: no TPOT
    m.count_error(400, "invalid_request")
    engine = EngineMetrics(
        slots_total=4, slots_busy=1, queue_depth=2, kv_cells_used=128, kv_cells_total=512,
        requests_finished=2, prompt_tokens_total=10, completion_tokens_total=4,
        finish_reasons={"stop": 1, "length": 1}, spec_proposed=10, spec_accepted=7,
        reused_tokens_by_source={"copy": 40, "ram": 600}, kv_transfer_failures=1,
        kv_ram_bytes=4096,
    )  # fmt: skip
    s = parse_prometheus(m.render(engine, "tiny"))
    assert s['localinfer_reused_prompt_tokens_total{source="ram"}'] == 600
    assert s['localinfer_reused_prompt_tokens_total{source="copy"}'] == 40
    assert s['localinfer_reused_prompt_tokens_total{source="disk"}'] == 0
    assert s["localinfer_kv_transfer_failures_total"] == 1
    assert s["localinfer_kv_ram_tier_bytes"] == 4096
    assert s['localinfer_model_loaded{model="tiny"}'] == 1
    assert s["localinfer_time_to_first_token_seconds_count"] == 2
    assert s["localinfer_time_per_output_token_seconds_count"] == 1
    assert s['localinfer_requests_total{finish_reason="stop"}'] == 1
    assert s['localinfer_requests_total{finish_reason="abort"}'] == 0
    assert s["localinfer_kv_cache_usage_ratio"] == 0.25
    assert s["localinfer_spec_acceptance_ratio"] == 0.7
    assert s["localinfer_queue_depth"] == 2 and s["localinfer_slots_busy"] == 1
    assert s['localinfer_http_errors_total{status="400",code="invalid_request"}'] == 1
    loading = parse_prometheus(m.render(None, "tiny"))
    assert loading['localinfer_model_loaded{model="tiny"}'] == 0
    assert "localinfer_slots_busy" not in loading


def test_usage_and_logprob_shapes() -> None:
    u = usage(RequestMetrics(7, 3, cached_tokens=4, reasoning_tokens=2), 0, 0)
    assert u == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                 "prompt_tokens_details": {"cached_tokens": 4},
                 "completion_tokens_details": {"reasoning_tokens": 2}}  # fmt: skip
    items = [
        TokenLogprob(5, "Hel", -0.5, ((5, "Hel", -0.5), (6, "He", -1.0))),
        TokenLogprob(7, "lo", float("-inf"), ()),
    ]
    lp = completion_logprobs(items, text_offset=3)
    assert lp["tokens"] == ["Hel", "lo"]
    assert lp["text_offset"] == [3, 6]
    assert lp["token_logprobs"] == [-0.5, -9999.0]  # JSON has no -inf
    assert lp["top_logprobs"][0] == {"Hel": -0.5, "He": -1.0}


def test_stream_chunks_share_id_and_carry_usage_null() -> None:
    b = ResponseBuilder("chat", model="m", token_bytes=lambda i: b"x", include_usage=True)
    first = b.first_chunk()
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert b.delta_chunk("", ()) is None  # held-back text sends nothing
    delta = b.delta_chunk("hi", ())
    finish = b.finish_chunk("stop", RequestMetrics(2, 1, ttft_s=0.1))
    last = b.usage_chunk(RequestMetrics(2, 1), 0, 0)
    assert {c["id"] for c in (first, delta, finish, last)} == {b.id}
    assert delta["usage"] is None and finish["usage"] is None
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["timings"]["ttft_ms"] == 100.0
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 3


def test_sampling_params_caps_max_tokens_but_never_the_prompt() -> None:
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_tokens=100)
    p = sampling_params(body, prompt_tokens=90, max_ctx=128, logprobs=None, max_tokens=100)
    assert p.max_tokens == 38
    assert p.temperature == 1.0  # OpenAI's default when unset
    p = sampling_params(body, prompt_tokens=10, max_ctx=128, logprobs=2, max_tokens=None)
    assert p.max_tokens == 118 and p.logprobs == 2
    with pytest.raises(ContextOverflowError) as overflow:
        sampling_params(body, prompt_tokens=128, max_ctx=128, logprobs=None, max_tokens=1)
    # The prompt's own size, then why it does not fit (it leaves no room for an answer token).
    assert "resulted in 129 tokens (the prompt (128 tokens) plus one answer token)" in str(
        overflow.value
    )
    negative = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], seed=-1)
    assert sampling_params(negative, prompt_tokens=1, max_ctx=8, logprobs=None,
                           max_tokens=1).seed == 2**64 - 1  # fmt: skip
    with pytest.raises(APIError) as caught:  # the engine's own bound (top 20) still holds
        sampling_params(body, prompt_tokens=1, max_ctx=8, logprobs=21, max_tokens=1)
    assert caught.value.status == 400 and caught.value.param == "logprobs"
    stops = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stop=["", "ok"])
    assert sampling_params(stops, prompt_tokens=1, max_ctx=8, logprobs=None,
                           max_tokens=1).stop == ("ok",)  # fmt: skip


def test_create_app_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError):
        create_app()


def test_health_says_loading_then_ok() -> None:
    release = threading.Event()
    loaded = []

    def loader():  # type: ignore[no-untyped-def]
        release.wait(60)
        loaded.append(make_session(slots=1, ctx=128))
        return loaded[0]

    with ServerThread(create_app(loader=loader)) as server:
        r = httpx.get(server.url + "/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert int(r.headers["retry-after"]) >= 1
        assert (
            'localinfer_model_loaded{model="loading"} 0' in httpx.get(server.url + "/metrics").text
        )
        release.set()
        wait_until(lambda: httpx.get(server.url + "/health").status_code == 200, 120)
        r = httpx.post(
            server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=60
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    # The app loaded the session, so the app closed it on shutdown.
    assert loaded[0]._closed


def test_health_reports_a_failed_load() -> None:
    def loader():  # type: ignore[no-untyped-def]
        raise UnknownModelError("nope")

    app = create_app(loader=loader)
    with ServerThread(app) as server:
        wait_until(lambda: httpx.get(server.url + "/health").status_code != 503, 30)
        r = httpx.get(server.url + "/health")
        assert r.status_code == 500 and "nope" in r.json()["error"]
        r = httpx.get(server.url + "/v1/models")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_error"
    assert isinstance(app.state.localinfer.load_exception, UnknownModelError)
