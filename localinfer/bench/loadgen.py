"""Closed-loop load: at concurrency C, C clients each send their next request as soon as their
last one ends, until the level's requests are done. Levels run one after another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.records import LevelResult, RequestRecord
from localinfer.bench.targets import Target
from localinfer.errors import InvalidParameterError

OnRecord = Callable[[int, RequestRecord], None]  # (concurrency, record), after each request


def parse_levels(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8]."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidParameterError(
            f"--concurrency wants numbers like 1,4,8, got '{text}'"
        ) from None
    if not levels or min(levels) < 1:
        raise InvalidParameterError(f"--concurrency levels must be at least 1, got '{text}'")
    return levels


async def run_level(
    target: Target,
    prompts: Sequence[BenchPrompt],
    concurrency: int,
    requests: int,
    max_tokens: int,
    on_record: OnRecord | None = None,
) -> LevelResult:
    """`requests` requests (prompts in order, cycling) from `concurrency` clients at once.
    Every level starts at the first prompt, so levels see the same work."""
    if requests < 1 or concurrency < 1:
        raise InvalidParameterError("requests and concurrency must be at least 1")
    next_index = iter(range(requests))
    records: list[RequestRecord | None] = [None] * requests

    async def client() -> None:
        for i in next_index:  # one shared iterator: each index goes to exactly one client
            record = await target.run(prompts[i % len(prompts)], max_tokens)
            records[i] = record
            if on_record is not None:
                on_record(concurrency, record)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(concurrency, requests))))
    wall = time.perf_counter() - start
    return LevelResult(concurrency, wall, [r for r in records if r is not None])


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What one benchmark run sends: each concurrency level in turn, after `warmup` unmeasured
    requests (first-request costs such as graph building or page faults are not serving speed)."""

    prompts: Sequence[BenchPrompt]
    levels: Sequence[int]
    requests: int  # per level; a level sends at least as many as it has clients
    max_tokens: int
    warmup: int = 1


async def run_levels(
    target: Target, plan: LoadPlan, on_record: OnRecord | None = None
) -> list[LevelResult]:
    """Every level of ``plan`` against ``target``, one after another."""
    if plan.warmup > 0:
        await run_level(target, plan.prompts[:1], 1, plan.warmup, min(plan.max_tokens, 8))
    return [
        await run_level(target, plan.prompts, c, max(plan.requests, c), plan.max_tokens, on_record)
        for c in plan.levels
    ]
