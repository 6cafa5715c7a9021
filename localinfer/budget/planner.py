"""The budget's arithmetic for one model on one backend and device kind: weights, KV cache,
compute buffers and the backend's runtime constant (docs/design.md, "Budget arithmetic")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localinfer.backend_profile import BackendProfile
from localinfer.budget.memory import human_bytes
from localinfer.budget.model_facts import ModelFacts
from localinfer.budget.vision import VisionCost, vision_cost
from localinfer.facts.arch import ArchSpec, active_ffn_width
from localinfer.facts.kv_dtype import DTYPES, KVDtype
from localinfer.facts.quant import mlx_quant_bytes, torch_quant_bytes

MAX_SEQUENCES = 4096  # upper end of the max-concurrency search
ACTIVATION_BYTES = 4  # activations and logits are float32 on every backend
RANK_CHUNK = 512  # a reranker's tokens per decode call (backends/llamacpp/rerank.py, RANK_UBATCH)
FLOAT_TYPES = ("F32", "F16", "BF16")  # a safetensors model's dtypes, as GGUF names them
# Compute dtypes a runner may hold dequantized weights in -> the budget's quant name.


def kv_cache_bytes(
    arch: ArchSpec,
    ctx: int,
    sequences: int,
    dtype: KVDtype,
    profile: BackendProfile | None = None,
) -> int:
    """Σ over layers of K and V rows x cells, times sequences.

    cells = ctx on full-attention layers and min(ctx, window) on sliding-window layers, or the
    backend's own rule (``profile.kv_cells``: llama.cpp pads each sequence's cells to 256 and
    keeps every cell on its sliding layers too). MLA keeps one latent row (kv_lora_rank +
    qk_rope_head_dim) per token per layer: no K/V pair, no x2. An encoder keeps none (llama.cpp
    makes no memory for a BERT).
    """
    if arch.encoder:
        return 0
    per_sequence = 0
    for layer in range(arch.n_layers):
        window = arch.sliding_window if arch.is_sliding(layer) else None
        if profile is not None:
            cells = profile.kv_cells(ctx, sequences, window)
        else:
            cells = ctx if window is None else min(ctx, window)
        if arch.is_mla:
            assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
            per_sequence += dtype.row_bytes(arch.kv_lora_rank + arch.qk_rope_head_dim) * cells
        else:
            per_sequence += 2 * dtype.row_bytes(arch.n_kv_heads * arch.head_dim) * cells
    return per_sequence * sequences


def compute_buffer_bytes(
    arch: ArchSpec,
    ctx: int,
    sequences: int,
    chunk: int,
    profile: BackendProfile,
    device_kind: str = "planned",
    cache: KVDtype | None = None,
) -> int:
    """Float32 working memory of one prefill step of `chunk` tokens: the backend's own model
    where it has one (``profile.compute_bytes``: llama.cpp's graph), else this estimate.

    Layers run one after another and reuse their buffers, so one layer's activations count:
    residual + normed input (2 x hidden), q, k, v, and the MLP's gate and up outputs. Logits are
    chunk x vocab (docs/design.md) where the backend holds a buffer that size on this device kind
    (`profile.memory.chunk_logits_on`); elsewhere only the rows the engine asks for are ever
    resident, one per sequence. A backend without fused attention also holds the chunk's scores
    against the whole context (chunk x heads x ctx); a block-quantized ``cache`` (Q8_0/Q4_0) is
    only read by fused attention.
    """
    own = profile.compute_bytes(arch, ctx, sequences, chunk, device_kind, cache)
    if own is not None:
        return own
    tokens = min(chunk, ctx * sequences)
    q = arch.n_heads * arch.head_dim
    kv = arch.n_kv_heads * arch.head_dim
    width = 2 * arch.hidden_size + q + 2 * kv + 2 * active_ffn_width(arch)
    if profile.memory.activation_width is not None:  # a lazy graph's own peak (MLX)
        per_hidden, per_ffn = profile.memory.activation_width
        width = per_hidden * arch.hidden_size + per_ffn * active_ffn_width(arch)
    activations = tokens * width * ACTIVATION_BYTES
    rows = tokens if device_kind in profile.memory.chunk_logits_on else min(tokens, sequences)
    logits = rows * arch.vocab_size * ACTIVATION_BYTES
    quantized_cache = cache is not None and cache.block > 1
    fused = quantized_cache or profile.fused_attention(device_kind, arch, ctx, chunk)
    elements = 0 if fused else tokens * arch.n_heads * ctx
    # Scores live inside a layer, logits after the last one: a graph allocator reuses one
    # buffer for both, so the larger of the two counts; a backend may convert the
    # probabilities once more (`score_copy_bytes` per element) before multiplying by V.
    copy = elements * profile.memory.score_copy_bytes
    return activations + max(logits, elements * ACTIVATION_BYTES) + copy


@dataclass(frozen=True, slots=True)
class Breakdown:
    weights: int
    weights_source: str
    kv: int
    compute: int
    runtime: int

    @property
    def overhead(self) -> int:
        return self.compute + self.runtime

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.overhead

    def report_fields(self) -> dict[str, int | str]:
        """These figures under BudgetReport's field names."""
        return {
            "weights_bytes": self.weights,
            "weights_source": self.weights_source,
            "kv_cache_bytes": self.kv,
            "compute_bytes": self.compute,
            "runtime_bytes": self.runtime,
            "overhead_bytes": self.overhead,
            "total_bytes": self.total,
        }


@dataclass(frozen=True, slots=True)
class Planner:
    """Everything fixed for one request; evaluates totals for varied settings."""

    facts: ModelFacts
    profile: BackendProfile
    chunk: int
    device_kind: str = "cpu"
    dtype: str | None = None  # the runner's compute dtype, where it matters (torch)

    def compute_dtype(self) -> str:
        return self.dtype or self.profile.default_dtype(self.device_kind)

    def default_kv_dtype(self) -> str:
        """llama.cpp caches in f16; torch and MLX in their compute dtype (float32 on a CPU)."""
        profile = self.profile
        in_compute = profile.holds_compute_dtype or profile.kv_in_compute_dtype
        return DTYPES[self.compute_dtype()] if in_compute else "f16"

    def stored_quant(self, quant: str) -> str:
        """The form the backend keeps weights in: torch dequantizes GGUF block types."""
        if self.profile.holds_compute_dtype and is_gguf_block_type(quant):
            return DTYPES[self.compute_dtype()]
        return quant

    def kept_blocks(self, quant: str) -> int | None:
        """Bytes the torch runner holds when its native CPU kernels keep the file's Q8_0/Q4_0/
        Q4_1 matrices as stored blocks (this CPU, float32, kernels buildable, the file's own
        quant): None where it dequantizes everything instead."""
        header = self.facts.header
        if (
            not self.profile.holds_compute_dtype
            or self.device_kind != "cpu"
            or self.compute_dtype() != "float32"
            or header is None
            or header.kept_block_bytes is None
            or quant != header.quant
        ):
            return None
        return header.kept_block_bytes if self.profile.keeps_blocks() else None

    def recipe_bytes(self, quant: str) -> int | None:
        """The torch or MLX runner's bytes for a quantization it makes on load (int8, int4 ...),
        exactly (every matrix in its recipe's layout); None on llama.cpp, for the file's own
        quantization and for other names."""
        if self.facts.header is not None and quant == self.facts.header.quant:
            return None
        float_bytes = 4 if self.compute_dtype() == "float32" else 2
        if self.profile.holds_compute_dtype:
            return torch_quant_bytes(self.facts.arch, quant, float_bytes)
        if self.profile.name == "mlx":
            return mlx_quant_bytes(self.facts.arch, quant, float_bytes)
        return None

    def weight_forms(self, quant: str) -> dict[str, str]:
        """Each matrix type of the file -> the form the runner holds it in at this plan's device
        and dtype (BackendProfile.weight_forms: the profile's rule, as its runner loads); {} for
        a quantization made on load (the recipe's row says it) or a file without its header."""
        header = self.facts.header
        if header is None or quant != header.quant:
            return {}
        stored: dict[str, int] = {}
        for t in header.tensors:  # GGUF
            if len(t.shape) == 2:
                stored[t.type_name] = stored.get(t.type_name, 0) + t.nbytes
        if not header.tensors and quant.upper() in FLOAT_TYPES:  # safetensors: one float dtype
            stored[quant.upper()] = header.weight_bytes
        return self.profile.weight_forms(stored, self.device_kind, self.compute_dtype())

    def breakdown(self, quant: str, ctx: int, sequences: int, kv: KVDtype) -> Breakdown:
        header = self.facts.header
        if header is not None and header.tensors and quant == header.quant:
            # The runner's own form of the file's tensors (K-quants kept quantized), when its
            # profile has a rule for this file; else the rules below.
            held = self.profile.held_gguf_weights(
                header.tensors, self.facts.arch, self.compute_dtype(), self.device_kind
            )
            if held is not None:
                promoted = self.profile.promoted_weight_bytes(
                    self.facts.arch, quant, self.compute_dtype()
                )
                return self._breakdown(
                    ctx, sequences, kv, held.bytes, held.source, promoted=promoted
                )
        kept = self.kept_blocks(quant)
        if kept is not None:
            source = (
                f"torch keeps the {quant} blocks for its native kernels, other tensors float32"
                " (GGUF header)"
            )
            return self._breakdown(ctx, sequences, kv, kept, source, kept_blocks=True)
        stored = self.stored_quant(quant)
        promoted = self.profile.promoted_weight_bytes(self.facts.arch, stored, self.compute_dtype())
        weights, source = self.facts.weights(stored)
        arch = self.facts.arch
        exact = self.recipe_bytes(stored)
        if exact is not None:
            weights = exact
            source = f"{self.profile.name} {stored} recipe, matrix by matrix (facts/quant.py)"
        if stored != quant:
            source = f"torch dequantizes {quant} to {stored}: {source}"
        if (
            self.device_kind == "cpu"
            and self.profile.memory.tied_head_copy_on_cpu
            and arch.tied_embeddings
            and self.profile.packs_matrices(stored)
        ):
            weights += arch.vocab_size * arch.hidden_size * (4 if stored == "f32" else 2)
            source += " + a packed copy of the tied LM head"
        return self._breakdown(ctx, sequences, kv, weights, source, promoted=promoted)

    def _breakdown(
        self,
        ctx: int,
        sequences: int,
        kv: KVDtype,
        weights: int,
        source: str,
        kept_blocks: bool = False,
        promoted: int = 0,
    ) -> Breakdown:
        arch = self.facts.arch
        projector = self.facts.projector
        if projector is not None:  # loaded beside the model, as stored (llama.cpp's mtmd)
            weights += projector.weight_bytes
            source += f" + {projector.name} ({human_bytes(projector.weight_bytes)})"
        rank_kv, rank_compute = self._rank_context(ctx, kv)
        return Breakdown(
            weights=weights,
            weights_source=source,
            kv=kv_cache_bytes(arch, ctx, sequences, kv, self.profile) + rank_kv,
            compute=promoted
            + rank_compute
            + self.vision_bytes()  # the projector's encoder: its buffers, one image's pixels
            + compute_buffer_bytes(
                arch, ctx, sequences, self.chunk, self.profile, self.device_kind, kv
            ),
            runtime=self.profile.runtime(self.device_kind, arch.vocab_size, kept_blocks),
        )

    def vision_cost(self) -> VisionCost | None:
        """The projector's encoder beside its weights (budget/vision.py); None without one."""
        projector = self.facts.projector
        if projector is None or projector.vision is None:
            return None
        return vision_cost(projector.vision, self.device_kind)

    def vision_bytes(self) -> int:
        cost = self.vision_cost()
        return 0 if cost is None else cost.total

    def _rank_context(self, ctx: int, kv: KVDtype) -> tuple[int, int]:
        """A reranker's scoring context (backends/llamacpp/rerank.py), as (KV, compute) bytes:
        ``ctx`` cells of KV, the graph of one chunk, and an output buffer of logits and a state
        for each of the chunk's rows (llama.cpp outputs every row of a pooled decode)."""
        arch = self.facts.arch
        if not arch.reranker:
            return 0, 0
        chunk = min(RANK_CHUNK, ctx)
        graph = compute_buffer_bytes(arch, ctx, 1, chunk, self.profile, self.device_kind, kv)
        output = chunk * (arch.vocab_size + arch.hidden_size) * ACTIVATION_BYTES
        return kv_cache_bytes(arch, ctx, 1, kv, self.profile), graph + output

    def fits(self, budget: int, quant: str, ctx: int, sequences: int, kv: KVDtype) -> bool:
        return self.breakdown(quant, ctx, sequences, kv).total <= budget

    def max_context(self, budget: int, quant: str, sequences: int, kv: KVDtype) -> int:
        """Largest ctx in 1..model max that fits (0 when even one token doesn't)."""
        return _largest(
            lambda c: self.fits(budget, quant, c, sequences, kv), self.facts.arch.max_ctx
        )

    def max_sequences(self, budget: int, quant: str, ctx: int, kv: KVDtype) -> int:
        """Most sequences that fit, up to the backend's own limit (llama.cpp's 256)."""
        upper = min(MAX_SEQUENCES, self.profile.max_sequences or MAX_SEQUENCES)
        return _largest(lambda s: self.fits(budget, quant, ctx, s, kv), upper)


def _largest(ok: Callable[[int], bool], upper: int) -> int:
    """Largest n in 1..upper with ok(n), for ok monotone (True then False); 0 if ok(1) is False."""
    if not ok(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def is_gguf_block_type(quant: str) -> bool:
    return quant.startswith(("Q", "IQ"))
