"""The structured-output benchmark's measurements (bench/structured.py) on the numpy
HashRunner: free runs decode exactly the constrained answers' lengths, busy batches mix
constrained and free requests, and every replayed token is timed once."""

from __future__ import annotations

import re

import pytest

from bench.structured import (
    Comparison,
    Workload,
    busy_slots,
    compile_times,
    constrained_request,
    mask_times,
    matched_free_request,
    run_batch,
    single_stream,
)
from localinfer.constraints import ConstraintSpec
from tests.test_engine_constraints import COMPILER, ByteVocab
from tests.test_engine_model import HashRunner

PATTERNS = [r"[a-z]{2,9}", r"[0-9]{3}-[0-9]{4}", r"(yes|no)", r"[a-c]{4}( [a-c]{4}){1,3}"]


def workloads() -> list[Workload]:
    return [
        Workload(f"w{i}", [i + 3, i + 4], COMPILER.compile(ConstraintSpec("regex", p)))
        for i, p in enumerate(PATTERNS)
    ]


def answers_of(runner: HashRunner, work: list[Workload]) -> dict[str, tuple[int, ...]]:
    out = {}
    for w in work:
        run = run_batch(runner, ByteVocab(), [constrained_request(w, 40)])
        assert run.finish_reasons == ["stop"]
        out[w.name] = run.token_ids[0]
    return out


def test_free_runs_match_constrained_lengths_and_rates_are_counted() -> None:
    runner, work = HashRunner(slots=4), workloads()
    answers = answers_of(runner, work)
    for w, pattern in zip(work, PATTERNS, strict=True):
        assert re.fullmatch(pattern, bytes(answers[w.name]).decode())
        free = run_batch(runner, ByteVocab(), [matched_free_request(w, len(answers[w.name]))])
        assert len(free.token_ids[0]) == len(answers[w.name])
        assert free.decode_tokens == len(answers[w.name]) - 1 and free.decode_s > 0
    one = single_stream(Comparison(runner, ByteVocab(), work, answers, repeats=2, max_tokens=40))
    assert one.decode_tokens == sum(len(a) - 1 for a in answers.values())
    assert one.free_tps > 0 and one.constrained_tps > 0 and one.ratio > 0


def test_busy_batches_pair_two_constrained_with_free_requests() -> None:
    runner, work = HashRunner(slots=4), workloads()
    answers = answers_of(runner, work)
    longest = max(len(answers[w.name]) for w in work[:2])
    busy = busy_slots(Comparison(runner, ByteVocab(), work, answers, repeats=1, max_tokens=40))
    # One batch of four: two constrained answers, two free ones as long as the longer of those.
    assert busy.decode_tokens == len(answers["w0"]) + len(answers["w1"]) + 2 * longest - 4
    assert busy.constrained_tps > 0 and busy.free_tps > 0


def test_mask_and_compile_times_cover_every_token_and_spec() -> None:
    work = workloads()
    answers = answers_of(HashRunner(slots=1), work)
    times = mask_times(work, answers, vocab_size=256)
    assert len(times) == sum(len(a) for a in answers.values())
    assert all(t >= 0 for t in times)
    specs = [ConstraintSpec("regex", p) for p in PATTERNS]
    assert len(compile_times(COMPILER.compile, specs, repeats=2)) == len(specs)
    with pytest.raises(Exception, match="not allowed"):  # a token the answer never had
        mask_times(work[:1], {"w0": (ord("!"),)}, vocab_size=256)
