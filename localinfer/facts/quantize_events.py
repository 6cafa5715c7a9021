"""What a GGUF re-quantization reports: progress per tensor and the finished file. Value objects
shared by llama.cpp's quantizer (backends/llamacpp/quantize.py) and the commands that show them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class QuantizeProgress:
    done: int  # tensors started so far (1-based index of the current one)
    total: int
    tensor: str


@dataclass(slots=True, frozen=True)
class QuantizeResult:
    source: Path
    output: Path
    quant: str  # e.g. "Q8_0"
    source_bytes: int
    output_bytes: int
    seconds: float
