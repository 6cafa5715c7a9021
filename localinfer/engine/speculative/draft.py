"""Draft-model proposals: a second, smaller runner that shares the target's tokenizer.

The draft runner has one slot per target slot and its own KV cache. Before proposing, a draft
slot is brought in line with the target sequence: its cache is truncated to the prefix it
shares with the sequence (this is the draft's rollback after rejected proposals) and the rest
is fed in one forward, batched over all proposing slots. Then k - 1 more single-token steps,
again batched, produce the remaining proposals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from localinfer.backends.base import Runner, SlotWork
from localinfer.engine.slots import shared_prefix
from localinfer.engine.speculative.distribution import draw, proposal_probs
from localinfer.engine.speculative.proposal import Proposal
from localinfer.engine.types import SamplingParams
from localinfer.errors import InvalidParameterError

log = logging.getLogger(__name__)

SAMPLE_IDS = 512  # token strings compared at load, spread over the whole vocabulary
PREFILL_SPLIT = 16  # a catch-up longer than this is a prompt: fed apart from its last token


def check_shared_tokenizer(target: Any, draft: Any, *, names: tuple[str, str] = ("", "")) -> None:
    """Raise InvalidParameterError unless ``draft`` tokenizes exactly like ``target``.

    Compares the vocabulary sizes and the bytes of a sample of ids (the first and last few
    hundred, where special tokens live, and an even spread in between).
    """
    t_name, d_name = names[0] or "the target model", names[1] or "the draft model"
    if target.vocab_size != draft.vocab_size:
        raise InvalidParameterError(
            f"draft model {d_name} cannot draft for {t_name}: vocabularies differ "
            f"({draft.vocab_size} vs {target.vocab_size} tokens); pick a draft with the same "
            "tokenizer (the catalog names one per model)"
        )
    n = target.vocab_size
    ids = set(range(min(n, 128))) | set(range(max(0, n - 128), n))
    ids |= {int(i) for i in np.linspace(0, n - 1, num=min(n, SAMPLE_IDS))}
    for i in sorted(ids):
        if target.token_bytes(i) != draft.token_bytes(i):
            raise InvalidParameterError(
                f"draft model {d_name} cannot draft for {t_name}: token {i} is "
                f"{draft.token_bytes(i)!r} there and {target.token_bytes(i)!r} here; pick a "
                "draft with the same tokenizer"
            )


@dataclass(slots=True, frozen=True)
class DraftItem:
    """One slot's request for proposals: its whole context (prompt + output, last token
    included) and how many tokens to propose."""

    slot: int
    context: Sequence[int]
    k: int
    params: SamplingParams
    rng: np.random.Generator


class DraftProposer:
    def __init__(self, runner: Runner, vocab_size: int) -> None:
        self.runner = runner
        self.vocab_size = vocab_size
        self.cached: list[list[int]] = [[] for _ in range(runner.info.slots)]
        for slot in range(runner.info.slots):
            runner.release(slot)  # the draft's view of its cache starts empty: make it so
        self.forwards = 0  # draft forward passes run (for cost accounting and tests)
        # Seconds the last propose() spent feeding a new prompt to the draft: a once-per-request
        # cost, left out of the draft's measured per-token cost.
        self.last_prefill_s = 0.0

    @property
    def max_ctx(self) -> int:
        return self.runner.info.max_ctx

    def propose(self, items: Sequence[DraftItem]) -> dict[int, Proposal]:
        """Proposals per slot. A failing draft model yields no proposals (never an error)."""
        # A context the draft cannot hold (a draft with a shorter context) gets no proposals.
        items = [it for it in items if it.k > 0 and len(it.context) < self.max_ctx]
        if not items:
            return {}
        try:
            return self._propose(items)
        except Exception:  # noqa: BLE001 - the draft is an optimisation; the target carries on
            log.exception("draft model failed; decoding these slots without speculation")
            for it in items:
                self._forget(it.slot)
            return {}

    def _propose(self, items: Sequence[DraftItem]) -> dict[int, Proposal]:
        batch: list[SlotWork] = []
        prefill: list[SlotWork] = []
        for it in items:
            cached = self.cached[it.slot]
            if self.runner.slot_length(it.slot) != len(cached):  # after a failed forward
                self.runner.release(it.slot)
                cached.clear()
            keep = min(shared_prefix(cached, it.context), len(it.context) - 1)
            if len(cached) > keep:
                self.runner.truncate(it.slot, keep)
                del cached[keep:]
            if len(it.context) - keep > PREFILL_SPLIT:
                # A new prompt: feed it without the first sampled token, as the target did.
                # Backends may compute a long chunk's KV slightly differently from a chunk one
                # token longer (llama.cpp does), and a draft whose cache matches the target's
                # agrees with it more often.
                prefill.append(SlotWork(it.slot, tuple(it.context[keep:-1]), keep))
                keep = len(it.context) - 1
            batch.append(SlotWork(it.slot, tuple(it.context[keep:]), keep))
        self.last_prefill_s = 0.0
        if prefill:
            started = time.perf_counter()
            self.runner.forward(prefill)
            self.last_prefill_s = time.perf_counter() - started
            self.forwards += 1
            for work in prefill:
                self.cached[work.slot].extend(work.tokens)
        tokens: dict[int, list[int]] = {it.slot: [] for it in items}
        rows: dict[int, list[np.ndarray]] = {it.slot: [] for it in items}
        live = list(items)
        while True:
            outs = self.runner.forward(batch)
            self.forwards += 1
            for work in batch:
                self.cached[work.slot].extend(work.tokens)
            nxt: list[SlotWork] = []
            still: list[DraftItem] = []
            for it, out in zip(live, outs, strict=True):
                token, q = self._choose(it, out[-1])
                tokens[it.slot].append(token)
                if q is not None:
                    rows[it.slot].append(q)
                # The last proposal is never fed: the target verifies it, and the next round
                # re-syncs the draft from the target's sequence anyway.
                length = len(self.cached[it.slot])
                if len(tokens[it.slot]) < it.k and length + 1 < self.max_ctx:
                    nxt.append(SlotWork(it.slot, (token,), length))
                    still.append(it)
            if not nxt:
                break
            batch, live = nxt, still
        result: dict[int, Proposal] = {}
        for it in items:
            q = np.stack(rows[it.slot]) if rows[it.slot] else None  # [k, vocab]
            result[it.slot] = Proposal(tuple(tokens[it.slot]), q)
        return result

    def _choose(self, it: DraftItem, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if it.params.greedy:
            row = np.asarray(logits, dtype=np.float32).reshape(-1)[: self.vocab_size]
            return int(np.argmax(row)), None  # a point mass: q is not needed
        q = proposal_probs(it.params, logits, self.vocab_size)
        return draw(q, it.rng), q

    def _forget(self, slot: int) -> None:
        try:
            self.runner.release(slot)
        except Exception:  # noqa: BLE001
            log.exception("releasing draft slot %d failed", slot)
        self.cached[slot].clear()

    def reset(self) -> None:
        """Forget every slot's cached context: the next proposals start from an empty cache."""
        for slot in range(len(self.cached)):
            self._forget(slot)

    def close(self) -> None:
        self.runner.close()
