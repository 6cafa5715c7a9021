"""The architecture numbers the budget works from: model facts (localinfer/facts/arch.py),
re-exported here for older imports."""

from __future__ import annotations

from localinfer.facts.arch import ArchSpec, active_ffn_width, count_params

__all__ = ["ArchSpec", "active_ffn_width", "count_params"]
