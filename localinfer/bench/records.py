"""What one benchmark request measured, and what one concurrency level adds up to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from localinfer.bench.stats import Summary, summarize

TokenSource = Literal["usage", "events", "chunks"]  # how output tokens were counted


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One streamed request, timed from just before it was sent (seconds)."""

    prompt_id: str
    ok: bool
    e2e_s: float
    ttft_s: float | None = None  # first output text
    last_token_s: float | None = None  # last output text
    output_tokens: int = 0
    token_source: TokenSource = "chunks"
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (decode speed as one client sees it)."""
        if self.ttft_s is None or self.last_token_s is None or self.output_tokens < 2:
            return None
        return (self.last_token_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class LevelResult:
    """All requests of one concurrency level and the wall time they took together."""

    concurrency: int
    wall_s: float
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def output_tps(self) -> float:
        """Output tokens per second over the level's wall time, all clients together."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ttft(self) -> Summary:
        return summarize([r.ttft_s for r in self.ok if r.ttft_s is not None])

    @property
    def tpot(self) -> Summary:
        return summarize([t for r in self.ok if (t := r.tpot_s) is not None])

    @property
    def e2e(self) -> Summary:
        return summarize([r.e2e_s for r in self.ok])

    @property
    def token_sources(self) -> list[str]:
        return sorted({r.token_source for r in self.ok})

    def first_errors(self, n: int = 3) -> list[str]:
        seen: list[str] = []
        for r in self.records:
            if r.error and r.error not in seen:
                seen.append(r.error)
        return seen[:n]

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "requests": len(self.records),
            "ok": len(self.ok),
            "errors": self.errors,
            "error_messages": self.first_errors(),
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tps,
            "requests_per_s": self.requests_per_s,
            "ttft_s": self.ttft.as_dict(),
            "tpot_s": self.tpot.as_dict(),
            "e2e_s": self.e2e.as_dict(),
            "token_count_from": self.token_sources,
        }


@dataclass(slots=True)
class BenchReport:
    target: str  # a URL or "in-process MODEL (backend)"
    model: str
    max_tokens: int
    levels: list[LevelResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "levels": [lv.as_dict() for lv in self.levels],
        }
