"""KV-cache element types: the cache's bytes per row as the budget counts them and the cache
types a runner is asked for by name (``--kv-dtype``); llama.cpp's runner maps them to its own
(backends/llamacpp/cache_types.py), torch and MLX hold their cache in the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import InvalidParameterError
from localinfer.facts.quant import QUANT_ALIASES


@dataclass(frozen=True, slots=True)
class KVDtype:
    """A KV-cache element type stored in blocks of `block` elements taking `block_bytes` bytes."""

    name: str
    block: int
    block_bytes: int

    def row_bytes(self, elements: int) -> int:
        """Bytes of one cache row (llama.cpp rounds each row up to whole blocks)."""
        return -(-elements // self.block) * self.block_bytes


KV_DTYPES: dict[str, KVDtype] = {
    "f32": KVDtype("f32", 1, 4),
    "f16": KVDtype("f16", 1, 2),
    "bf16": KVDtype("bf16", 1, 2),
    "q8_0": KVDtype("q8_0", 32, 34),  # 8.5 bits
    "q4_0": KVDtype("q4_0", 32, 18),  # 4.5 bits
}


# A compute dtype's name as a cache element type (torch and MLX hold their KV cache in it).
DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def kv_dtype(name: str) -> KVDtype:
    key = QUANT_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in KV_DTYPES:
        raise InvalidParameterError(
            f"unknown KV cache dtype '{name}' (known: {', '.join(KV_DTYPES)})"
        )
    return KV_DTYPES[key]
