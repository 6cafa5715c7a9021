"""The element types llama.cpp can keep its K and V cache in (``--kv-dtype``), and their sizes.

llama.cpp stores each cache row in blocks of its type: F16/BF16/F32 one element per block, Q8_0
and Q4_0 32 elements in 34 and 18 bytes (8.5 and 4.5 bits). The budget's KVDtype table holds the
same sizes, so the runner reports the bytes the budget predicted. A quantized V cache needs
llama.cpp's fused (flash) attention, which reads V as stored; without it llama.cpp transposes V
and refuses a quantized type, so the runner turns flash attention on for those.
"""

from __future__ import annotations

from typing import Any

from localinfer.errors import InvalidParameterError
from localinfer.facts.kv_dtype import KVDtype, kv_dtype

DEFAULT = "f16"  # llama.cpp's own default
GGML_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}  # enum ggml_type


def cache_type(name: str | None) -> KVDtype:
    """The KV element type ``--kv-dtype`` names (None: F16), parsed as the budget parses it;
    InvalidParameterError for a name that is none of them."""
    kv = kv_dtype(DEFAULT if name is None else name)  # "" is a mistake, not the default
    if kv.name not in GGML_TYPE_IDS:  # a type the budget knows and this table does not
        raise InvalidParameterError(f"--kv-dtype {name}: llama.cpp has no {kv.name} KV cache")
    return kv


def ggml_type_id(kv: KVDtype) -> int:
    return GGML_TYPE_IDS[kv.name]


def is_quantized(kv: KVDtype) -> bool:
    """Block-quantized (Q8_0, Q4_0): V must then be read by flash attention."""
    return kv.block > 1


def cache_bytes(cells: int, layers: int, k_width: int, v_width: int, kv: KVDtype) -> int:
    """Bytes of ``cells`` cells per layer, each a K row of ``k_width`` elements and a V row of
    ``v_width`` (all KV heads), rows rounded up to whole blocks as llama.cpp stores them."""
    return cells * layers * (kv.row_bytes(k_width) + kv.row_bytes(v_width))


def computed_cache_bytes(llama: Any, model: Any, ctx: Any, kv: KVDtype) -> int:
    """A context's KV bytes from the model's shapes: cells x layers x (a K row + a V row)."""
    from localinfer.backends.llamacpp.native import model_meta

    cells = int(llama.llama_n_ctx(ctx))
    layers = int(llama.llama_model_n_layer(model))
    embd = int(llama.llama_model_n_embd(model))
    heads = int(llama.llama_model_n_head(model))
    kv_heads = int(llama.llama_model_n_head_kv(model))
    arch = model_meta(llama, model, "general.architecture") or ""
    k_dim = int(model_meta(llama, model, f"{arch}.attention.key_length") or embd // heads)
    v_dim = int(model_meta(llama, model, f"{arch}.attention.value_length") or embd // heads)
    return cache_bytes(cells, layers, kv_heads * k_dim, kv_heads * v_dim, kv)
