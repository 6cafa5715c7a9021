"""Quantized matrices MLX can run as stored: GGUF Q4_0/Q4_1/Q8_0 blocks and MLX-format
(mlx-community style) safetensors repos.

* GGUF: ``mx.load`` returns Q4_0/Q4_1/Q8_0 tensors already in MLX's affine format (packed uint32
  + float16 scales and offsets, group 32) under GGUF names. Q/K matrices of llama-architecture
  files are still in llama.cpp's interleaved-RoPE row order; their rows are put back in Hugging
  Face order here (rows of a quantized matrix are independent, so this is exact) and the model
  uses rotate-half RoPE for every file.
* MLX repos: ``config.json`` carries ``quantization: {group_size, bits}`` (with optional
  per-module overrides) and each quantized ``X.weight`` has ``X.scales`` / ``X.biases`` beside
  it, all under Hugging Face names.
"""

from __future__ import annotations

import json
import logging

import mlx.core as mx
import numpy as np

from localinfer.backends.mlx.layers import Matrix
from localinfer.backends.mlx.quant_spec import GGUF_GROUP_SIZE, NATIVE_GGUF_BITS
from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.gguf_split import gguf_part_paths
from localinfer.loading.gguf_weights import PERMUTED_QK_ARCHS, unpermute_qk
from localinfer.loading.model import LoadedModel

log = logging.getLogger(__name__)


def is_mlx_quantized_dir(model: LoadedModel) -> bool:
    return model.format == "safetensors" and any(
        n.endswith(".scales") for n in model.weights.names()
    )


def native_matrices(model: LoadedModel, scale_dtype: mx.Dtype) -> dict[str, tuple[Matrix, str]]:
    """HF weight name ("model.layers.0.self_attn.q_proj.weight") -> (matrix as stored, label of
    its format: the GGUF type or "int4-g64"); {} when the file holds nothing MLX runs as is."""
    if is_mlx_quantized_dir(model):
        return _mlx_dir_matrices(model, scale_dtype)
    if model.format == "gguf" and hasattr(model.weights, "gguf_name"):
        return _gguf_matrices(model, scale_dtype)
    return {}


def _gguf_matrices(model: LoadedModel, scale_dtype: mx.Dtype) -> dict[str, tuple[Matrix, str]]:
    source, c = model.weights, model.config
    wanted = [n for n in source.names() if source.quant_type(n) in NATIVE_GGUF_BITS]
    if not wanted:
        return {}
    try:
        arrays: dict[str, mx.array] = {}
        for part in gguf_part_paths(model.path):  # a split GGUF: every part's tensors
            arrays.update(mx.load(str(part)))
    except (RuntimeError, ValueError) as exc:
        # A type MLX's GGUF reader rejects: everything is dequantized by our own reader instead.
        log.warning("mx.load cannot read %s natively (%s); dequantizing instead", model.path, exc)
        return {}
    out: dict[str, tuple[Matrix, str]] = {}
    for name in wanted:
        stem = source.gguf_name(name).removesuffix(".weight")  # type: ignore[attr-defined]
        if f"{stem}.scales" not in arrays:
            continue
        qtype = source.quant_type(name)
        m = Matrix(
            arrays[f"{stem}.weight"],
            arrays[f"{stem}.scales"].astype(scale_dtype),
            arrays[f"{stem}.biases"].astype(scale_dtype),
            group_size=GGUF_GROUP_SIZE,
            bits=NATIVE_GGUF_BITS[qtype],
        )
        if c.arch in PERMUTED_QK_ARCHS and (".q_proj." in name or ".k_proj." in name):
            heads = c.n_heads if ".q_proj." in name else c.n_kv_heads
            order = unpermute_qk(np.arange(m.out_features), heads)  # HF row -> GGUF row
            m = m.take_rows(mx.array(order.astype(np.int32)))
        out[name] = (m, qtype)
    return out


def _mlx_dir_matrices(model: LoadedModel, scale_dtype: mx.Dtype) -> dict[str, tuple[Matrix, str]]:
    cfg_path = model.path / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    quant = cfg.get("quantization") or cfg.get("quantization_config")
    if not isinstance(quant, dict) or "group_size" not in quant or "bits" not in quant:
        raise ModelFileError(cfg_path, "quantized MLX weights but no quantization settings")
    if quant.get("mode", "affine") != "affine":
        raise UnsupportedModelError(
            f"{model.path}: MLX quantization mode {quant['mode']!r} is not supported (affine only)"
        )
    arrays: dict[str, mx.array] = {}
    for f in sorted(model.path.glob("*.safetensors")):
        arrays.update(mx.load(str(f)))
    out: dict[str, tuple[Matrix, str]] = {}
    for scales_name in (n for n in arrays if n.endswith(".scales")):
        stem = scales_name.removesuffix(".scales")
        # Per-module overrides (mixed recipes) sit beside the defaults under the module's path.
        own = quant.get(stem)
        settings = own if isinstance(own, dict) else quant
        group, bits = int(settings["group_size"]), int(settings["bits"])
        m = Matrix(
            arrays[f"{stem}.weight"],
            arrays[scales_name].astype(scale_dtype),
            arrays[f"{stem}.biases"].astype(scale_dtype),
            group_size=group,
            bits=bits,
        )
        out[f"{stem}.weight"] = (m, f"int{bits}-g{group}")
    return out


def dequantized(m: Matrix, dtype: mx.Dtype) -> mx.array:
    """[out, in] float weights of a quantized matrix."""
    assert m.scales is not None and m.biases is not None
    return mx.dequantize(
        m.weight,
        m.scales.astype(dtype),
        m.biases.astype(dtype),
        group_size=m.group_size,
        bits=m.bits,
    )
