"""Replay recorded greedy answers through the real Speculator under a measured cost model.

A greedy answer does not depend on speculation, so once it is recorded, what any speculation
policy would have done with it can be computed without running the model again: at each step the
Speculator proposes from the context, the proposal is checked against the recorded answer
(the longest matching prefix is accepted, plus the target's own next token), and the
verification is charged what a forward of that many tokens costs on the backend, in one-token
decode steps. The modelled speed-up of an answer is its tokens after the first over the steps
spent. scripts/spec-replay uses this to compare SpecConfig settings on one set of recordings;
scripts/bench-speculative measures the real thing.

Also here: timing a (k+1)-token verification forward against a one-token step, and the fit of
those costs that SpecConfig takes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Runner, SlotWork
from localinfer.engine.sampler import TokenSampler
from localinfer.engine.speculative import SpecConfig, Speculator
from localinfer.engine.speculative.speculator import Candidate
from localinfer.engine.types import SamplingParams


@dataclass(frozen=True, slots=True)
class Recorded:
    """A greedy answer as the plain engine produced it."""

    label: str  # workload, e.g. "editing"
    prompt: tuple[int, ...]
    answer: tuple[int, ...]  # the first token came with the prefill


@dataclass(frozen=True, slots=True)
class Replayed:
    label: str
    tokens: int  # answer tokens after the first
    steps: float  # decode cost in one-token steps
    verifications: int
    proposed: int
    accepted: int

    @property
    def speedup(self) -> float:
        return self.tokens / self.steps if self.steps > 0 else 1.0


def interpolated_cost(table: Mapping[int, float]) -> Callable[[int], float]:
    """Cost in steps of a forward verifying k proposals, linear between the measured k (and
    beyond the last two); ``table`` maps k to cost and must include k = 0 (1.0)."""
    ks = sorted(table)
    if len(ks) < 2 or ks[0] != 0:
        raise ValueError("need k = 0 and at least one more measured k")
    costs = [table[k] for k in ks]
    slope = (costs[-1] - costs[-2]) / (ks[-1] - ks[-2])

    def cost(k: int) -> float:
        if k > ks[-1]:
            return costs[-1] + slope * (k - ks[-1])
        return float(np.interp(k, ks, costs))

    return cost


def replay(
    recorded: Recorded, config: SpecConfig, cost: Callable[[int], float], vocab_size: int
) -> Replayed:
    """What ``config`` would have spent on ``recorded`` (one slot, n-gram lookup, greedy)."""
    speculator = Speculator(config)
    speculator.start(0)
    answer = recorded.answer
    params = SamplingParams(max_tokens=len(answer), temperature=0.0)
    sampler = TokenSampler(params, vocab_size, recorded.prompt)
    done, steps, verifications, proposed, accepted = 1, 0.0, 0, 0, 0
    while done < len(answer):
        context = recorded.prompt + answer[:done]
        candidate = Candidate(0, context, len(answer) - done, sampler)
        proposal = speculator.propose([candidate], busy=1).get(0)
        if proposal is None:
            steps += 1.0
            done += 1
            continue
        k = len(proposal.tokens)
        ok = 0
        for mine, real in zip(proposal.tokens, answer[done:], strict=False):
            if mine != real:
                break
            ok += 1
        speculator.controller(0).update(k, ok)
        steps += cost(k)
        verifications += 1
        proposed += k
        accepted += ok
        done += ok + 1
    return Replayed(recorded.label, len(answer) - 1, steps, verifications, proposed, accepted)


def verification_costs(
    runner: Runner, prompt: Sequence[int], ks: Sequence[int] = (1, 2, 4, 8, 12, 16), reps: int = 9
) -> tuple[float, dict[int, float]]:
    """Seconds of a one-token decode step, and {k: a (k+1)-token forward in such steps} (medians
    over ``reps``), after ``prompt`` in slot 0 (released afterwards)."""
    runner.forward([SlotWork(0, tuple(prompt), 0)])
    base = len(prompt)

    def timed(n: int) -> float:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            runner.forward([SlotWork(0, tuple(prompt[:n]), base, logits="all")])
            out.append(time.perf_counter() - t0)
            runner.truncate(0, base)
        return statistics.median(out)

    one = timed(1)
    costs = {k: timed(k + 1) / one for k in ks}
    runner.release(0)
    return one, costs


def fit_cost(costs: Mapping[int, float]) -> tuple[float, float]:
    """Least squares cost(k) = 1 + fixed + per_token * k over the measured k (fixed >= 0):
    (per_token, fixed), as SpecConfig's verify_cost and verify_fixed."""
    ks, ys = list(costs), [costs[k] - 1.0 for k in costs]
    mk, my = sum(ks) / len(ks), sum(ys) / len(ys)
    slope = sum((k - mk) * (y - my) for k, y in zip(ks, ys, strict=True)) / sum(
        (k - mk) ** 2 for k in ks
    )
    fixed = my - slope * mk
    if fixed < 0:  # through the origin instead
        fixed, slope = 0.0, sum(k * y for k, y in zip(ks, ys, strict=True)) / sum(k * k for k in ks)
    return max(slope, 0.0), fixed
