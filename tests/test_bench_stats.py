"""Benchmark arithmetic: percentiles, summaries, per-request and per-level figures, SSE decoding,
the prompt set and argument parsing."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from localinfer.bench.loadgen import parse_levels
from localinfer.bench.prompts import SIZES, load_prompts
from localinfer.bench.records import LevelResult, RequestRecord
from localinfer.bench.sse import SSEDecoder
from localinfer.bench.stats import percentile, summarize
from localinfer.errors import InvalidParameterError


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 101])
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(n: int, q: float) -> None:
    rng = random.Random(n * 1000 + int(q))
    values = [rng.expovariate(3.0) for _ in range(n)]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_by_hand() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    # rank (4 - 1) * 0.95 = 2.85: 3 + 0.85 * (4 - 3)
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summary() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (s.count, s.mean, s.p50) == (5, 4.0, 3.0)
    assert s.p95 == pytest.approx(8.8)  # rank 3.8: 4 + 0.8 * 6
    assert s.p99 == pytest.approx(9.76)
    empty = summarize([])
    assert empty.count == 0 and empty.mean is None and empty.p99 is None


def test_request_record_tpot() -> None:
    r = RequestRecord("a", True, e2e_s=1.2, ttft_s=0.2, last_token_s=1.0, output_tokens=5)
    assert r.tpot_s == pytest.approx(0.2)  # 4 gaps over 0.8 s
    assert RequestRecord("b", True, 1.0, 0.3, 0.3, 1).tpot_s is None  # one token: no gap
    assert RequestRecord("c", False, 1.0).tpot_s is None


def test_level_result_counts_only_successes() -> None:
    records = [
        RequestRecord("a", True, 2.0, 0.5, 1.5, 11),
        RequestRecord("b", True, 3.0, 1.0, 2.0, 21),
        RequestRecord("c", False, 0.1, error="HTTP 503: busy"),
    ]
    lv = LevelResult(concurrency=2, wall_s=4.0, records=records)
    assert (len(lv.ok), lv.errors, lv.output_tokens) == (2, 1, 32)
    assert lv.output_tps == 8.0
    assert lv.requests_per_s == 0.5
    assert lv.ttft.p50 == 0.75 and lv.e2e.mean == 2.5
    assert lv.tpot.mean == pytest.approx((0.1 + 0.05) / 2)
    data = lv.as_dict()
    assert data["error_messages"] == ["HTTP 503: busy"]
    json.dumps(data)  # plain JSON


def test_sse_decoder() -> None:
    d = SSEDecoder()
    lines = [": keep-alive", 'data: {"a": 1}', "", "event: x", "data: line1", "data:line2", ""]
    out = [x for x in (d.feed(line) for line in lines) if x is not None]
    assert out == ['{"a": 1}', "line1\nline2"]
    assert d.feed("data: [DONE]") is None
    assert d.feed("") == "[DONE]"  # an event ends at its blank line (unended ones are dropped)


def test_shipped_prompt_set() -> None:
    prompts = load_prompts()
    assert len({p.id for p in prompts}) == len(prompts)
    for size in SIZES:
        assert sum(p.size == size for p in prompts) == 4
    chars = {s: min(len(p.messages[-1]["content"]) for p in prompts if p.size == s) for s in SIZES}
    assert chars["short"] < 60 < 250 < chars["medium"] < 600 < 1500 < chars["long"]
    assert [p.size for p in load_prompts(sizes=("long",))] == ["long"] * 4


def test_prompt_file(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hello"}\n# a comment\n\n{"id": "x", "messages": '
        '[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}\n'
    )
    first, second = load_prompts(path)
    assert first.messages == ({"role": "user", "content": "hello"},) and first.size == "custom"
    assert second.id == "x" and len(second.messages) == 2
    path.write_text('{"messages": "nope"}\n')
    with pytest.raises(InvalidParameterError, match=":1: 'messages'"):
        load_prompts(path)
    path.write_text('{"prompt": "hello"}\n')
    with pytest.raises(InvalidParameterError, match="no prompts of size tiny"):
        load_prompts(path, sizes=("tiny",))


def test_parse_levels() -> None:
    assert parse_levels("1,4, 8") == [1, 4, 8]
    for bad in ("", "0", "a,b", "-1"):
        with pytest.raises(InvalidParameterError):
            parse_levels(bad)
