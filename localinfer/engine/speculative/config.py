"""Settings of speculative decoding (engine-wide; k itself adapts per slot)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """How speculation runs.

    A verification of k proposals costs ``1 + verify_fixed + k * (verify_cost + draft_cost)``
    one-token decode steps. ``verify_cost``: the extra cost of one more token in a target
    forward. ``verify_fixed``: what any multi-token forward costs beyond a one-token step on a
    backend whose one-token path is special (llama.cpp's CPU matrix-vector kernels: a 2-token
    forward there costs ~1.7-1.9 steps, but each further token only ~0.5). ``draft_cost``: one
    draft-model step (0 for n-gram lookup); only a starting guess, the Speculator measures it
    while it runs (seeded sampled requests keep the guess, so they repeat exactly). The
    adaptive controller picks the k that maximises expected tokens per unit of cost with these;
    scripts/bench-speculative measures them for a model and backend.

    ``max_busy_slots``: speculation runs only while at most this many slots are decoding; a busy
    batch already fills the machine, so verifying extra tokens costs real compute and stops
    paying. Measured by scripts/bench-speculative (see its output); configurable per engine.
    ``localinfer.speculation.default_spec_config`` takes the costs and this threshold from the
    target's backend profile.

    ``prior_acceptance`` is the acceptance a new request starts from before its own
    verifications take over (adaptive.py); paused slots probe every ``probe_every`` steps at
    first, backing off while probes fail. Until a request has evidence of its own (its first
    verification, and each probe) an n-gram proposal needs a match of ``ngram_max`` tokens: a
    short match in free text is not worth a multi-token forward. Even with evidence, a suffix of
    fewer than ``ngram_min`` = 3 tokens is no match: after an edit point a 2-token match mostly
    proposes the wrong continuation (scripts/spec-replay, llama.cpp costs, editing answers:
    1.61x modelled with 3 vs 1.54x with 2; free chat the same).
    """

    k_max: int = 16
    prior_acceptance: float = 0.9
    ngram_max: int = 4  # longest suffix looked up
    ngram_min: int = 3  # shortest suffix that counts as a match (see below)
    verify_cost: float = 0.1
    verify_fixed: float = 0.0
    draft_cost: float = 0.0
    min_gain: float = 1.05  # a k > 0 must promise this much over plain decoding
    measure_draft_cost: bool = True  # False: keep draft_cost as given (tests, fixed setups)
    max_busy_slots: int = 2
    ema_decay: float = 0.7  # weight of the past in the running acceptance estimate
    probe_every: int = 16  # a paused slot first probes again after this many steps

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        if not 0.0 <= self.prior_acceptance < 1.0:
            raise ValueError(f"prior_acceptance must be in [0, 1), got {self.prior_acceptance}")
        if self.min_gain < 1.0:
            raise ValueError(f"min_gain must be >= 1, got {self.min_gain}")
        if self.probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {self.probe_every}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}")
        if self.verify_cost < 0 or self.draft_cost < 0 or self.verify_fixed < 0:
            raise ValueError("costs must be >= 0")
        if self.max_busy_slots < 1:
            raise ValueError(f"max_busy_slots must be >= 1, got {self.max_busy_slots}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
