"""ModelConfig from a Hugging Face config.json (already in Hugging Face terms)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.model_config import SUPPORTED_ARCHS, ModelConfig, RopeScaling

# config.json model_type -> ModelConfig.arch
HF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # multimodal wrapper: the text model's numbers sit in text_config
}
# transformers' defaults for tie_word_embeddings, per model class
_TIED_DEFAULT = {"gemma3": True}
GEMMA3_SWA_PATTERN = 6


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
    if model_type == "gemma3" and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": "gemma3_text"}

    def req(key: str) -> Any:
        if cfg.get(key) is None:
            raise ModelFileError(path, f"config.json lacks '{key}'")
        return cfg[key]

    n_layers = int(req("num_hidden_layers"))
    hidden = int(req("hidden_size"))
    n_heads = int(req("num_attention_heads"))
    n_kv_heads = int(cfg.get("num_key_value_heads") or n_heads)
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    rope_params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    rope_theta = float(cfg.get("rope_theta") or rope_params.get("rope_theta") or 10000.0)
    max_ctx = int(cfg.get("max_position_embeddings") or 2048)
    rope_scaling, max_ctx = _rope_scaling(cfg.get("rope_scaling") or rope_params, max_ctx)

    tied = bool(cfg.get("tie_word_embeddings", _TIED_DEFAULT.get(arch, False)))
    if weight_names and "lm_head.weight" not in weight_names:
        tied = True  # some repos drop the copy; the embedding is the head then
    sliding_window, sliding_layers = _sliding(cfg, arch, n_layers)
    bos, eos = _special_ids(cfg, generation or {})
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn_size=int(req("intermediate_size")),
        vocab_size=int(req("vocab_size")),
        max_ctx=max_ctx,
        rope_theta=rope_theta,
        rms_eps=float(cfg.get("rms_norm_eps") or 1e-6),
        tied_embeddings=tied,
        qk_norm=arch in ("qwen3", "gemma3"),
        attention_bias=(
            "model.layers.0.self_attn.q_proj.bias" in weight_names
            if weight_names
            else arch == "qwen2" or bool(cfg.get("attention_bias"))
        ),
        rope_scaling=rope_scaling,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        bos_token_id=bos,
        eos_token_ids=eos,
        rope_local_theta=float(cfg.get("rope_local_base_freq", 10000.0))
        if arch == "gemma3"
        else None,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or head_dim)
        if arch == "gemma3"
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


def _sliding(cfg: dict[str, Any], arch: str, n_layers: int) -> tuple[int | None, tuple[int, ...]]:
    window = cfg.get("sliding_window")
    if not window:
        return None, ()
    window = int(window)
    if arch == "gemma3":
        types = cfg.get("layer_types")
        if isinstance(types, list) and len(types) == n_layers:
            return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        pattern = int(cfg.get("sliding_window_pattern") or GEMMA3_SWA_PATTERN)
        return window, tuple(i for i in range(n_layers) if (i + 1) % pattern)
    if arch in ("qwen2", "qwen3"):
        # Qwen ships a sliding_window value but only uses it when use_sliding_window is set, and
        # then only from layer max_window_layers on.
        if not cfg.get("use_sliding_window"):
            return None, ()
        start = int(cfg.get("max_window_layers", n_layers))
        return window, tuple(range(start, n_layers))
    return window, tuple(range(n_layers))


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
