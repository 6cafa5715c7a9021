"""The budget: weights + KV cache + overhead against the memory of a device.

`compute_budget(BudgetRequest) -> BudgetReport` is the one entry point; the CLI, the engine (before
it loads anything) and the TUI all call it. The arithmetic is DESIGN.md's "Budget arithmetic".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from localinfer.budget.arch import ArchSpec, active_ffn_width
from localinfer.budget.memory import DeviceMemory, device_memory, human_bytes
from localinfer.budget.model_facts import ModelFacts, model_facts
from localinfer.budget.quant import KVDtype, kv_dtype, normalize_quant
from localinfer.budget.runtime import (
    BACKEND_PROFILES,
    BACKENDS,
    DTYPES,
    TORCH_DEFAULT_DTYPE,
    BackendProfile,
)
from localinfer.errors import InvalidParameterError, OutOfMemoryBudgetError
from localinfer.resolve import resolve_model

# What `localinfer chat/serve` allocate per slot when no --ctx is given (localinfer/session.py
# DEFAULT_CTX): the budget's default answers "will the default run fit". Keep the two in step.
DEFAULT_CTX = 2048
MAX_SEQUENCES = 4096  # upper end of the max-concurrency search
ACTIVATION_BYTES = 4  # activations and logits are float32 on every backend


@dataclass(frozen=True, slots=True)
class BudgetRequest:
    model: str  # catalog name, GGUF file, HF folder or cached HF repo id
    ctx: int | None = None  # tokens per sequence; None: min(DEFAULT_CTX, model max)
    concurrency: int = 1  # sequences held at once (runner slots)
    quant: str | None = None  # None: the file's own / catalog default; "none": 16-bit weights
    kv_dtype: str | None = None  # None: the backend's (f16; torch: its compute dtype)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | metal | a size like 24GiB
    backend: str | None = None  # None: chosen from the device
    prefill_chunk: int | None = None  # tokens per forward pass; None: the backend's
    online: bool = False  # allow asking the Hub for safetensors sizes of remote models
    dtype: str | None = None  # float32 | bfloat16 | float16: what torch dequantizes GGUF to

    def __post_init__(self) -> None:
        if self.ctx is not None and self.ctx < 1:
            raise InvalidParameterError(
                f"--ctx must be a positive number of tokens, got {self.ctx}"
            )
        if self.concurrency < 1:
            raise InvalidParameterError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise InvalidParameterError(f"prefill chunk must be positive, got {self.prefill_chunk}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InvalidParameterError(
                f"unknown dtype '{self.dtype}' (known: {', '.join(DTYPES)})"
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise InvalidParameterError(
                f"unknown backend '{self.backend}' (known: {', '.join(BACKENDS)})"
            )


class Suggestion(BaseModel):
    """A nearby setting that fits."""

    change: str  # what to change, as CLI flags
    quant: str
    ctx: int
    concurrency: int
    kv_dtype: str
    total_bytes: int


class VllmPlan(BaseModel):
    """When nothing fits here: the smallest set of 80 GiB GPUs that serves it with vLLM."""

    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    per_gpu_bytes: int
    command: str


class BudgetReport(BaseModel):
    model: str
    model_path: str | None
    model_kind: str
    arch: str
    params: int
    quant: str
    kv_dtype: str
    ctx: int
    concurrency: int
    prefill_chunk: int
    device: str
    backend: str
    weights_bytes: int
    weights_source: str
    kv_cache_bytes: int
    compute_bytes: int
    runtime_bytes: int
    overhead_bytes: int
    total_bytes: int
    available_bytes: int
    device_total_bytes: int
    fits: bool
    max_context: int  # largest context that fits at the asked concurrency (0: none)
    max_concurrency: int  # most sequences that fit at the asked context (0: none)
    model_max_ctx: int
    suggestions: list[Suggestion] = []
    vllm: VllmPlan | None = None

    @property
    def free_bytes(self) -> int:
        return self.available_bytes - self.total_bytes


def kv_cache_bytes(arch: ArchSpec, ctx: int, sequences: int, dtype: KVDtype) -> int:
    """Σ over layers of K and V rows x cells, times sequences.

    cells = ctx on full-attention layers and min(ctx, window) on sliding-window layers. MLA keeps
    one latent row (kv_lora_rank + qk_rope_head_dim) per token per layer: no K/V pair, no x2.
    """
    per_sequence = 0
    for layer in range(arch.n_layers):
        cells = ctx
        if arch.is_sliding(layer):
            assert arch.sliding_window is not None
            cells = min(ctx, arch.sliding_window)
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
) -> int:
    """Float32 working memory of one prefill step of `chunk` tokens.

    Layers run one after another and reuse their buffers, so one layer's activations count:
    residual + normed input (2 x hidden), q, k, v, and the MLP's gate and up outputs. Logits are
    chunk x vocab (DESIGN.md) where the backend holds a buffer that size on this device kind
    (`profile.chunk_logits_on`: llama.cpp's reserved graph on a GPU or an unknown machine);
    elsewhere only the rows the engine asks for are ever resident, one per sequence. A backend
    without fused attention also holds the chunk's scores against the whole context
    (chunk x heads x ctx). Checked against llama.cpp's own report for the embedded model
    (n_ubatch 512): 98.25 MiB reserved at every n_ctx, 106 MiB estimated here with chunk logits.
    """
    tokens = min(chunk, ctx * sequences)
    q = arch.n_heads * arch.head_dim
    kv = arch.n_kv_heads * arch.head_dim
    width = 2 * arch.hidden_size + q + 2 * kv + 2 * active_ffn_width(arch)
    activations = tokens * width * ACTIVATION_BYTES
    rows = tokens if device_kind in profile.chunk_logits_on else min(tokens, sequences)
    logits = rows * arch.vocab_size * ACTIVATION_BYTES
    scores = 0 if profile.fused_attention else tokens * arch.n_heads * ctx * ACTIVATION_BYTES
    # Scores live inside a layer, logits after the last one: graph allocators (llama.cpp's)
    # reuse one buffer for both, so the larger of the two counts.
    return activations + max(logits, scores)


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


@dataclass(frozen=True, slots=True)
class Planner:
    """Everything fixed for one request; evaluates totals for varied settings."""

    facts: ModelFacts
    profile: BackendProfile
    chunk: int
    device_kind: str = "cpu"
    dtype: str | None = None  # the runner's compute dtype, where it matters (torch)

    def compute_dtype(self) -> str:
        return self.dtype or TORCH_DEFAULT_DTYPE.get(self.device_kind, "bfloat16")

    def default_kv_dtype(self) -> str:
        """llama.cpp and MLX cache in f16; the torch runner caches in its compute dtype."""
        return DTYPES[self.compute_dtype()] if self.profile.name == "torch" else "f16"

    def stored_quant(self, quant: str) -> str:
        """The form the backend keeps weights in: torch dequantizes GGUF block types."""
        if self.profile.name == "torch" and is_gguf_block_type(quant):
            return DTYPES[self.compute_dtype()]
        return quant

    def kept_blocks(self, quant: str) -> int | None:
        """Bytes the torch runner holds when its native CPU kernels keep the file's Q8_0/Q4_0/
        Q4_1 matrices as stored blocks (this CPU, float32, kernels buildable, the file's own
        quant): None where it dequantizes everything instead."""
        header = self.facts.header
        if (
            self.profile.name != "torch"
            or self.device_kind != "cpu"
            or self.compute_dtype() != "float32"
            or header is None
            or header.kept_block_bytes is None
            or quant != header.quant
        ):
            return None
        from localinfer.backends.torch.native_plan import keeps_blocks  # torch-free

        return header.kept_block_bytes if keeps_blocks() else None

    def breakdown(self, quant: str, ctx: int, sequences: int, kv: KVDtype) -> Breakdown:
        kept = self.kept_blocks(quant)
        if kept is not None:
            source = (
                f"torch keeps the {quant} blocks for its native kernels, other tensors float32"
                " (GGUF header)"
            )
            return self._breakdown(ctx, sequences, kv, kept, source, kept_blocks=True)
        stored = self.stored_quant(quant)
        weights, source = self.facts.weights(stored)
        arch = self.facts.arch
        if stored != quant:
            source = f"torch dequantizes {quant} to {stored}: {source}"
        if (
            self.device_kind == "cpu"
            and self.profile.tied_head_copy_on_cpu
            and arch.tied_embeddings
            and _packs_matrices(stored)
        ):
            weights += arch.vocab_size * arch.hidden_size * (4 if stored == "f32" else 2)
            source += " + a packed copy of the tied LM head"
        return self._breakdown(ctx, sequences, kv, weights, source)

    def _breakdown(
        self,
        ctx: int,
        sequences: int,
        kv: KVDtype,
        weights: int,
        source: str,
        kept_blocks: bool = False,
    ) -> Breakdown:
        arch = self.facts.arch
        return Breakdown(
            weights=weights,
            weights_source=source,
            kv=kv_cache_bytes(arch, ctx, sequences, kv),
            compute=compute_buffer_bytes(
                arch, ctx, sequences, self.chunk, self.profile, self.device_kind
            ),
            runtime=self.profile.runtime_for(self.device_kind, kept_blocks),
        )

    def fits(self, budget: int, quant: str, ctx: int, sequences: int, kv: KVDtype) -> bool:
        return self.breakdown(quant, ctx, sequences, kv).total <= budget

    def max_context(self, budget: int, quant: str, sequences: int, kv: KVDtype) -> int:
        """Largest ctx in 1..model max that fits (0 when even one token doesn't)."""
        return _largest(
            lambda c: self.fits(budget, quant, c, sequences, kv), self.facts.arch.max_ctx
        )

    def max_sequences(self, budget: int, quant: str, ctx: int, kv: KVDtype) -> int:
        return _largest(lambda s: self.fits(budget, quant, ctx, s, kv), MAX_SEQUENCES)


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


def choose_backend(memory: DeviceMemory, asked: str | None, facts: ModelFacts | None = None) -> str:
    """backends/select.py's choice, from the device kind: Apple Silicon -> mlx; NVIDIA -> torch;
    this CPU -> torch's native kernels for a GGUF they read as stored where they are the faster
    engine (facts given, the file's own quantization), else llamacpp if installed. A planned
    (named) machine is costed for llama.cpp on CPU."""
    if asked:
        return asked
    if memory.kind == "cuda":
        return "torch"
    if memory.kind == "metal":
        return "mlx"
    if (
        memory.kind != "planned"
        and facts is not None
        and facts.resolved.kind == "gguf"
        and importlib.util.find_spec("torch") is not None
    ):
        from localinfer.backends.torch.support import native_blocks_preferred  # torch-free

        if native_blocks_preferred(facts.native_quant, facts.arch.arch):
            return "torch"
    if memory.kind == "planned" or importlib.util.find_spec("llama_cpp") is not None:
        return "llamacpp"
    return "torch"


# llama.cpp runs GGUF types: its int8/int4 are the files `localinfer quantize` writes.
_LLAMACPP_FRIENDLY = {"int8": "Q8_0", "int4": "Q4_K_M"}


def resolve_quant(facts: ModelFacts, asked: str | None, backend: str | None = None) -> str:
    if asked is None:
        return facts.native_quant
    if asked.strip().lower() == "none":  # unquantized: the safetensors dtype, else 16-bit
        header = facts.header
        if header is not None and facts.resolved.kind == "hf_dir":
            return header.quant
        return "bf16"
    quant = normalize_quant(asked)
    if backend == "llamacpp" and facts.resolved.kind != "hf_dir":  # GGUF models only
        return _LLAMACPP_FRIENDLY.get(quant, quant)
    return quant


def compute_budget(request: BudgetRequest, memory: DeviceMemory | None = None) -> BudgetReport:
    """Memory needed by `request.model` at the asked settings, and what fits when it doesn't.

    `memory` skips reading the device again when many models are checked against one machine.
    """
    from localinfer.budget.plan import suggestions_for, vllm_plan_for

    resolved = resolve_model(request.model, request.quant, assemble=False)
    facts = model_facts(resolved, online=request.online)
    arch = facts.arch
    ctx = request.ctx if request.ctx is not None else min(DEFAULT_CTX, arch.max_ctx)
    if ctx > arch.max_ctx:
        raise InvalidParameterError(
            f"--ctx {ctx} is beyond {facts.name}'s maximum context of {arch.max_ctx} tokens"
        )
    memory = memory or device_memory(request.device)
    backend = choose_backend(memory, request.backend, facts if request.quant is None else None)
    quant = resolve_quant(facts, request.quant, backend)
    profile = BACKEND_PROFILES[backend]
    chunk = request.prefill_chunk or profile.prefill_chunk
    planner = Planner(facts, profile, chunk, memory.kind, request.dtype)
    kv = kv_dtype(request.kv_dtype or planner.default_kv_dtype())
    parts = planner.breakdown(quant, ctx, request.concurrency, kv)
    budget = memory.available
    fits = parts.total <= budget
    report = BudgetReport(
        model=facts.name,
        model_path=str(resolved.path) if resolved.path else None,
        model_kind=resolved.kind,
        arch=arch.arch,
        params=facts.params,
        quant=quant,
        kv_dtype=kv.name,
        ctx=ctx,
        concurrency=request.concurrency,
        prefill_chunk=chunk,
        device=memory.device,
        backend=backend,
        weights_bytes=parts.weights,
        weights_source=parts.weights_source,
        kv_cache_bytes=parts.kv,
        compute_bytes=parts.compute,
        runtime_bytes=parts.runtime,
        overhead_bytes=parts.overhead,
        total_bytes=parts.total,
        available_bytes=budget,
        device_total_bytes=memory.total,
        fits=fits,
        max_context=planner.max_context(budget, quant, request.concurrency, kv),
        max_concurrency=planner.max_sequences(budget, quant, ctx, kv),
        model_max_ctx=arch.max_ctx,
    )
    if not fits:
        report.suggestions = suggestions_for(planner, budget, quant, ctx, request.concurrency, kv)
        if not report.suggestions:
            report.vllm = vllm_plan_for(facts, ctx, request.concurrency, kv)
    return report


def ensure_fits(report: BudgetReport) -> BudgetReport:
    """The report if it fits; else OutOfMemoryBudgetError saying what would fit (for the engine,
    which refuses to load what won't fit)."""
    if report.fits:
        return report
    hints = [f"try {s.change}" for s in report.suggestions[:3]]
    if not hints and report.vllm is not None:
        hints.append(f"needs {report.vllm.gpus} x 80 GiB GPUs: {report.vllm.command}")
    raise OutOfMemoryBudgetError(
        f"{report.model} at {report.ctx} ctx x {report.concurrency} seq needs "
        f"{human_bytes(report.total_bytes)} but {report.device} has "
        f"{human_bytes(report.available_bytes)}" + (f"; {'; '.join(hints)}" if hints else "")
    )


def _packs_matrices(stored: str) -> bool:
    """torch on CPU packs bf16 matrices for oneDNN where this CPU's oneDNN can, and f32 ones only
    where its native kernels (which read dense matrices, the tied table itself) will not run:
    switched off, no C compiler, or measured slower than torch ops here."""
    if stored == "bf16":
        from localinfer.backends.torch.support import onednn_bf16_expected  # torch-free

        return onednn_bf16_expected()
    if stored != "f32":
        return False
    from localinfer.backends.torch.native_plan import native_f32_tokens  # torch-free

    return native_f32_tokens() == 0
