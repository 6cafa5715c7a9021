"""Memory budget: weights + KV cache + overhead against a device, before anything is loaded.

The public names load lazily: catalog.py and resolve.py import this package's small leaf modules
(arch, quant), and an eager import of compute.py here would import them back in a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localinfer.budget.compute import (
        BudgetReport,
        BudgetRequest,
        Suggestion,
        VllmPlan,
        compute_budget,
        ensure_fits,
        kv_cache_bytes,
    )

__all__ = [
    "BudgetReport",
    "BudgetRequest",
    "Suggestion",
    "VllmPlan",
    "compute_budget",
    "ensure_fits",
    "kv_cache_bytes",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from localinfer.budget import compute

        return getattr(compute, name)
    raise AttributeError(f"module 'localinfer.budget' has no attribute '{name}'")
