"""llama.cpp's high-level ``Llama`` loaded as the runner loads its weights (see
bench/llamacpp_reference.py, which scripts/bench-llamacpp uses too)."""

from bench.llamacpp_reference import reference_llama

__all__ = ["reference_llama"]
