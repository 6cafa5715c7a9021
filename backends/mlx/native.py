"""Quantized matrices MLX runs as stored: a GGUF's block types and MLX-format (mlx-community
style) safetensors repos.

* GGUF: each Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and K-quant matrix is converted from its stored bytes to
  MLX's affine groups of 32 (gguf_forms.py says which form, gguf_blocks.py converts; our own
  reader, as ``mx.load`` rejects a file with any K-quant). Q/K matrices of llama-architecture
  files are in llama.cpp's interleaved-RoPE row order; their block rows are put back in Hugging
  Face order first (rows are independent, so this is exact) and the model uses rotate-half RoPE
  for every file.
* MLX repos: ``config.json`` carries ``quantization: {group_size, bits}`` (with optional
  per-module overrides) and each quantized ``X.weight`` has ``X.scales`` / ``X.biases`` beside
  it, all under Hugging Face names.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np

from localinfer.backends.mlx.gguf_blocks import convert
from localinfer.backends.mlx.gguf_forms import GROUP, held_form
from localinfer.backends.mlx.layers import Matrix
from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.gguf_weights import PERMUTED_QK_ARCHS, unpermute_qk
from localinfer.loading.model import LoadedModel


def is_mlx_quantized_dir(model: LoadedModel) -> bool:
    return model.format == "safetensors" and any(
        n.endswith(".scales") for n in model.weights.names()
    )


def native_matrices(model: LoadedModel, scale_dtype: mx.Dtype) -> dict[str, tuple[Matrix, str]]:
    """HF weight name ("model.layers.0.self_attn.q_proj.weight") -> (matrix as stored, label of
    its format: the GGUF type or "int4-g64"); {} when the file holds nothing MLX runs as is."""
    if is_mlx_quantized_dir(model):
        return _mlx_dir_matrices(model, scale_dtype)
    if model.format == "gguf" and hasattr(model.weights, "raw"):
        return _gguf_matrices(model, scale_dtype)
    return {}


def _gguf_matrices(model: LoadedModel, scale_dtype: mx.Dtype) -> dict[str, tuple[Matrix, str]]:
    source, c = model.weights, model.config
    out: dict[str, tuple[Matrix, str]] = {}
    for name in source.names():
        qtype = source.quant_type(name)  # type: ignore[attr-defined]
        shape = source.shape(name)  # type: ignore[attr-defined]
        form = held_form(qtype, shape)
        if form is None:
            continue
        rows = source.raw(name)  # type: ignore[attr-defined]  # [out, row bytes], GGUF order
        if c.arch in PERMUTED_QK_ARCHS and (".q_proj." in name or ".k_proj." in name):
            # Whole block rows move: exact, and the model uses rotate-half RoPE for every file.
            rows = unpermute_qk(rows, c.n_heads if ".q_proj." in name else c.n_kv_heads)
        out[name] = (gguf_matrix(qtype, rows, shape[1], form.bits, scale_dtype), qtype)
    return out


def gguf_matrix(
    type_name: str, rows: np.ndarray, cols: int, bits: int, scale_dtype: mx.Dtype
) -> Matrix:
    """Stored block rows [out, row bytes] of ``type_name`` -> a Matrix in MLX's affine groups of
    32 (gguf_forms.py): exact types keep their codes, the others are requantized from their
    dequantized values."""
    rounding = "bfloat16" if scale_dtype == mx.bfloat16 else "float16"
    packed, scales, biases = convert(type_name, rows, cols, bits, rounding)
    return Matrix(
        mx.array(packed),
        mx.array(scales).astype(scale_dtype),
        mx.array(biases).astype(scale_dtype),
        group_size=GROUP,
        bits=bits,
    )


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
