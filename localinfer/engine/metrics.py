"""The one place that turns timestamps and counters into RequestMetrics and EngineMetrics.

Times come from an injectable monotonic clock so tests can drive it. Percentiles cover a recent
window of finished requests (a chat session cares about now, not about an hour ago).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from localinfer.engine.types import EngineMetrics, RequestMetrics

Clock = Callable[[], float]


@dataclass(slots=True, frozen=True)
class DecodePace:
    """How fast an answer's tokens came after its first (the first one's wait is the TTFT)."""

    tpot_s: float  # mean seconds per token after the first
    tokens_per_s: float | None  # None when they all came at once

    @classmethod
    def between(cls, first: float | None, last: float | None, tokens: int) -> DecodePace | None:
        """The pace of ``tokens`` tokens that arrived from ``first`` to ``last``; None before
        the second token."""
        if first is None or last is None or tokens <= 1:
            return None
        span = last - first
        return cls(span / (tokens - 1), (tokens - 1) / span if span > 0 else None)


@dataclass(slots=True)
class RequestTiming:
    """Timestamps of one request (clock seconds); filled in by the scheduler as it goes."""

    submitted: float
    admitted: float | None = None  # got a slot
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None

    def metrics(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> RequestMetrics:
        queued = None if self.admitted is None else self.admitted - self.submitted
        ttft = None if self.first_token is None else self.first_token - self.submitted
        pace = DecodePace.between(self.first_token, self.last_token, completion_tokens)
        prefill_tps = None
        if self.first_token is not None and self.admitted is not None:
            span = self.first_token - self.admitted
            computed = prompt_tokens - cached_tokens
            prefill_tps = computed / span if span > 0 else None
        return RequestMetrics(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            queued_s=queued,
            ttft_s=ttft,
            tpot_s=None if pace is None else pace.tpot_s,
            decode_tps=None if pace is None else pace.tokens_per_s,
            prefill_tps=prefill_tps,
        )


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(slots=True, frozen=True)
class Occupancy:
    """What the scheduler holds when a snapshot is taken: EngineMetrics' fields of these names
    (MetricsRecorder counts the rest)."""

    slots_total: int
    slots_busy: int
    queue_depth: int
    kv_cells_used: int
    kv_cells_total: int
    kv_ram_bytes: int = 0


class MetricsRecorder:
    """Engine-wide totals and a window of recent per-request latencies."""

    def __init__(self, window: int = 256, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self._ttft: deque[float] = deque(maxlen=window)
        self._tpot: deque[float] = deque(maxlen=window)
        self.finish_reasons: Counter[str] = Counter()
        self.requests_finished = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.cached_prompt_tokens_total = 0
        self.prefix_hits = 0
        self.steps = 0
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.spec_verifications = 0  # decode steps of a slot that verified >= 1 proposal
        self.decode_forwards = 0  # decode steps of a slot (one slot in one target forward)
        self.decode_tokens = 0  # tokens those decode steps emitted
        self.reused_by_source: Counter[str] = Counter()  # prompt tokens reused, at admission
        self.kv_transfer_failures = 0

    def record_finished(self, metrics: RequestMetrics, finish_reason: str) -> None:
        self.requests_finished += 1
        self.finish_reasons[finish_reason] += 1
        self.prompt_tokens_total += metrics.prompt_tokens
        self.completion_tokens_total += metrics.completion_tokens
        self.cached_prompt_tokens_total += metrics.cached_tokens
        self.prefix_hits += int(metrics.cached_tokens > 0)
        if metrics.ttft_s is not None:
            self._ttft.append(metrics.ttft_s)
        if metrics.tpot_s is not None:
            self._tpot.append(metrics.tpot_s)

    def snapshot(self, held: Occupancy) -> EngineMetrics:
        ttft, tpot = list(self._ttft), list(self._tpot)
        prompt_total = self.prompt_tokens_total
        hit_rate = self.cached_prompt_tokens_total / prompt_total if prompt_total else None
        return EngineMetrics(
            **asdict(held),
            requests_finished=self.requests_finished,
            prompt_tokens_total=self.prompt_tokens_total,
            completion_tokens_total=self.completion_tokens_total,
            ttft_p50_s=percentile(ttft, 50),
            ttft_p95_s=percentile(ttft, 95),
            ttft_p99_s=percentile(ttft, 99),
            tpot_p50_s=percentile(tpot, 50),
            tpot_p95_s=percentile(tpot, 95),
            tpot_p99_s=percentile(tpot, 99),
            finish_reasons=dict(self.finish_reasons),
            steps=self.steps,
            spec_proposed=self.spec_proposed,
            spec_accepted=self.spec_accepted,
            spec_verifications=self.spec_verifications,
            spec_acceptance_rate=_ratio(self.spec_accepted, self.spec_proposed),
            spec_mean_accepted=_ratio(self.spec_accepted, self.spec_verifications),
            tokens_per_target_forward=_ratio(self.decode_tokens, self.decode_forwards),
            cached_prompt_tokens_total=self.cached_prompt_tokens_total,
            prefix_hits=self.prefix_hits,
            prefix_hit_rate=hit_rate,
            reused_tokens_by_source=dict(self.reused_by_source),
            kv_transfer_failures=self.kv_transfer_failures,
        )


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None
