"""Memory budget: weights + KV cache + overhead against a device, before anything is loaded.

The budget imports no backend: ``compute.compute_budget`` costs the backend it is handed, and
``localinfer.backend_budget.compute_budget`` hands it the one this machine would run.
"""

from __future__ import annotations

from localinfer.budget.compute import (
    BudgetReport,
    BudgetRequest,
    Suggestion,
    VllmPlan,
    ensure_fits,
    kv_cache_bytes,
)

__all__ = [
    "BudgetReport",
    "BudgetRequest",
    "Suggestion",
    "VllmPlan",
    "ensure_fits",
    "kv_cache_bytes",
]
