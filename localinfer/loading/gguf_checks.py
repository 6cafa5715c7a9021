"""A GGUF header's numbers checked against each other and against the tensors the file holds.

Backends trust these numbers: llama.cpp aborts the whole process (SIGABRT) on a block_count of 0
or a million, and a special-token id past the vocabulary indexes out of bounds. Each check turns
such a file into one ``ModelFileError`` with a one-line reason, before any backend sees it. The
exception: a special-token id localinfer never reads (pad, unk, sep, mask, fim_*) outside the
vocabulary is only reported back, for the caller to drop with a warning, as llama.cpp does.

- ``check_header`` holds for every architecture llama.cpp knows, and for header-only stand-ins
  that carry a few tensors; ``GGUFFile`` runs it on open, so the budget and the loaders get it.
- ``check_layers`` (every tensor shape of the architectures localinfer runs against their
  ``ModelConfig``) needs the whole model; ``config_from_gguf`` runs it, before any runner is
  made. block_count against the blk.N tensors is checked where the header's numbers are read
  (localinfer/facts/gguf_header.py), for loading and the budget alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.model_config import ModelConfig

# llama.cpp keeps these numbers in int32/uint32 fields.
MAX_COUNT = 2**31 - 1

# {arch}.KEY -> the least value allowed; all are integers. 0 is real for some keys: attention-free
# architectures (mamba) write head counts and feed_forward_length 0.
_ARCH_INTS: dict[str, int] = {
    "block_count": 1,
    "context_length": 1,
    "embedding_length": 1,
    "feed_forward_length": 0,
    "attention.head_count": 0,
    "attention.head_count_kv": 0,
    "attention.key_length": 1,
    "attention.value_length": 1,
    "attention.sliding_window": 0,
    "rope.dimension_count": 0,
    "rope.scaling.original_context_length": 1,
    "vocab_size": 1,
    "expert_count": 0,
    "expert_used_count": 0,
}
# Keys that may instead hold one value per layer (hybrid and pruned models).
_PER_LAYER = {"feed_forward_length", "attention.head_count", "attention.head_count_kv"}
# {arch}.KEY -> whether 0 is allowed; all are finite numbers >= 0.
_ARCH_FLOATS: dict[str, bool] = {
    "rope.freq_base": False,
    "rope.freq_base_swa": False,
    "attention.layer_norm_rms_epsilon": False,
    "attention.layer_norm_epsilon": False,
    "rope.scaling.factor": True,  # 0 means "no scaling" to llama.cpp
}
_TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "add_space_prefix")
_SPECIAL_ID = re.compile(r"^tokenizer\.ggml\.[a-z_]+_token_id$")
# The special-token ids localinfer reads (gguf_config.gguf_special_ids: BOS, and EOS/EOT/EOM as stop
# ids): one outside the vocabulary is refused. llama.cpp only warns about any bad special id and
# runs the file, and real GGUFs carry stray pad ids, so the others are dropped instead.
USED_SPECIAL_IDS = frozenset(
    f"tokenizer.ggml.{name}_token_id" for name in ("bos", "eos", "eot", "eom")
)


def _fail(path: Path, reason: str) -> ModelFileError:
    return ModelFileError(path, f"malformed GGUF file: {reason}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _int_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu"


def check_header(path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, Any]) -> list[str]:
    """Every architecture: number types and ranges, embedding width and vocabulary against
    token_embd, and every special-token id. Returns the keys of unused special-token ids that lie
    outside the vocabulary (not in USED_SPECIAL_IDS), for the caller to drop."""
    arch = metadata["general.architecture"]
    _check_arch_numbers(path, arch, metadata)
    _check_embedding(path, arch, metadata, tensors)
    return _check_tokenizer(path, metadata, tensors)


def _check_arch_numbers(path: Path, arch: str, metadata: Mapping[str, Any]) -> None:
    n_layers = metadata.get(f"{arch}.block_count")
    for key, least in _ARCH_INTS.items():
        full = f"{arch}.{key}"
        if full not in metadata:
            continue
        value = metadata[full]
        if key in _PER_LAYER and _int_array(value):
            if _is_int(n_layers) and len(value) != n_layers:
                raise _fail(
                    path, f"'{full}' has {len(value)} per-layer values for {n_layers} layers"
                )
            values = [int(v) for v in value]
        elif _is_int(value):
            values = [int(value)]
        else:
            raise _fail(path, f"'{full}' is {_describe(value)}, not an integer")
        for v in values:
            if not least <= v <= MAX_COUNT:
                raise _fail(path, f"'{full}' is {v}, outside {least}..{MAX_COUNT}")
    for key, zero_ok in _ARCH_FLOATS.items():
        full = f"{arch}.{key}"
        if full not in metadata:
            continue
        value = metadata[full]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _fail(path, f"'{full}' is {_describe(value)}, not a number")
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise _fail(path, f"'{full}' is {value}, not a {'' if zero_ok else 'positive '}number")


def _check_embedding(
    path: Path, arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any]
) -> None:
    embd = tensors.get("token_embd.weight")
    if embd is None:
        return
    if len(embd.shape) != 2:
        raise _fail(path, f"tensor 'token_embd.weight' has shape {embd.shape}, not 2-D")
    rows, width = embd.shape
    hidden = metadata.get(f"{arch}.embedding_length")
    if hidden is not None and int(hidden) != width:
        raise _fail(
            path, f"'{arch}.embedding_length' is {hidden} but token_embd.weight rows have {width}"
        )
    vocab = metadata.get(f"{arch}.vocab_size")
    if vocab is not None and int(vocab) != rows:
        raise _fail(path, f"'{arch}.vocab_size' is {vocab} but token_embd.weight has {rows} rows")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > rows:
        raise _fail(
            path,
            f"the vocabulary has {len(tokens)} tokens but token_embd.weight only {rows} rows",
        )


def _check_tokenizer(
    path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, Any]
) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        value = metadata.get(key)
        if value is not None and not isinstance(value, list):
            raise _fail(path, f"'{key}' is {_describe(value)}, not an array of strings")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        value = metadata.get(key)
        if value is not None and not (
            isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iuf"
        ):
            raise _fail(path, f"'{key}' is {_describe(value)}, not an array of numbers")
    for flag in _TOKENIZER_FLAGS:
        value = metadata.get(f"tokenizer.ggml.{flag}")
        if value is not None and not isinstance(value, bool | int):
            raise _fail(path, f"'tokenizer.ggml.{flag}' is {_describe(value)}, not a bool")
    template = metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise _fail(path, f"'tokenizer.chat_template' is {_describe(template)}, not a string")

    if tokens:
        size, what = len(tokens), "the vocabulary"
    elif "token_embd.weight" in tensors:
        size, what = tensors["token_embd.weight"].shape[0], "token_embd.weight"
    else:
        size, what = None, ""
    stray: list[str] = []
    for key in sorted(k for k in metadata if _SPECIAL_ID.match(k)):
        value = metadata[key]
        if not _is_int(value):  # llama.cpp aborts on a special id of the wrong type
            raise _fail(path, f"'{key}' is {_describe(value)}, not a token id")
        if size is None or 0 <= int(value) < size:
            continue
        if key not in USED_SPECIAL_IDS:
            stray.append(key)
            continue
        raise _fail(path, f"'{key}' is {value}, outside {what} (ids 0..{size - 1})")
    return stray


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, np.ndarray | list):
        return f"an array of {len(value)}"
    if isinstance(value, float):
        return f"{value!r}"
    return type(value).__name__


# -- the architectures localinfer runs ---------------------------------------------------------


def check_config_numbers(path: Path, c: ModelConfig, rope_dims: Any = None) -> None:
    """The numbers the runners divide and index by."""
    if c.n_heads < 1 or c.n_kv_heads < 1:
        raise _fail(path, f"{c.n_heads} attention heads and {c.n_kv_heads} KV heads")
    if c.n_heads % c.n_kv_heads:
        raise _fail(path, f"{c.n_heads} heads do not divide into {c.n_kv_heads} groups")
    if c.head_dim < 2 or c.head_dim % 2:
        raise _fail(path, f"head size {c.head_dim} is not a positive even number (RoPE pairs)")
    if rope_dims is not None and int(rope_dims) != c.head_dim:
        raise UnsupportedModelError(
            f"{path}: RoPE over {rope_dims} of {c.head_dim} head dimensions is not supported"
        )
    if c.ffn_size < 1:
        raise _fail(path, f"feed_forward_length is {c.ffn_size}")
    if c.sliding_window is not None and c.sliding_window < 1:
        raise _fail(path, f"sliding window of {c.sliding_window} tokens")


def check_layers(path: Path, c: ModelConfig, tensors: Mapping[str, Any]) -> None:
    """Every tensor a runner reads is present, with the shape the config's numbers give
    (numpy order: [out, in])."""
    q, kv, h, f = c.q_size, c.kv_size, c.hidden_size, c.ffn_size
    want: dict[str, tuple[tuple[int, ...], str]] = {
        "token_embd.weight": ((c.vocab_size, h), "vocab, embedding_length"),
        "output_norm.weight": ((h,), "embedding_length"),
    }
    if not c.tied_embeddings:
        want["output.weight"] = ((c.vocab_size, h), "vocab, embedding_length")
    if "rope_freqs.weight" in tensors:
        want["rope_freqs.weight"] = ((c.head_dim // 2,), "head size / 2")
    qkv = "head_count × key_length"
    kvkv = "head_count_kv × key_length"
    layer: dict[str, tuple[tuple[int, ...], str]] = {
        "attn_norm.weight": ((h,), "embedding_length"),
        "attn_q.weight": ((q, h), f"{qkv}, embedding_length"),
        "attn_k.weight": ((kv, h), f"{kvkv}, embedding_length"),
        "attn_v.weight": ((kv, h), f"{kvkv}, embedding_length"),
        "attn_output.weight": ((h, q), f"embedding_length, {qkv}"),
        "ffn_norm.weight": ((h,), "embedding_length"),
        "ffn_gate.weight": ((f, h), "feed_forward_length, embedding_length"),
        "ffn_up.weight": ((f, h), "feed_forward_length, embedding_length"),
        "ffn_down.weight": ((h, f), "embedding_length, feed_forward_length"),
    }
    if c.qk_norm:
        layer["attn_q_norm.weight"] = ((c.head_dim,), "key_length")
        layer["attn_k_norm.weight"] = ((c.head_dim,), "key_length")
    if c.attention_bias:
        layer["attn_q.bias"] = ((q,), qkv)
        layer["attn_k.bias"] = ((kv,), kvkv)
        layer["attn_v.bias"] = ((kv,), kvkv)
    if c.arch == "gemma3":
        layer["post_attention_norm.weight"] = ((h,), "embedding_length")
        layer["post_ffw_norm.weight"] = ((h,), "embedding_length")
    for i in range(c.n_layers):
        want.update({f"blk.{i}.{name}": spec for name, spec in layer.items()})
    for name, (shape, why) in want.items():
        info = tensors.get(name)
        if info is None:
            raise _fail(path, f"missing tensor '{name}' ({c.arch}, {c.n_layers} layers)")
        if tuple(info.shape) != shape:
            raise _fail(
                path,
                f"tensor '{name}' has shape {tuple(info.shape)} but the header's numbers give "
                f"{shape} ({why})",
            )
