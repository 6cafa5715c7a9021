"""Architecture numbers of a loaded model, shared by runners, the budget and the catalog."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
# Qwen2-VL's and Qwen2.5-VL's text model (GGUF: qwen2vl), which only llama.cpp runs here: a Qwen2
# whose RoPE takes four positions a token (M-RoPE: an image's rows and columns).
QWEN2_VL = "qwen2_vl"


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling ("llama3"), or linear. None on ModelConfig: plain RoPE."""

    kind: str  # "llama3" | "linear"
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """Hyper-parameters in Hugging Face terms (whatever file they came from)."""

    arch: str  # one of SUPPORTED_ARCHS
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    max_ctx: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied_embeddings: bool = False
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm on per-head q and k
    attention_bias: bool = False  # qwen2: bias on q/k/v projections
    rope_scaling: RopeScaling | None = None
    # Sliding-window attention: window size, and which layers use it (None: no sliding layers).
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Gemma 3: sliding-window layers use their own RoPE base (None: rope_theta everywhere), and
    # attention scores are scaled by query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5).
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim


def config_from_arch_fields(arch: str, fields: Mapping[str, Any], **runner: Any) -> ModelConfig:
    """A ModelConfig from ArchSpec's fields as localinfer/facts reads them from a file (the
    numbers the budget works from too), plus the ones only the runners need (``runner``: RoPE,
    norm epsilon, special-token ids, ...)."""
    n_layers = int(fields["n_layers"])
    window = fields.get("sliding_window")
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        hidden_size=int(fields["hidden_size"]),
        n_heads=int(fields["n_heads"]),
        n_kv_heads=int(fields["n_kv_heads"]),
        head_dim=int(fields["head_dim"]),
        ffn_size=int(fields["ffn_size"]),
        vocab_size=int(fields["vocab_size"]),
        max_ctx=int(fields["max_ctx"]),
        tied_embeddings=bool(fields["tied_embeddings"]),
        qk_norm=bool(fields["qk_norm"]),
        attention_bias=bool(fields["attention_bias"]),
        sliding_window=int(window) if window else None,
        sliding_layers=_sliding_layers(fields, n_layers) if window else (),
        **runner,
    )


def _sliding_layers(fields: Mapping[str, Any], n_layers: int) -> tuple[int, ...]:
    """The sliding-window layers, spelled out (ArchSpec.is_sliding's rule)."""
    if fields.get("sliding_layers") is not None:
        return tuple(int(i) for i in fields["sliding_layers"])
    pattern = int(fields.get("sliding_pattern") or 0)
    return tuple(i for i in range(n_layers) if not pattern or (i + 1) % pattern)
