"""A Hugging Face config.json read into ArchSpec's fields: the one reading that loading (its
ModelConfig) and the budget (its ArchSpec) both build on.

Multimodal checkpoints nest the language model under ``text_config``; a key the file leaves out
takes the value transformers fills in, so Gemma 3's five-key text_config reads as a whole model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localinfer.errors import ModelFileError
from localinfer.facts.arch import ArchFields, ArchSpec

# Values transformers fills in when config.json leaves a key out (Gemma3TextConfig's defaults).
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
        "rope_theta": 1_000_000.0,
    },
}
# config.json model_type -> the model_type ArchSpec names (the text model of the family).
_MODEL_TYPES = {"gemma3_text": "gemma3"}
# Qwen ships a sliding_window value but uses it only when use_sliding_window is set, and then only
# from layer max_window_layers on.
_QWEN_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def read_json_object(path: Path, required: bool = True) -> dict[str, Any]:
    """The JSON object in `path`; {} for a missing file that is not `required`."""
    if not path.is_file():
        if required:
            raise ModelFileError(path, f"missing {path.name}")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFileError(path, "malformed JSON: expected an object")
    return data


def text_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys of a config.json, with transformers' defaults filled in and
    ``model_type`` as ArchSpec names it."""
    nested = config.get("text_config")
    text = dict(nested) if isinstance(nested, dict) else dict(config)
    raw_type = str(text.get("model_type") or config.get("model_type") or "")
    text["model_type"] = _MODEL_TYPES.get(raw_type, raw_type)
    for key, value in _DEFAULTS.get(text["model_type"], {}).items():
        if text.get(key) is None:
            text[key] = value
    if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return text


def arch_fields(text: dict[str, Any], source: str | Path) -> ArchFields:
    """ArchSpec's fields from a text model config (text_model_config). Raises ModelFileError for
    a missing key or head numbers that are not whole numbers; the rest is checked by whoever
    builds on the fields."""
    missing = [key for key in _REQUIRED if text.get(key) is None]
    if "intermediate_size" not in text and "moe_intermediate_size" not in text:
        missing.append("intermediate_size")
    if text.get("max_position_embeddings") is None:
        missing.append("max_position_embeddings")
    if missing:
        raise ModelFileError(source, f"config.json lacks {', '.join(missing)}")
    n_heads, hidden = text["num_attention_heads"], text["hidden_size"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n_heads, hidden)):
        message = (
            f"num_attention_heads {n_heads!r} and hidden_size {hidden!r} must be whole numbers"
        )
        raise ModelFileError(source, message)
    model_type = text["model_type"]
    fields: ArchFields = {
        "arch": model_type or "llama",
        "n_layers": text["num_hidden_layers"],
        "hidden_size": hidden,
        "n_heads": n_heads,
        "n_kv_heads": text.get("num_key_value_heads") or n_heads,
        "head_dim": text.get("head_dim") or (hidden // n_heads if n_heads > 0 else 0),
        "ffn_size": text.get("intermediate_size") or text["moe_intermediate_size"],
        "vocab_size": text["vocab_size"],
        "max_ctx": text["max_position_embeddings"],
        "tied_embeddings": bool(text.get("tie_word_embeddings", False)),
        # Qwen2 and Qwen2-MoE put a bias on q/k/v without saying so in config.json.
        "attention_bias": bool(text.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        "qk_norm": model_type in ("qwen3", "qwen3_moe", "gemma3"),
        "n_mtp_layers": text.get("num_nextn_predict_layers") or 0,
    }
    fields.update(_sliding(text, model_type))
    fields.update(_experts(text))
    fields.update(_mla(text))
    return fields


def arch_from_hf_config(config: dict[str, Any], source: str | Path = "config.json") -> ArchSpec:
    """A config.json mapping as an ArchSpec; raises ModelFileError when it can't be one."""
    fields = arch_fields(text_model_config(config), source)
    try:
        return ArchSpec.from_fields(fields)
    except ValueError as exc:
        raise ModelFileError(source, f"config.json has a bad value ({exc})") from None


def _sliding(text: dict[str, Any], model_type: str) -> ArchFields:
    window = text.get("sliding_window")
    if not window or text.get("use_sliding_window") is False:
        return {}
    n_layers = text["num_hidden_layers"]
    if model_type in _QWEN_TYPES:
        if not text.get("use_sliding_window") or not isinstance(n_layers, int):
            return {}
        start = int(text.get("max_window_layers", n_layers))
        return {"sliding_window": window, "sliding_layers": tuple(range(start, n_layers))}
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        sliding = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
        return {"sliding_window": window, "sliding_layers": sliding}
    # No pattern: every layer slides (Mistral v0.1).
    return {"sliding_window": window, "sliding_pattern": text.get("sliding_window_pattern")}


def _experts(text: dict[str, Any]) -> ArchFields:
    n = text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")
    if not n:
        return {}
    # Mixtral's experts are intermediate_size wide; Qwen3-MoE/DeepSeek name moe_intermediate_size.
    width = text.get("moe_intermediate_size") or text.get("intermediate_size")
    out = {
        "n_experts": n,
        "n_experts_per_token": text.get("num_experts_per_tok", 0),
        "moe_ffn_size": width,
        "n_shared_experts": text.get("n_shared_experts") or 0,
        "first_dense_layers": text.get("first_k_dense_replace") or 0,
        "router_bias": text.get("topk_method") == "noaux_tc",
    }
    shared = text.get("shared_expert_intermediate_size")
    if shared:  # Qwen2-MoE: one gated shared expert of its own width
        out.update(shared_expert_ffn_size=shared, shared_expert_gate=True)
    return out


def _mla(text: dict[str, Any]) -> ArchFields:
    if not text.get("kv_lora_rank"):
        return {}
    nope, rope = text.get("qk_nope_head_dim"), text.get("qk_rope_head_dim")
    out = {
        "kv_lora_rank": text["kv_lora_rank"],
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": text.get("v_head_dim"),
        "q_lora_rank": text.get("q_lora_rank"),
    }
    if nope and rope:
        out["head_dim"] = nope + rope
    return out
