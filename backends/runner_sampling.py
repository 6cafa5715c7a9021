"""Drawing tokens inside a runner: what the engine asks for (:class:`RunnerSampling`, carried by
``SlotWork.sample``) and the capability a runner declares to take it (:class:`SamplesInRunner`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(slots=True, frozen=True)
class RunnerSampling:
    """Draw a slot's next token inside the runner, from the distribution the engine's host sampler
    defines (temperature, top-k, softmax, min-p, top-p; argmax, first on ties, when temperature
    is 0), so no vocabulary-sized logits row crosses the seam. ``stream`` names the request: a new
    value starts a new generator seeded with ``seed`` (0 <= seed < 2**32), so a request's draws
    do not depend on what shares its batch."""

    stream: int
    seed: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in [0, 2**32), got {self.seed}")


@runtime_checkable
class SamplesInRunner(Protocol):
    """Optional runner capability: ``forward`` draws the token of every item whose
    :attr:`SlotWork.sample` is set (llama.cpp: its own sampler chain, reading its logits buffer in
    place). ``release`` of a slot ends its generator."""

    samples_in_runner: bool
    # Whether seeded (temperature > 0) draws are worth sending: False where the runner's draw
    # costs more than the host's; the runner still takes them when asked.
    seeded_in_runner: bool
