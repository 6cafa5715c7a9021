"""Settings of speculative decoding (engine-wide; k itself adapts per slot)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """How speculation runs.

    ``verify_cost``: the extra cost of one more token in a target forward, as a fraction of a
    one-token decode step. ``draft_cost``: the cost of one draft-model step, same unit (0 for
    n-gram lookup). The adaptive controller picks the k that maximises expected tokens per unit
    of cost with these; scripts/bench-speculative measures both for a model and backend.

    ``max_busy_slots``: speculation runs only while at most this many slots are decoding; a busy
    batch already fills the machine, so verifying extra tokens costs real compute and stops
    paying. Measured by scripts/bench-speculative (see its output); configurable per engine.
    ``factory.default_config`` picks costs and this threshold per backend.

    ``k_start`` sets the prior acceptance, (k_start - 1) / k_start, that a new request starts
    from before its own verifications take over.
    """

    k_max: int = 8
    k_start: int = 4
    ngram_max: int = 4  # longest suffix looked up
    ngram_min: int = 2  # shortest suffix that counts as a match
    verify_cost: float = 0.1
    draft_cost: float = 0.0
    max_busy_slots: int = 2
    ema_decay: float = 0.7  # weight of the past in the running acceptance estimate
    probe_every: int = 16  # a slot whose k fell to 0 tries k=1 again after this many steps

    def __post_init__(self) -> None:
        if not 1 <= self.k_start <= self.k_max:
            raise ValueError(f"need 1 <= k_start <= k_max, got {self.k_start}, {self.k_max}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}")
        if self.verify_cost < 0 or self.draft_cost < 0:
            raise ValueError("costs must be >= 0")
        if self.max_busy_slots < 1:
            raise ValueError(f"max_busy_slots must be >= 1, got {self.max_busy_slots}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
