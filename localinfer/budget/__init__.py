"""Memory budget: weights + KV cache + overhead against a device, before anything is loaded."""

from __future__ import annotations

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
