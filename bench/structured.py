"""Measurements of constrained decoding (scripts/bench-structured): what a JSON-schema constraint
costs a decoding stream, per token and per schema.

Every comparison runs the same prompts in the same process, constrained and free, interleaved per
repeat. A free run decodes exactly as many tokens as the constrained answer to the same prompt
had (``ignore_eos``), so both sides do the same forwards and differ only in the masks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from localinfer.backends.base import Runner
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine.constraint import ConstraintSource, MaskedChoice


@dataclass(frozen=True, slots=True)
class Workload:
    """One prompt and the constraint its answer follows."""

    name: str
    prompt_ids: list[int]
    constraint: ConstraintSource


@dataclass(frozen=True, slots=True)
class BatchRun:
    """Requests decoded together: their tokens, and the decode rate of the whole batch."""

    token_ids: list[tuple[int, ...]]
    finish_reasons: list[str]
    decode_tokens: int  # tokens after each request's first one
    decode_s: float  # from the first sampled token to the last


def run_batch(
    runner: Runner, tokenizer: Any, requests: Sequence[Request], prefill_chunk: int = 4096
) -> BatchRun:
    """Run ``requests`` together to the end on a fresh engine over ``runner`` (one prefill step
    for all prompts, so the span after it is decoding only)."""
    engine = Engine(runner, tokenizer, background=False, prefill_chunk=prefill_chunk)
    return decode_together(engine, requests)


def decode_together(engine: Engine, requests: Sequence[Request]) -> BatchRun:
    """Run ``requests`` together to the end on ``engine`` (built with ``background=False``: this
    steps it); the decode span runs from the first step that samples to the last token."""
    handles = engine.submit_all(requests)
    first: float | None = None
    firsts = 0
    while engine.has_work():
        report = engine.step()
        if first is None and report.sampled:
            first, firsts = time.perf_counter(), len(report.sampled)
    end = time.perf_counter()
    results = [h.result() for h in handles]
    produced = sum(len(r.token_ids) for r in results) - firsts
    return BatchRun(
        token_ids=[r.token_ids for r in results],
        finish_reasons=[r.finish_reason for r in results],
        decode_tokens=produced,
        decode_s=end - first if first is not None else 0.0,
    )


def constrained_request(work: Workload, max_tokens: int) -> Request:
    return Request(
        work.prompt_ids, SamplingParams(max_tokens=max_tokens), constraint=work.constraint
    )


def matched_free_request(work: Workload, tokens: int) -> Request:
    """The same prompt, free, decoding exactly ``tokens`` tokens."""
    return Request(work.prompt_ids, SamplingParams(max_tokens=max(tokens, 1), ignore_eos=True))


@dataclass(frozen=True, slots=True)
class PairedRates:
    """Aggregate decode tok/s of the same work free and constrained (medians over repeats)."""

    free_tps: float
    constrained_tps: float
    decode_tokens: int  # per repeat, each side

    @property
    def ratio(self) -> float:
        return self.constrained_tps / self.free_tps


def _rate(runs: Sequence[BatchRun]) -> float:
    seconds = sum(r.decode_s for r in runs)
    return sum(r.decode_tokens for r in runs) / seconds if seconds > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class Comparison:
    """What single_stream and busy_slots measure: ``work`` on ``runner``, each workload's
    constrained answer known (``answers``, whose lengths set the free runs'), ``repeats``
    interleaved repeats, constrained requests capped at ``max_tokens``."""

    runner: Runner
    tokenizer: Any
    work: Sequence[Workload]
    answers: dict[str, tuple[int, ...]]
    repeats: int
    max_tokens: int


def single_stream(c: Comparison) -> PairedRates:
    """One request at a time: every workload constrained, then free for as many tokens."""
    pairs = [
        ([constrained_request(w, c.max_tokens)], [matched_free_request(w, len(c.answers[w.name]))])
        for w in c.work
    ]
    free, constrained, _ = _interleaved(c, pairs)
    tokens = sum(max(len(c.answers[w.name]) - 1, 0) for w in c.work)
    return PairedRates(statistics.median(free), statistics.median(constrained), tokens)


def busy_slots(c: Comparison, constrained_per_batch: int = 2) -> PairedRates:
    """Batches of ``runner.info.slots`` requests, the first ``constrained_per_batch`` of each
    constrained, the rest free for as long as the longest constrained answer beside them; the
    all-free batch decodes the same lengths."""
    slots, answers = c.runner.info.slots, c.answers
    groups = [c.work[i : i + slots] for i in range(0, len(c.work) - slots + 1, slots)]
    pairs = []
    for group in groups:
        held = group[:constrained_per_batch]
        longest = max(len(answers[w.name]) for w in held)
        rest = [matched_free_request(w, longest) for w in group[constrained_per_batch:]]
        mixed = [constrained_request(w, c.max_tokens) for w in held] + rest
        plain = [matched_free_request(w, len(answers[w.name])) for w in held] + rest
        pairs.append((mixed, plain))
    free, constrained, last = _interleaved(c, pairs)
    tokens = sum(r.decode_tokens for r in last)
    return PairedRates(statistics.median(free), statistics.median(constrained), tokens)


def _interleaved(
    c: Comparison, pairs: Sequence[tuple[list[Request], list[Request]]]
) -> tuple[list[float], list[float], list[BatchRun]]:
    """Every (constrained, free) pair of batches run in turn, ``c.repeats`` times (a Request can
    be submitted again): each repeat's free and constrained rates, and the last repeat's
    constrained runs."""
    free, constrained = [], []
    c_runs: list[BatchRun] = []
    for _ in range(c.repeats):
        c_runs, f_runs = [], []
        for mixed, plain in pairs:
            c_runs.append(run_batch(c.runner, c.tokenizer, mixed))
            f_runs.append(run_batch(c.runner, c.tokenizer, plain))
        constrained.append(_rate(c_runs))
        free.append(_rate(f_runs))
    return free, constrained, c_runs


def mask_times(
    work: Sequence[Workload], answers: dict[str, tuple[int, ...]], vocab_size: int
) -> list[float]:
    """Seconds per token of what the sampler does for a constrained token before choosing it
    (the constraint's bitmask, unpacked and applied to a logits row), replaying each real
    answer through a fresh constraint."""
    logits = np.random.default_rng(0).standard_normal(vocab_size).astype(np.float32)
    times: list[float] = []
    for w in work:
        masked = MaskedChoice(w.constraint.start(), vocab_size)
        for token in answers[w.name]:
            started = time.perf_counter()
            masked.mask(logits)
            times.append(time.perf_counter() - started)
            masked.constraint.advance(token)
    return times


def compile_times(
    compile_one: Callable[[Any], object], specs: Sequence[Any], repeats: int
) -> list[float]:
    """Seconds per compile of each spec (the median of ``repeats`` compiles each)."""
    out = []
    for spec in specs:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            compile_one(spec)
            samples.append(time.perf_counter() - started)
        out.append(statistics.median(samples))
    return out
