"""ModelFacts: what the budget knows about one model, wherever it was read from (a file on disk:
model_facts.py; the Hub's metadata or a config.json: remote_facts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localinfer.budget.file_headers import Projector, WeightsHeader
from localinfer.facts.arch import ArchSpec
from localinfer.facts.quant import bytes_for_params, weight_bits
from localinfer.resolve import ResolvedModel

ModelFormat = Literal["gguf", "safetensors"]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    name: str
    arch: ArchSpec
    params: int
    native_quant: str  # the quantization the weights come in when none is asked for
    header: WeightsHeader | None  # exact figures from the file headers (on disk or the Hub's)
    resolved: ResolvedModel
    format: ModelFormat | None = None  # None: a catalog entry's numbers
    origin: str = ""  # where the numbers were read when not from files on disk
    projector: Projector | None = None  # a vision projector counted with the weights (--mmproj)
    projectors: tuple[str, ...] = ()  # the projectors beside the model (mmproj*.gguf)
    download_bytes: int | None = None  # size of the files on the Hub (remote models)
    hub_files: tuple[str, ...] = ()  # the Hub files the numbers were read from (remote models)

    def weights(self, quant: str) -> tuple[int, str]:
        """(bytes, how they were found) for the weights stored as `quant`."""
        if self.header is not None and quant == self.header.quant:
            kind = "GGUF header" if self.format == "gguf" else "safetensors headers"
            return self.header.weight_bytes, f"{kind} ({self.origin})" if self.origin else kind
        bits = float(weight_bits(quant))
        counted = f" (from {self.origin})" if self.header is None and self.origin else ""
        how = f"{self.params:,} params{counted} x {bits:g} bits"
        return bytes_for_params(self.params, quant), how
