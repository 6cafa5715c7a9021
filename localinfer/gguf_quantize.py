"""A GGUF re-quantized by llama.cpp, for `localinfer quantize` and the llama.cpp candidates of
`localinfer quality`: the commands import no backend module (docs/layers.md), so they reach
llama.cpp's quantizer (backends/llamacpp/quantize.py, through the backend's profile) here.
Importing this imports no framework; llama_cpp loads when a file is written."""

from __future__ import annotations

from localinfer.backends.llamacpp.profile import quantize_gguf
from localinfer.facts.quantize_events import QuantizeProgress, QuantizeResult

__all__ = ["QuantizeProgress", "QuantizeResult", "quantize_gguf"]
