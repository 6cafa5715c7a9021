"""A decoder's shape as far as memory is concerned, and its exact parameter count.

`ArchSpec` is filled from a catalog entry (models.toml), a Hugging Face config.json or a GGUF
header. Names follow Hugging Face's config.json where one exists.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# ArchSpec's fields as a file gives them, not yet checked: the readers (hf_config, gguf_header)
# fill them; the budget validates them as an ArchSpec, loading builds its ModelConfig from them.
ArchFields = dict[str, Any]


class AttentionHeads(Protocol):
    """What names a model's attention heads: an ArchSpec, a runner's ModelConfig."""

    @property
    def n_heads(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


class ArchSpec(BaseModel):
    """Shape of a decoder-only transformer, as far as memory is concerned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str  # HF model_type: llama, mistral, qwen2, qwen3, qwen3_moe, gemma3, phi3, deepseek_v2
    n_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn_size: int = Field(gt=0)  # dense MLP width (DeepSeek: the leading dense layers)
    vocab_size: int = Field(gt=0)
    max_ctx: int = Field(gt=0)
    tied_embeddings: bool = False
    attention_bias: bool = False  # qwen2: bias on q/k/v
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm over each q/k head
    # Sliding-window attention. With `sliding_pattern` p, layer i uses full attention when
    # (i + 1) % p == 0 and the window otherwise (Gemma 3: p = 6). Without a pattern (and without an
    # explicit `sliding_layers` list) every layer slides (Mistral v0.1).
    sliding_window: int | None = Field(default=None, gt=0)
    sliding_pattern: int | None = Field(default=None, gt=0)
    sliding_layers: tuple[int, ...] | None = None
    # Mixture of experts: every expert is resident in memory, only `n_experts_per_token` run.
    n_experts: int = Field(default=0, ge=0)
    n_experts_per_token: int = Field(default=0, ge=0)
    moe_ffn_size: int | None = Field(default=None, gt=0)
    n_shared_experts: int = Field(default=0, ge=0)
    # Qwen2-MoE: one shared expert of its own width (shared_expert_intermediate_size) behind a
    # sigmoid gate (hidden -> 1), instead of n_shared_experts of the routed experts' width.
    shared_expert_ffn_size: int | None = Field(default=None, gt=0)
    shared_expert_gate: bool = False
    first_dense_layers: int = Field(default=0, ge=0)  # DeepSeek first_k_dense_replace
    # Multi-head latent attention (DeepSeek-V2/V3): the cache holds one compressed latent of
    # kv_lora_rank plus the shared RoPE key of qk_rope_head_dim per token per layer.
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    v_head_dim: int | None = Field(default=None, gt=0)
    q_lora_rank: int | None = Field(default=None, gt=0)
    # DeepSeek-V3 (topk_method noaux_tc): a per-expert bias on the router's scores.
    router_bias: bool = False
    # Multi-token-prediction modules (DeepSeek-V3's num_nextn_predict_layers): each is one more
    # decoder layer plus its own embedding, head, eh_proj (2h -> h) and three norms. Checkpoints
    # store them (DeepSeek-V3's 685B on the Hub = 671B + 14B of MTP), so the count has them; they
    # hold no KV for the main model's tokens: n_layers (what the KV cache counts) leaves them out.
    n_mtp_layers: int = Field(default=0, ge=0)
    # A reranker (GGUF rank pooling, facts/pooling.py): llama.cpp scores its pairs in a context
    # of its own beside the generation context (budget/planner.py counts it).
    reranker: bool = False
    # An encoder (non-causal attention: a BERT reranker): llama.cpp keeps no KV cache for it.
    encoder: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ArchSpec:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads")
        if self.n_experts and not (0 < self.n_experts_per_token <= self.n_experts):
            raise ValueError("n_experts_per_token must be in 1..n_experts")
        if self.n_experts and self.moe_ffn_size is None:
            raise ValueError("moe_ffn_size is required when n_experts > 0")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError("MLA needs both kv_lora_rank and qk_rope_head_dim")
        if self.sliding_layers is not None and any(
            not 0 <= i < self.n_layers for i in self.sliding_layers
        ):
            raise ValueError("sliding_layers holds a layer index out of range")
        return self

    @classmethod
    def from_fields(cls, fields: ArchFields) -> ArchSpec:
        """Validate numbers read from a model file; raises ValueError with a one-line message
        (pydantic's own is several lines with a URL, not for a CLI error)."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ValueError(validation_summary(exc)) from None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        if self.sliding_layers is not None:
            return layer in self.sliding_layers
        if self.sliding_pattern is None:
            return True
        return (layer + 1) % self.sliding_pattern != 0

    def n_sliding_layers(self) -> int:
        return sum(self.is_sliding(i) for i in range(self.n_layers))


def validation_summary(exc: ValidationError) -> str:
    """The first error of a pydantic ValidationError in one line: which field, what is wrong."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    what = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {what}" if where else what


