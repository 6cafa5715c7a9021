"""Run a reference runner and candidate runners in lockstep over the evaluation text.

Lockstep keeps memory flat: each chunk's reference log-probabilities are compared with every
candidate's and dropped, instead of holding ``tokens x vocab`` floats per runner.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from localinfer.backends.base import Runner, SlotWork
from localinfer.quality.metrics import MetricSums, log_softmax


def eval_text() -> str:
    """The shipped evaluation text (public-domain prose and Python code)."""
    return resources.files("localinfer").joinpath("data/eval_text.txt").read_text("utf-8")


def eval_windows(ids: Sequence[int], window: int, max_tokens: int | None) -> list[list[int]]:
    """Split ids into consecutive windows of at most ``window`` tokens (each scored from a fresh
    cache), keeping the first ``max_tokens`` ids."""
    ids = list(ids[:max_tokens] if max_tokens else ids)
    return [ids[i : i + window] for i in range(0, len(ids), window) if len(ids[i : i + window]) > 1]


def compare(
    reference: Runner,
    candidates: Sequence[Runner],
    windows: Sequence[Sequence[int]],
    chunk: int = 128,
) -> tuple[MetricSums, list[MetricSums]]:
    """Teacher-forced perplexity of each runner; KL and top-1 of each candidate vs reference.
    Uses slot 0 of every runner (released before and after each window)."""
    ref_sums = MetricSums()
    cand_sums = [MetricSums() for _ in candidates]
    runners = [reference, *candidates]
    for ids in windows:
        for r in runners:
            r.release(0)
        for start in range(0, len(ids) - 1, chunk):
            toks = tuple(ids[start : start + chunk])
            targets = np.asarray(ids[start + 1 : start + 1 + len(toks)])
            # The chunk's last token has no target inside the window when it ends the window.
            n = len(targets)
            ref_lp = log_softmax(reference.forward([SlotWork(0, toks, start, "all")])[0][:n])
            ref_sums.add(ref_lp, targets)
            for r, sums in zip(candidates, cand_sums, strict=True):
                lp = log_softmax(r.forward([SlotWork(0, toks, start, "all")])[0][:n])
                sums.add(lp, targets, ref_lp)
    for r in runners:
        r.release(0)
    return ref_sums, cand_sums


WARMUP_STEPS = 4


@dataclass(slots=True, frozen=True)
class DecodeSpeed:
    streams: int
    tokens_per_s: float  # aggregate over streams


def decode_speed(
    runner: Runner, prompt: Sequence[int], steps: int = 32, streams: int = 1, repeats: int = 3
) -> DecodeSpeed:
    """Greedy decode of ``steps`` tokens in ``streams`` slots at once, straight on the runner
    (no engine); the median of ``repeats`` runs. The prompt is prefilled once: each run
    truncates the slots back to it (a prefill costs as much as a decode step per token on
    mlx[cpu]). Needs ``runner`` built with >= streams slots."""
    for s in range(streams):
        runner.release(s)
    outs = runner.forward([SlotWork(s, tuple(prompt), 0) for s in range(streams)])
    first = [int(o[-1].argmax()) for o in outs]

    def run(n: int) -> float:
        """Seconds of ``n`` decode steps from the end of the prompt."""
        for s in range(streams):
            runner.truncate(s, len(prompt))
        nxt, pos = list(first), len(prompt)
        t0 = time.perf_counter()
        for _ in range(n):
            outs = runner.forward([SlotWork(s, (nxt[s],), pos) for s in range(streams)])
            nxt = [int(o[-1].argmax()) for o in outs]
            pos += 1
        return time.perf_counter() - t0

    # Untimed: the process's first one-token steps pay one-off set-up (measured: the torch
    # reference, first to decode in `quality`, timed 4.6 tok/s in its first run, 60 after).
    run(WARMUP_STEPS)
    rates = [steps * streams / run(steps) for _ in range(repeats)]
    for s in range(streams):
        runner.release(s)
    return DecodeSpeed(streams, float(np.median(rates)))
