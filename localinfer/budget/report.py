"""What a budget is asked and what it answers: the data crossing the budget's seam (CLI, session,
TUI, server all read BudgetReport)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, computed_field

from localinfer.backend_profile import BACKENDS
from localinfer.errors import InvalidParameterError
from localinfer.facts.kv_dtype import DTYPES

# What `localinfer chat/serve` allocate per slot when no --ctx is given; the budget's default
# answers "will the default run fit". The session imports it from here.
DEFAULT_CTX = 2048


@dataclass(frozen=True, slots=True)
class BudgetRequest:
    model: str  # catalog name, GGUF file, HF folder, config.json, HF repo id (ORG/REPO[:QUANT])
    ctx: int | None = None  # tokens per sequence; None: min(DEFAULT_CTX, model max)
    concurrency: int = 1  # sequences held at once (runner slots)
    quant: str | None = None  # None: the file's own / catalog default; "none": 16-bit weights
    kv_dtype: str | None = None  # None: the backend's (f16; torch: its compute dtype)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | metal | a size like 24GiB
    backend: str | None = None  # None: chosen from the device
    prefill_chunk: int | None = None  # tokens per forward pass; None: the backend's
    online: bool = False  # catalog models not on disk: the Hub's metadata, not catalog numbers
    mmproj: str | None = None  # count a vision projector: "" the model's own, or a file name
    dtype: str | None = None  # float32 | bfloat16 | float16: torch's compute dtype
    kv_ram: str | None = None  # --kv-ram: None no RAM tier row; "auto" the default share; SIZE

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


class VisionReport(BaseModel):
    """The projector counted with --mmproj: its weights (in the weights row) and its encoder's
    buffers (in the compute row), budget/vision.py."""

    projector_bytes: int  # its tensors, counted with the weights
    compute_bytes: int  # graph + work + context + image: counted with the compute buffers
    graph_bytes: int  # the encoder's compute buffer for one image of image_size
    work_bytes: int  # the CPU's converted matrix inputs while it encodes
    context_bytes: int  # mtmd's graph metadata and scheduler
    image_bytes: int  # one prompt image's pixels and embeddings
    projector_type: str
    image_size: int
    patches: int
    image_tokens: int | None  # context tokens one image (or tile) takes; None: not modelled
    tokens_text: str  # the same, in words
    modelled: bool  # False: an estimate by the ViT arithmetic for an unmodelled projector type


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
    # Each matrix type of the file -> the form the runner holds it in ("Q4_K": "int4-g32" on
    # torch, "mlx-4bit-g32" on MLX, "Q4_K" as stored on llama.cpp); {} for a quantization made
    # on load, or where the header is not read.
    weight_forms: dict[str, str] = {}
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
    mmproj: str | None = None  # the vision projector counted with the weights
    mmproj_files: list[str] = []  # vision projectors beside the model (counted with --mmproj)
    vision: VisionReport | None = None  # the --mmproj projector's share of weights and compute
    download_bytes: int | None = None  # size of the model's files on the Hub (not on disk yet)
    kv_ram_bytes: int = 0  # the KV RAM tier's cap (issue #24); 0: no tier asked about
    reranker: bool = False  # rank pooling: its scoring context is in the KV and compute rows
    encoder: bool = False  # non-causal (a BERT reranker): no KV cache at all
    kv_ram_counted: bool = False  # the tier is in total_bytes (CPU / unified memory), not beside
    # llama.cpp on a GPU (budget/offload.py): the layers the GPU holds of ``layers``, and what
    # stays in the host's RAM (embedding table, layers left on the CPU); None off the GPU.
    gpu_layers: int | None = None
    layers: int | None = None
    host_bytes: int | None = None

    @property
    def offload_text(self) -> str | None:
        """The offload in words: every layer on the GPU, or 22 of 36 and the rest on the CPU."""
        if self.gpu_layers is None or self.layers is None:
            return None
        if self.gpu_layers == self.layers:
            return f"every layer on the GPU ({self.layers})"
        return f"{self.gpu_layers} of {self.layers} layers on the GPU, the rest on the CPU"

    @property
    def free_bytes(self) -> int:
        return self.available_bytes - self.total_bytes


class MemoryCheck(BaseModel):
    """Predicted vs measured bytes, part by part."""

    backend: str
    device: str
    predicted_weights: int
    measured_weights: int
    predicted_kv_cache: int
    measured_kv_cache: int
    predicted_compute: int  # compute buffers
    measured_overhead: int  # what the runner reports beyond weights and KV (no library code)
    predicted_total: int  # weights + KV + compute + the backend's runtime constant
    rss_growth: int | None  # CPU: process RSS after load + prefill minus before (all-inclusive)
    # The backend's library was imported before the first RSS reading (a process that ran it
    # already): rss_growth then lacks the runtime constant, so only a fresh process compares.
    library_preloaded: bool = False
    # --mmproj: the projector's weights + encoder buffers, predicted, and the process's growth
    # while the runner loaded it plus while one image was prompted and encoded (CPU only).
    predicted_projector: int | None = None
    measured_projector: int | None = None

    @computed_field  # in --json output
    @property
    def total_error(self) -> float | None:
        """(predicted - measured) / measured of the total against RSS growth; None off-CPU or
        when the library was already loaded (the growth would lack the runtime constant)."""
        if self.rss_growth is None or self.rss_growth <= 0 or self.library_preloaded:
            return None
        return (self.predicted_total - self.rss_growth) / self.rss_growth
