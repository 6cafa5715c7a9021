"""Read the budget's architecture numbers out of a Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localinfer.facts.arch import ArchSpec
from localinfer.errors import ModelFileError

# Values transformers fills in when config.json leaves a key out. Gemma 3's multimodal
# checkpoints rely on these: gemma-3-4b-it's text_config names only 5 keys.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {
        "vocab_size": 262208,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
}

_MODEL_TYPES = {
    "gemma3_text": "gemma3",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
}

_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in a config.json file (or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(path, "no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFileError(path, "config.json does not hold a JSON object")
    return data


def arch_from_hf_config(config: dict[str, Any], source: str = "config.json") -> ArchSpec:
    """Translate a config.json mapping into an ArchSpec; raises ModelFileError when it can't."""
    top = config
    cfg = dict(config.get("text_config") or config)  # multimodal checkpoints nest the LM
    raw_type = str(cfg.get("model_type") or top.get("model_type") or "")
    model_type = _MODEL_TYPES.get(raw_type, raw_type)
    for key, value in _DEFAULTS.get(model_type, {}).items():
        cfg.setdefault(key, value)
    if "tie_word_embeddings" not in cfg and "tie_word_embeddings" in top:
        cfg["tie_word_embeddings"] = top["tie_word_embeddings"]

    missing = [key for key in _REQUIRED if cfg.get(key) is None]
    if "intermediate_size" not in cfg and "moe_intermediate_size" not in cfg:
        missing.append("intermediate_size")
    if cfg.get("max_position_embeddings") is None:
        missing.append("max_position_embeddings")
    if missing:
        raise ModelFileError(source, f"config.json lacks {', '.join(missing)}")

    n_heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n_heads, hidden)):
        message = (
            f"num_attention_heads {n_heads!r} and hidden_size {hidden!r} must be whole numbers"
        )
        raise ModelFileError(source, message)
    fields: dict[str, Any] = {
        "arch": model_type or "llama",
        "n_layers": cfg["num_hidden_layers"],
        "hidden_size": hidden,
        "n_heads": n_heads,
        "n_kv_heads": cfg.get("num_key_value_heads") or n_heads,
        "head_dim": cfg.get("head_dim") or (hidden // n_heads if n_heads > 0 else 0),
        "ffn_size": cfg.get("intermediate_size") or cfg["moe_intermediate_size"],
        "vocab_size": cfg["vocab_size"],
        "max_ctx": cfg["max_position_embeddings"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "attention_bias": bool(cfg.get("attention_bias", model_type == "qwen2")),
        "qk_norm": model_type in ("qwen3", "qwen3_moe", "gemma3"),
    }
    fields.update(_sliding(cfg, model_type))
    fields.update(_experts(cfg, model_type))
    fields.update(_mla(cfg))
    try:
        return ArchSpec.from_fields(fields)
    except ValueError as exc:
        raise ModelFileError(source, f"config.json has a bad value ({exc})") from None


def _sliding(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    layer_types = cfg.get("layer_types")
    if layer_types:
        sliding = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
        return {"sliding_window": window, "sliding_layers": sliding}
    pattern = cfg.get("sliding_window_pattern")
    return {"sliding_window": window, "sliding_pattern": pattern}


def _experts(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    n = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if not n:
        return {}
    # Mixtral's experts are intermediate_size wide; Qwen3-MoE/DeepSeek name moe_intermediate_size.
    width = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    return {
        "n_experts": n,
        "n_experts_per_token": cfg.get("num_experts_per_tok", 0),
        "moe_ffn_size": width,
        "n_shared_experts": cfg.get("n_shared_experts") or 0,
        "first_dense_layers": cfg.get("first_k_dense_replace") or 0,
    }


def _mla(cfg: dict[str, Any]) -> dict[str, Any]:
    if not cfg.get("kv_lora_rank"):
        return {}
    nope, rope = cfg.get("qk_nope_head_dim"), cfg.get("qk_rope_head_dim")
    out = {
        "kv_lora_rank": cfg["kv_lora_rank"],
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": cfg.get("v_head_dim"),
        "q_lora_rank": cfg.get("q_lora_rank"),
    }
    if nope and rope:
        out["head_dim"] = nope + rope
    return out
