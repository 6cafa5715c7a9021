"""ModelConfig from a Hugging Face config.json: the architecture numbers as
localinfer/facts/hf_config.py reads them (for the budget too), settled by the weights the
directory holds, plus RoPE, norms and the special-token ids."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from localinfer.errors import UnsupportedModelError
from localinfer.facts.hf_config import arch_fields, text_model_config
from localinfer.loading.model_config import (
    SUPPORTED_ARCHS,
    ModelConfig,
    RopeScaling,
    config_from_arch_fields,
)

# config.json model_type -> ModelConfig.arch
HF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # multimodal wrapper: the text model's numbers sit in text_config
}


def config_from_hf(
    cfg: dict[str, Any],
    path: Path,
    weight_names: Collection[str] = (),
    generation: dict[str, Any] | None = None,
) -> ModelConfig:
    """``weight_names`` settles what the file really holds (q/k/v bias, lm_head)."""
    model_type = str(cfg.get("model_type", ""))
    if model_type not in HF_ARCHS:
        raise UnsupportedModelError(
            f"{path}: model_type '{model_type or '?'}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    arch = HF_ARCHS[model_type]
    text = text_model_config(cfg)
    fields = arch_fields(text, path)
    if weight_names:
        if "lm_head.weight" not in weight_names:
            fields["tied_embeddings"] = True  # some repos drop the copy; the embedding is the head
        fields["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in weight_names
    head_dim = int(fields["head_dim"])
    rope_params = text.get("rope_parameters")
    rope_params = rope_params if isinstance(rope_params, dict) else {}
    rope_theta = float(rope_params.get("rope_theta") or text.get("rope_theta") or 10000.0)
    rope_scaling, fields["max_ctx"] = _rope_scaling(
        text.get("rope_scaling") or rope_params, int(fields["max_ctx"])
    )
    bos, eos = _special_ids(text, generation or {})
    gemma3 = arch == "gemma3"
    return config_from_arch_fields(
        arch,
        fields,
        rope_theta=rope_theta,
        rms_eps=float(text.get("rms_norm_eps") or 1e-6),
        rope_scaling=rope_scaling,
        bos_token_id=bos,
        eos_token_ids=eos,
        rope_local_theta=float(text.get("rope_local_base_freq", 10000.0)) if gemma3 else None,
        query_pre_attn_scalar=float(text.get("query_pre_attn_scalar") or head_dim)
        if gemma3
        else None,
    )


def _rope_scaling(rs: dict[str, Any], max_ctx: int) -> tuple[RopeScaling | None, int]:
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "llama3":
        return (
            RopeScaling(
                kind="llama3",
                factor=float(rs["factor"]),
                low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
                high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
                original_max_position_embeddings=int(
                    rs.get("original_max_position_embeddings", 8192)
                ),
            ),
            max_ctx,
        )
    if kind == "linear" and float(rs.get("factor", 1.0)) != 1.0:
        return RopeScaling(kind="linear", factor=float(rs["factor"])), max_ctx
    if kind == "yarn":
        # Not implemented by the runners: stay inside the window the model was trained on.
        orig = rs.get("original_max_position_embeddings")
        return None, min(max_ctx, int(orig)) if orig else max_ctx
    return None, max_ctx


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _special_ids(
    cfg: dict[str, Any], generation: dict[str, Any]
) -> tuple[int | None, tuple[int, ...]]:
    bos = generation.get("bos_token_id", cfg.get("bos_token_id"))
    eos: list[int] = []
    for v in _ids(generation.get("eos_token_id")) + _ids(cfg.get("eos_token_id")):
        if v not in eos:
            eos.append(v)
    return (int(bos) if bos is not None else None), tuple(eos)
