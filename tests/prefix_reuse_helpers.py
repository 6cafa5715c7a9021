"""What the prefix reuse tests share: an engine stepped by hand with reuse on or off, greedy
sampling that never stops early, random prompts, and what a slot holds."""

from __future__ import annotations

import numpy as np

from localinfer.backends.base import Runner
from localinfer.engine import Engine, SamplingParams
from tests.test_engine_model import ByteTokenizer


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def manual(runner: Runner, reuse: bool = True, **kw: object) -> Engine:
    return Engine(runner, ByteTokenizer(), background=False, prefix_reuse=reuse, **kw)  # type: ignore[arg-type]


def seq(n: int, seed: int, vocab: int = 256, low: int = 3) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(low, vocab, n)]


def slot_cache(engine: Engine, slot: int) -> list[int]:
    return list(engine._scheduler.slots.slots[slot].cached)
