"""What the scheduler talks to: per-slot proposals for a step, and their verification.

The scheduler asks :meth:`Speculator.propose` for the slots about to decode; each slot that gets
a proposal feeds ``[last, x1..xk]`` with ``logits="all"`` in the step's one ragged forward, and
:meth:`Speculator.verify` then says which tokens to emit. The scheduler rolls the target's KV
back (``Runner.truncate``) past the last accepted proposal; the draft model re-syncs itself
from the sequence at its next proposal.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.engine.sampler import TokenSampler
from localinfer.engine.speculative.adaptive import AdaptiveK
from localinfer.engine.speculative.config import SpecConfig
from localinfer.engine.speculative.draft import DraftItem, DraftProposer
from localinfer.engine.speculative.ngram import NgramIndex, NgramProposer
from localinfer.engine.speculative.proposal import Proposal
from localinfer.engine.speculative.verification import Verdict, verify

COST_DECAY = 0.8  # weight of the past in the measured draft time
YARDSTICK_STEPS = 3  # plain decode steps timed before a draft model first proposes
MAX_DRAFT_COST = 10.0  # a draft slower than this many target steps per token never pays anyway


def _ema(old: float | None, new: float) -> float:
    return new if old is None else COST_DECAY * old + (1.0 - COST_DECAY) * new


@dataclass(slots=True, frozen=True)
class Candidate:
    """A slot about to decode: its whole context (last sampled token included) and how many
    proposals it may take (room left in max_tokens and in the context)."""

    slot: int
    tokens: Sequence[int]
    room: int
    sampler: TokenSampler


class Speculator:
    def __init__(self, config: SpecConfig | None = None, draft: DraftProposer | None = None):
        self.config = config or SpecConfig()
        self.draft = draft
        self.ngram = NgramProposer(self.config.ngram_max, self.config.ngram_min)
        self._controllers: dict[int, AdaptiveK] = {}
        self._indexes: dict[int, NgramIndex] = {}  # slot -> its context's n-gram index
        # Measured online: seconds per drafted token (decayed average) and per plain one-token
        # target step (the fastest seen). A draft model's cost depends on the pair and the
        # machine; the configured draft_cost is only a starting guess.
        self._draft_token_s: float | None = None
        self._plain_step_s: float | None = None
        self._plain_steps = 0

    @property
    def kind(self) -> str:
        return "draft" if self.draft is not None else "ngram"

    def start(self, slot: int) -> None:
        """A new request took ``slot``: its acceptance history and n-gram index start afresh."""
        self._indexes[slot] = self.ngram.index()
        step_cost = self.config.verify_cost + self.draft_cost
        self._controllers[slot] = AdaptiveK(self.config, step_cost)

    def controller(self, slot: int) -> AdaptiveK:
        if slot not in self._controllers:
            self.start(slot)
        return self._controllers[slot]

    def _index(self, slot: int) -> NgramIndex:
        if slot not in self._indexes:
            self._indexes[slot] = self.ngram.index()
        return self._indexes[slot]

    def propose(self, candidates: Sequence[Candidate], busy: int) -> dict[int, Proposal]:
        """Proposals for the slots that should speculate this step (maybe none).

        ``busy`` is how many slots decode this step: above ``max_busy_slots`` nobody speculates.
        """
        if busy > self.config.max_busy_slots:
            return {}
        if self.measuring and self._plain_steps < YARDSTICK_STEPS:
            # Plain steps first: the yardstick a draft's measured cost is divided by (the
            # fastest of a few; the first decode after a prompt runs cold).
            return {}
        out: dict[int, Proposal] = {}
        items: list[DraftItem] = []
        for cand in candidates:
            ctl = self.controller(cand.slot)
            params = cand.sampler.params
            if params.seed is not None and not params.greedy and not ctl.pinned:
                # A seeded sampled answer must repeat exactly, and its tokens depend on every k
                # chosen: this slot keeps the configured costs, not timings of this machine.
                ctl.pinned = True
                ctl.step_cost = self.config.verify_cost + self.config.draft_cost
            k = min(ctl.next_k(), cand.room)
            if k <= 0:
                continue
            if self.draft is None:
                index = self._index(cand.slot)
                index.sync(cand.tokens)
                tokens, matched = index.lookup(k)
                # Without evidence of its own (first try, probe) a slot verifies only on a
                # full-length match: a 2-token match in free text is not worth a big forward.
                if ctl.tentative and matched < self.config.ngram_max:
                    ctl.defer_probe()
                elif tokens:
                    out[cand.slot] = Proposal(tokens)
            else:
                rng = cand.sampler.rng  # a seeded request stays reproducible
                items.append(DraftItem(cand.slot, cand.tokens, k, cand.sampler.params, rng))
        if items and self.draft is not None:
            started = time.perf_counter()
            drafted = self.draft.propose(items)
            n = sum(p.k for p in drafted.values())
            if n:  # a prompt catch-up is no per-token cost
                spent = time.perf_counter() - started - self.draft.last_prefill_s
                self._draft_token_s = _ema(self._draft_token_s, max(spent, 0.0) / n)
                self._refresh_costs()
            out.update(drafted)
        return out

    @property
    def measuring(self) -> bool:
        """Whether this speculator times the target's forwards (a draft model, measured)."""
        return self.draft is not None and self.config.measure_draft_cost

    def observe_forward(self, seconds: float, plain: bool) -> None:
        """A target forward took ``seconds``; ``plain``: it was decode steps only, nothing
        proposed. Those give the one-token step time, the unit a draft model's measured cost is
        expressed in (no draft proposes before YARDSTICK_STEPS of them)."""
        if not plain or not self.measuring:
            return
        # The fastest seen: a step's noise only ever adds time (the first decode after a prompt
        # runs cold), and erring slow would make a draft look cheaper than it is.
        old = self._plain_step_s
        self._plain_step_s = seconds if old is None else min(old, seconds)
        self._plain_steps += 1
        self._refresh_costs()

    @property
    def draft_cost(self) -> float:
        """One draft step in target decode steps: measured once both times are known, the
        configured figure until then (or when not measuring)."""
        if self.draft is None:
            return 0.0
        step, per_token = self._plain_step_s, self._draft_token_s
        if not self.measuring or per_token is None or step is None or step <= 0:
            return self.config.draft_cost
        return min(per_token / step, MAX_DRAFT_COST)

    def _refresh_costs(self) -> None:
        step_cost = self.config.verify_cost + self.draft_cost
        for ctl in self._controllers.values():
            if not ctl.pinned:
                ctl.step_cost = step_cost

    def verify(
        self, slot: int, sampler: TokenSampler, proposal: Proposal, logits: np.ndarray
    ) -> Verdict:
        verdict = verify(sampler, proposal, logits)
        self.controller(slot).update(proposal.k, verdict.accepted)
        return verdict

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
