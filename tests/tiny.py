"""Tiny random-initialised models of each supported architecture, for property tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localinfer.loading.model import DictWeights, LoadedModel
from localinfer.loading.model_config import ModelConfig


def tiny_config(arch: str = "llama", vocab_size: int = 256, **overrides: object) -> ModelConfig:
    base: dict[str, object] = dict(
        arch=arch,
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn_size=128,
        vocab_size=vocab_size,
        max_ctx=512,
        rope_theta=10000.0,
        rms_eps=1e-5,
        tied_embeddings=arch in ("llama", "qwen3"),
        qk_norm=arch == "qwen3",
        attention_bias=arch == "qwen2",
        sliding_window=32 if arch == "mistral" else None,
        sliding_layers=(0, 1) if arch == "mistral" else (),
        eos_token_ids=(2,),
        bos_token_id=1,
    )
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def tiny_weights(config: ModelConfig, seed: int = 0) -> DictWeights:
    """Random weights scaled so activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    h, q, kv, f = config.hidden_size, config.q_size, config.kv_size, config.ffn_size

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(cols), size=(rows, cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.normal(size=n)).astype(np.float32)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(config.vocab_size, h) * 8}
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = mat(q, h)
        t[p + "self_attn.k_proj.weight"] = mat(kv, h)
        t[p + "self_attn.v_proj.weight"] = mat(kv, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, q)
        if config.attention_bias:
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                t[p + f"self_attn.{name}_proj.bias"] = (0.1 * rng.normal(size=n)).astype(np.float32)
        if config.qk_norm:
            t[p + "self_attn.q_norm.weight"] = norm(config.head_dim)
            t[p + "self_attn.k_norm.weight"] = norm(config.head_dim)
        t[p + "mlp.gate_proj.weight"] = mat(f, h)
        t[p + "mlp.up_proj.weight"] = mat(f, h)
        t[p + "mlp.down_proj.weight"] = mat(h, f)
    t["model.norm.weight"] = norm(h)
    if not config.tied_embeddings:
        t["lm_head.weight"] = mat(config.vocab_size, h)
    return DictWeights(t)


def tiny_model(
    arch: str = "llama",
    seed: int = 0,
    *,
    format: str = "safetensors",
    path: Path = Path("tiny"),
    name: str | None = None,
    tokenizer: object = None,
    weights: DictWeights | None = None,
    **overrides: object,
) -> LoadedModel:
    """A LoadedModel holding ``tiny_config(arch, **overrides)`` and its random weights (``seed``)
    in memory; ``format`` and ``path`` are what a runner is told the model came from."""
    config = tiny_config(arch, **overrides)
    return LoadedModel(
        name=name or f"tiny-{arch}",
        path=path,
        format=format,
        config=config,
        tokenizer=tokenizer,  # type: ignore[arg-type]
        chat_template=None,
        weights=weights or tiny_weights(config, seed),
        file_quant="F32",
    )


def random_tokens(n: int, vocab: int = 256, seed: int = 1) -> list[int]:
    """``n`` token ids drawn uniformly from ``[0, vocab)``."""
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()