def count_params(spec: ArchSpec) -> int:
    """Exact parameter count of the text model as its checkpoint stores it (tied embeddings
    counted once, multi-token-prediction modules included).

    Follows the Hugging Face module layout of llama, mistral, qwen2/3, qwen2_moe, qwen3_moe,
    mixtral, phi3, gemma3 and deepseek_v2/v3 (MLA); checked against published counts in
    tests/test_catalog.py and published safetensors totals in tests/test_budget_config.py. Files
    with weights never need it: their headers give the exact count.
    """
    h = spec.hidden_size
    embed = spec.vocab_size * h
    head = 0 if spec.tied_embeddings else spec.vocab_size * h
    final_norm = h
    layers = sum(_layer_params(spec, i) for i in range(spec.n_layers))
    return embed + head + final_norm + layers + spec.n_mtp_layers * _mtp_params(spec)


def _mtp_params(spec: ArchSpec) -> int:
    """One multi-token-prediction module as DeepSeek-V3's checkpoint stores it (model.layers.61):
    a decoder layer like the last one, its own copies of the embedding and head, eh_proj
    (2h -> h) and enorm, hnorm and the head's norm."""
    h = spec.hidden_size
    return _layer_params(spec, spec.n_layers) + 2 * spec.vocab_size * h + 2 * h * h + 3 * h


def _layer_params(spec: ArchSpec, layer: int) -> int:
    h = spec.hidden_size
    norms = 4 * h if spec.arch == "gemma3" else 2 * h  # gemma3: pre/post norms around both blocks
    return norms + _attention_params(spec) + _mlp_params(spec, layer)


def _attention_params(spec: ArchSpec) -> int:
    h = spec.hidden_size
    if spec.is_mla:
        assert spec.qk_rope_head_dim is not None and spec.kv_lora_rank is not None
        nope = spec.qk_nope_head_dim or spec.head_dim
        v_dim = spec.v_head_dim or spec.head_dim
        q_head = nope + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            q = h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * spec.n_heads * q_head
        else:
            q = h * spec.n_heads * q_head
        kv_a = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank  # + its norm
        kv_b = spec.kv_lora_rank * spec.n_heads * (nope + v_dim)
        o = spec.n_heads * v_dim * h
        return q + kv_a + kv_b + o
    q_size = spec.n_heads * spec.head_dim
    kv_size = spec.n_kv_heads * spec.head_dim
    params = h * q_size + 2 * h * kv_size + q_size * h
    if spec.attention_bias:
        params += q_size + 2 * kv_size
    if spec.qk_norm:
        params += 2 * spec.head_dim
    return params


def _mlp_params(spec: ArchSpec, layer: int) -> int:
    h = spec.hidden_size
    if not spec.is_moe or layer < spec.first_dense_layers:
        return 3 * h * spec.ffn_size  # gate, up, down
    assert spec.moe_ffn_size is not None
    router = h * spec.n_experts + (spec.n_experts if spec.router_bias else 0)
    experts = spec.n_experts * 3 * h * spec.moe_ffn_size
    return router + experts + 3 * h * _shared_width(spec) + (h if spec.shared_expert_gate else 0)


def _shared_width(spec: ArchSpec) -> int:
    """Total MLP width of the experts every token runs through."""
    if spec.shared_expert_ffn_size is not None:
        return spec.shared_expert_ffn_size
    assert spec.moe_ffn_size is not None
    return spec.moe_ffn_size * spec.n_shared_experts


def active_ffn_width(spec: ArchSpec) -> int:
    """Width of the MLP activations one token produces (for compute-buffer sizing)."""
    if spec.is_moe:
        assert spec.moe_ffn_size is not None
        routed = spec.n_experts_per_token * spec.moe_ffn_size + _shared_width(spec)
        return max(spec.ffn_size if spec.first_dense_layers else 0, routed)
    return spec.ffn_size
