"""What loading a model yields: config, tokenizer, chat template and a lazy weight source.

Weights are exposed under Hugging Face Llama-style names in Hugging Face layout (rotate-half RoPE:
GGUF Q/K rows are un-permuted on load), whatever the file format, so every runner sees one layout:

    model.embed_tokens.weight                      [vocab, hidden]
    model.layers.{i}.input_layernorm.weight        [hidden]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias for qwen2 q/k/v)
    model.layers.{i}.self_attn.{q,k}_norm.weight   [head_dim]  (qwen3)
    model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.norm.weight
    lm_head.weight                                 (absent when embeddings are tied)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from localinfer.loading.model_config import ModelConfig

if TYPE_CHECKING:
    from localinfer.loading.chat_template import ChatTemplate
    from localinfer.loading.tokenizer import Tokenizer


class WeightSource(Protocol):
    """Lazy access to a model's tensors (dequantized on demand)."""

    def names(self) -> list[str]:
        """All tensor names, in Hugging Face naming."""
        ...

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 in Hugging Face layout; KeyError if absent."""
        ...

    def quant_type(self, name: str) -> str:
        """Storage type in the file, e.g. "Q4_1", "F32", "BF16"."""
        ...

    def nbytes(self) -> int:
        """Bytes of all tensors as stored in the file."""
        ...


@dataclass(slots=True)
class LoadedModel:
    name: str
    path: Path  # the GGUF file, or the Hugging Face directory
    format: Literal["gguf", "safetensors"]
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    weights: WeightSource
    file_quant: str  # dominant storage type, e.g. "Q4_1", "BF16"


class DictWeights:
    """In-memory float32 weights (tiny random test models, already-dequantized tensors)."""

    def __init__(self, tensors: dict[str, np.ndarray], quant: str = "F32") -> None:
        self._tensors = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
        self._quant = quant

    def names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str) -> np.ndarray:
        return self._tensors[name]

    def quant_type(self, name: str) -> str:
        if name not in self._tensors:
            raise KeyError(name)
        return self._quant

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tensors.values())
