"""Percentiles and summaries of latency samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default "linear" method); None for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean and tail percentiles of one metric (seconds); None where there were no samples."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p95": self.p95,
                "p99": self.p99}  # fmt: skip


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(0, None, None, None, None)
    return Summary(
        count=len(values),
        mean=math.fsum(values) / len(values),
        p50=percentile(values, 50),
        p95=percentile(values, 95),
        p99=percentile(values, 99),
    )
