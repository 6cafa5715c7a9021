"""Write tiny random models as real GGUF files, so llama.cpp (and GGUF loaders) can be tested fast.

``write_tiny_gguf(path, config, weights)`` takes the Hugging Face-layout weights of
``tests/tiny.py`` and writes them the way llama.cpp's converter does: GGUF tensor names, Q/K rows
permuted for llama.cpp's interleaved RoPE (llama/mistral only; qwen2/qwen3 use the NeoX form and
are stored as-is), norms in F32 and matrices in F32 or F16.

Tokenizer choices:

* ``"none"`` - no tokenizer; llama.cpp makes ``vocab_size`` dummy tokens (runner tests).
* ``"bytes"`` - a GPT-2 byte-level BPE: ids 0-2 are ``<|pad|>``, ``<|bos|>``, ``<|eos|>``
  (matching tiny_config's bos 1 / eos 2), ids 3..258 the 256 byte symbols, id 259 the one merge
  (two spaces; llama.cpp refuses a BPE vocab without merges), the rest filler control tokens.
  Needs ``vocab_size >= 260``. Any text round-trips.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from localinfer.loading.model import WeightSource
from localinfer.loading.model_config import ModelConfig

Tokenizer = Literal["none", "bytes"]
Storage = Literal["f32", "f16"]

# HF name suffix -> GGUF name suffix, per layer.
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_INTERLEAVED_ROPE = {"llama", "mistral"}


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half row order -> llama.cpp interleaved order (what convert_hf_to_gguf does).

    w: [n_heads * head_dim, hidden]; within each head, rows (i, i + head_dim/2) become (2i, 2i+1).
    """
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape).copy()


def gguf_tensors(
    config: ModelConfig, weights: WeightSource, storage: Storage = "f32"
) -> dict[str, np.ndarray]:
    """GGUF name -> array (numpy shape as in HF: [out, in]; gguf reverses it to ggml order)."""
    matrix_dtype = np.float16 if storage == "f16" else np.float32
    out: dict[str, np.ndarray] = {}

    def put(name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        out[name] = arr.astype(np.float32 if arr.ndim == 1 else matrix_dtype)

    put("token_embd.weight", weights.get("model.embed_tokens.weight"))
    put("output_norm.weight", weights.get("model.norm.weight"))
    if not config.tied_embeddings:
        put("output.weight", weights.get("lm_head.weight"))
    names = set(weights.names())
    permute = config.arch in _INTERLEAVED_ROPE
    for i in range(config.n_layers):
        for hf, gg in _LAYER_NAMES.items():
            key = f"model.layers.{i}.{hf}"
            if key not in names:
                continue
            arr = weights.get(key)
            if permute and hf.startswith("self_attn.q_proj"):
                arr = permute_for_gguf(arr, config.n_heads)
            elif permute and hf.startswith("self_attn.k_proj"):
                arr = permute_for_gguf(arr, config.n_kv_heads)
            put(f"blk.{i}.{gg}", arr)
    return out


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def add_model_header(w: Any, config: ModelConfig) -> None:
    """The architecture keys a loader needs (context, sizes, heads, RoPE, norm eps, vocab) on a
    gguf.GGUFWriter."""
    w.add_context_length(config.max_ctx)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.n_layers)
    w.add_feed_forward_length(config.ffn_size)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_eps)
    w.add_vocab_size(config.vocab_size)


