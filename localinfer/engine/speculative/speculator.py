"""What the scheduler talks to: per-slot proposals for a step, and their verification.

The scheduler asks :meth:`Speculator.propose` for the slots about to decode; each slot that gets
a proposal feeds ``[last, x1..xk]`` with ``logits="all"`` in the step's one ragged forward, and
:meth:`Speculator.verify` then says which tokens to emit. The scheduler rolls the target's KV
back (``Runner.truncate``) past the last accepted proposal; the draft model re-syncs itself
from the sequence at its next proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.engine.sampler import TokenSampler
from localinfer.engine.speculative.adaptive import AdaptiveK
from localinfer.engine.speculative.config import SpecConfig
from localinfer.engine.speculative.draft import DraftItem, DraftProposer
from localinfer.engine.speculative.ngram import NgramProposer
from localinfer.engine.speculative.proposal import Proposal
from localinfer.engine.speculative.verification import Verdict, verify


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

    @property
    def kind(self) -> str:
        return "draft" if self.draft is not None else "ngram"

    def start(self, slot: int) -> None:
        """A new request took ``slot``: its acceptance history starts afresh."""
        c = self.config
        self._controllers[slot] = AdaptiveK(
            k_max=c.k_max,
            prior_acceptance=c.prior_acceptance,
            step_cost=c.verify_cost + c.draft_cost,
            decay=c.ema_decay,
            probe_every=c.probe_every,
            fixed_cost=c.verify_fixed,
        )

    def controller(self, slot: int) -> AdaptiveK:
        if slot not in self._controllers:
            self.start(slot)
        return self._controllers[slot]

    def propose(self, candidates: Sequence[Candidate], busy: int) -> dict[int, Proposal]:
        """Proposals for the slots that should speculate this step (maybe none).

        ``busy`` is how many slots decode this step: above ``max_busy_slots`` nobody speculates.
        """
        if busy > self.config.max_busy_slots:
            return {}
        out: dict[int, Proposal] = {}
        items: list[DraftItem] = []
        for cand in candidates:
            ctl = self.controller(cand.slot)
            k = min(ctl.next_k(), cand.room)
            if k <= 0:
                continue
            if self.draft is None:
                tokens, matched = self.ngram.lookup(cand.tokens, k)
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
            out.update(self.draft.propose(items))
        return out

    def verify(
        self, slot: int, sampler: TokenSampler, proposal: Proposal, logits: np.ndarray
    ) -> Verdict:
        verdict = verify(sampler, proposal, logits)
        self.controller(slot).update(proposal.k, verdict.accepted)
        return verdict

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
