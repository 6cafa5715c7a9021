"""One step's ragged batch: what each running request feeds to the next forward.

Every decoding slot feeds its one sampled token (plus the speculative tokens proposed for it, with
``logits="all"``); prefilling slots share a per-step prompt-token budget in admission order, so a
long prompt is prefilled over several steps in the same forward as the running streams' decodes.
Decodes come first in the batch, then prefills.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from localinfer.backends.base import RunnerSampling, SlotWork, prompt_images
from localinfer.engine.runner_sampling import RunnerSamplingPolicy
from localinfer.engine.sequence import Sequence
from localinfer.engine.slots import SlotTable
from localinfer.engine.speculative import Proposal
from localinfer.engine.speculative.speculator import Candidate


@dataclass(slots=True)
class PlannedWork:
    """One request's part of the step's forward."""

    seq: Sequence
    work: SlotWork
    is_decode: bool
    proposal: Proposal | None = None  # speculative tokens fed after the last sampled one


def plan_batch(
    running: Seq[Sequence],
    slots: SlotTable,
    prefill_chunk: int,
    proposals: dict[int, Proposal],
    sampling: RunnerSamplingPolicy | None = None,
) -> list[PlannedWork]:
    """The step's work, decodes first; ``proposals`` maps a decoding slot to its proposal.
    With ``sampling``, an item whose token is due and needs nothing from the host carries its
    RunnerSampling (the runner then returns the token, not the logits)."""

    def sample(seq: Sequence) -> RunnerSampling | None:
        return None if sampling is None else sampling.for_sequence(seq)

    decodes: list[PlannedWork] = []
    prefills: list[PlannedWork] = []
    budget = prefill_chunk
    for seq in running:
        slot = slots.slots[seq.slot]  # type: ignore[index]
        start = len(slot.cached)
        pending = len(seq.tokens) - start
        if seq.num_output > 0:
            # Decoding: exactly the last sampled token is not in the cache yet.
            assert pending == 1, f"{seq.request_id}: {pending} tokens pending while decoding"
            proposal = proposals.get(slot.index)
            if proposal is None:
                work = SlotWork(slot.index, (seq.tokens[start],), start, sample=sample(seq))
            else:
                work = SlotWork(
                    slot.index, (seq.tokens[start], *proposal.tokens), start, logits="all"
                )
            decodes.append(PlannedWork(seq, work, is_decode=True, proposal=proposal))
        elif budget > 0:
            images = seq.request.images  # never split between steps: image_safe_end
            end = prompt_images.image_safe_end(images, start, start + min(pending, budget))
            n = end - start
            budget -= n
            due = sample(seq) if n == pending else None  # the last chunk gives the first token
            work = SlotWork(slot.index, tuple(seq.tokens[start:end]), start, sample=due,
                            images=prompt_images.images_within(images, start, end))  # fmt: skip
            prefills.append(PlannedWork(seq, work, is_decode=False))
    return decodes + prefills


def speculation_candidates(decoding: Seq[Sequence], max_ctx: int) -> list[Candidate]:
    """The decoding requests that have room for proposals, with how many each may take.
    Constrained requests never speculate: a proposal would have to pass the constraint too;
    nor do those with a thinking budget, whose closing tag is forced at an exact token, nor those
    with images (a proposal could copy an image's placeholder ids)."""
    candidates = []
    for seq in decoding:
        if seq.sampler.constraint is not None or seq.thinking_budget is not None:
            continue
        if seq.request.images:
            continue
        # Room: the forward must fit the context (len(tokens) + k <= max_ctx), and the
        # k + 1 tokens a verification can emit should fit max_tokens.
        room = min(max_ctx - len(seq.tokens), seq.params.max_tokens - seq.num_output - 1)
        if room > 0:
            candidates.append(Candidate(seq.slot, seq.tokens, room, seq.sampler))  # type: ignore[arg-type]
    return candidates