def write_tiny_gguf(
    path: str | Path,
    config: ModelConfig,
    weights: WeightSource,
    *,
    storage: Storage = "f32",
    tokenizer: Tokenizer = "none",
    name: str = "tiny",
) -> Path:
    """Write ``weights`` as a GGUF llama.cpp can load; returns the path."""
    import gguf

    if config.arch not in _GGUF_ARCH:
        raise ValueError(f"no GGUF writer for arch {config.arch!r}")
    if config.sliding_layers:
        raise ValueError(
            "sliding-window tiny models are not written to GGUF (llama.cpp's llama "
            "arch has no per-layer window); use tiny_config(..., sliding_window=None, "
            "sliding_layers=())"
        )
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch=_GGUF_ARCH[config.arch])
    w.add_name(name)
    add_model_header(w, config)
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if storage == "f16" else gguf.LlamaFileType.ALL_F32
    )
    if tokenizer == "none":
        w.add_tokenizer_model("none")
    else:
        if config.vocab_size < 260:
            raise ValueError("the 'bytes' tokenizer needs vocab_size >= 260")
        specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
        space = _byte_symbols()[ord(" ")]
        tokens = specials + _byte_symbols() + [space + space]
        tokens += [f"<|extra_{i}|>" for i in range(config.vocab_size - len(tokens))]
        control = int(gguf.TokenType.CONTROL)
        types = [control] * 3 + [int(gguf.TokenType.NORMAL)] * 257
        types += [control] * (config.vocab_size - len(types))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges([f"{space} {space}"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(0)
        w.add_add_bos_token(False)
    for tensor_name, arr in gguf_tensors(config, weights, storage).items():
        w.add_tensor(tensor_name, arr)
    finish_gguf(w)
    return path


# -- hostile files: a real GGUF with its header edited ----------------------------------------

GGUF_U32, GGUF_F32, GGUF_STRING, GGUF_ARRAY, GGUF_U64 = 4, 6, 8, 9, 10


def finish_gguf(writer: Any) -> None:
    """Write what a ``gguf.GGUFWriter`` holds (header, metadata, tensors) and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def raw_u32(value: int) -> bytes:
    """A metadata value (type + payload) as stored: u32."""
    return struct.pack("<II", GGUF_U32, value)


def raw_f32(value: float) -> bytes:
    return struct.pack("<If", GGUF_F32, value)


def raw_u64(value: int) -> bytes:
    return struct.pack("<IQ", GGUF_U64, value)


def raw_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<IQ", GGUF_STRING, len(data)) + data


def raw_nested_array(depth: int) -> bytes:
    """An array of arrays ``depth`` levels deep; the innermost is an empty u8 array."""
    body = struct.pack("<IQ", 0, 0)
    for _ in range(depth - 1):
        body = struct.pack("<IQ", GGUF_ARRAY, 1) + body
    return struct.pack("<I", GGUF_ARRAY) + body


def rewrite_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    set_kv: Mapping[str, bytes] | None = None,
    drop_kv: Iterable[str] = (),
    tensor_dims: Mapping[str, tuple[int, ...]] | None = None,
    drop_tensors: Iterable[str] = (),
) -> Path:
    """A copy of the GGUF ``src`` with its header edited byte for byte: metadata values replaced
    or added (``set_kv``: key -> ``raw_*`` bytes) or dropped, tensor dimensions (GGUF order,
    innermost first) replaced, tensor infos dropped. Tensor data is copied unchanged, so a file
    can claim what its bytes cannot back: the point is to make the impossible ones."""
    import gguf

    set_kv = dict(set_kv or {})
    tensor_dims = dict(tensor_dims or {})
    drop_kv, drop_tensors = set(drop_kv), set(drop_tensors)
    reader = gguf.GGUFReader(str(src))

    def key_bytes(name: str) -> bytes:
        data = name.encode("utf-8")
        return struct.pack("<Q", len(data)) + data

    kvs: list[bytes] = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in drop_kv:
            continue
        if name in set_kv:
            kvs.append(key_bytes(name) + set_kv.pop(name))
        else:
            kvs.append(b"".join(p.tobytes() for p in field.parts))
    kvs += [key_bytes(name) + value for name, value in set_kv.items()]

    infos: list[bytes] = []
    for tensor in reader.tensors:
        if tensor.name in drop_tensors:
            continue
        parts = tensor.field.parts  # name length, name, n_dims, dims, type, offset
        dims = tensor_dims.get(tensor.name, tuple(int(d) for d in parts[3]))
        infos.append(
            key_bytes(tensor.name)
            + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims)
            + parts[4].tobytes()
            + parts[5].tobytes()
        )

    version = int(reader.fields["GGUF.version"].parts[-1][0])
    out = b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs)
    out += b"".join(infos)
    out += b"\0" * (-len(out) % reader.alignment)
    with open(src, "rb") as f:
        f.seek(reader.data_offset)
        data = f.read()
    Path(dst).write_bytes(out + data)
    return Path(dst)
