"""What the chat's memory panel shows: the budget's prediction beside what was measured."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class MemoryParts:
    weights: int
    kv_cache: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead


@dataclass(slots=True, frozen=True)
class MemoryFigures:
    """Predicted (budget) next to measured memory, in bytes; None where unknown.

    ``measured`` is the quantity the budget predicts and `budget --verify` checks: the process's
    growth from loading the model (localinfer/budget/measured.py), split into the same parts;
    ``reserved`` is what the backend holds beyond weights + KV, written or not (llama.cpp's
    compute buffers), shown apart and never added to what is used.
    """

    predicted: MemoryParts | None = None
    measured: MemoryParts | None = None
    available: int | None = None  # what the budget says this machine can give
    device: str = ""
    reserved: int | None = None
    library_preloaded: bool = False  # the growth lacks the backend's library (loaded before)
    served_by: str | None = None  # "served by URL": the model lives in another process
    served_budget: int | None = None  # the server's budget total for its model, if it says
    served_state: str | None = None  # the server's word for its model: loaded, loading...
