"""llama.cpp's high-level ``Llama`` loaded as the runner loads its weights (see
backends/llamacpp/reference.py, which scripts/bench-llamacpp uses too)."""

from localinfer.backends.llamacpp.reference import reference_llama

__all__ = ["reference_llama"]
