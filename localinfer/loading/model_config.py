"""Architecture numbers of a loaded model, shared by runners, the budget and the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


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
