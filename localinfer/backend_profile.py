"""What every backend tells the rest of localinfer about itself, without importing a framework.

Each backend owns one instance (``backends/<name>/profile.py``, a subclass where it differs): the
memory model the budget costs it with, the speculation costs the session configures it with, its
default dtype per device, and the file facts it can run. The type lives in the bottom layer
(docs/layers.md) so the budget takes a profile as handed in (localinfer/backend_budget.py) without
importing a backend; selection (backends/select.py) looks the instances up by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.facts.kv_dtype import DTYPES
from localinfer.facts.kv_dtype import kv_dtype as parse_kv

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from localinfer.facts.arch import ArchSpec, AttentionHeads
    from localinfer.facts.held_weights import HeldWeights, StoredTensor
    from localinfer.facts.kv_dtype import KVDtype

BACKENDS = ("torch", "llamacpp", "mlx")

# Whether a profile's answer that needs a one-time measurement on this machine (llama.cpp's
# attention kernels, once per head shape) may measure now. A listing budgets every catalog model
# at once: measured, the first `localinfer models` on a 2-core machine ran 16 of them, ~100 s.
_MEASURE_NOW: ContextVar[bool] = ContextVar("localinfer_measure_now", default=True)


def measuring_allowed() -> bool:
    """False inside ``stored_measurements_only``."""
    return _MEASURE_NOW.get()


@contextmanager
def stored_measurements_only() -> Iterator[None]:
    """Within: a question this machine has not measured yet gets the backend's own default (and
    nothing is stored), one measured before its stored answer. For listings of many models; a
    budget of one model, and every runner, measures as before."""
    token = _MEASURE_NOW.set(False)
    try:
        yield
    finally:
        _MEASURE_NOW.reset(token)


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Memory a backend holds that does not scale with the model.

    Runtime constants are measured (scripts/budget-accuracy), never guessed: the framework's own
    resident memory (library code, allocator arenas, CUDA context). ``how_measured`` says where
    each figure came from; one marked UNMEASURED is a placeholder to replace.
    """

    runtime_bytes: int  # host memory (CPU device)
    accelerator_runtime_bytes: int  # on the GPU / Metal device
    fused_attention: bool  # False: a prefill chunk's attention scores are materialized
    prefill_chunk: int  # tokens one forward pass may carry: sizes the compute buffers
    how_measured: str
    # Device kinds where a logits row for every token of the chunk is resident (a backend that
    # reserves them up front, as llama.cpp's graph does). Elsewhere one row per sequence counts.
    chunk_logits_on: tuple[str, ...] = ()
    # The vocab x hidden table held twice on CPU when the LM head is packed beside the tied
    # embedding the lookup reads.
    tied_head_copy_on_cpu: bool = False
    # Runtime constant when a GGUF's blocks are kept as stored (None: runtime_bytes).
    kept_blocks_runtime_bytes: int | None = None
    # Bytes per element of a second copy of unfused attention scores (llama.cpp's CPU backend
    # converts the probabilities to f16 before multiplying by an f16 V cache); 0: none.
    score_copy_bytes: int = 2
    # Float32 values per token one layer's activations hold at their peak, in units of the
    # hidden size and of the MLP's width; None: the budget's default set (planner.py).
    activation_width: tuple[int, int] | None = None

    def runtime_for(self, device_kind: str, kept_blocks: bool = False) -> int:
        if kept_blocks and self.kept_blocks_runtime_bytes is not None:
            return self.kept_blocks_runtime_bytes
        if device_kind in ("cuda", "metal"):
            return self.accelerator_runtime_bytes
        return self.runtime_bytes


@dataclass(frozen=True, slots=True)
class SpeculationCosts:
    """A target's verification cost in one-token decode steps (see engine SpecConfig):
    1 + fixed + per_token * k for a (k+1)-token forward, and the most slots decoding at once
    while speculation still pays."""

    per_token: float
    fixed: float
    max_busy_slots: int


# Any accelerator: a (k+1)-token forward costs about what a one-token one does.
GPU_SPECULATION = SpeculationCosts(per_token=0.02, fixed=0.0, max_busy_slots=2)


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """A backend's framework-free facts; the instances live in ``backends/<name>/profile.py``."""

    name: str  # torch | llamacpp | mlx
    module: str  # the framework module that must import for the backend to run
    install_hint: str  # the command that installs it
    formats: tuple[str, ...]  # model formats its runner reads: gguf, safetensors
    memory: MemoryModel
    cpu_speculation: SpeculationCosts
    gpu_dtype: str = "bfloat16"  # default dtype on CUDA / Metal; CPU computes in float32
    # Weights dequantized and the KV cache held in the compute dtype (torch), rather than the
    # file's types and an f16 cache (llama.cpp, MLX).
    holds_compute_dtype: bool = False
    # The KV cache alone held in the compute dtype (MLX: float32 on a CPU), weights as stored.
    kv_in_compute_dtype: bool = False
    # The most sequences (slots) one runner can hold at once; None: no limit but memory.
    max_sequences: int | None = None
    # The architectures its runner implements; None: whatever its library reads (llama.cpp).
    archs: tuple[str, ...] | None = None

    def default_dtype(self, device: str) -> str:
        """The compute dtype a runner uses when none is asked (llama.cpp keeps the file's)."""
        return self.gpu_dtype if device.startswith(("cuda", "metal")) else "float32"

    def runs_format(self, model_format: str | None) -> bool:
        return model_format is None or model_format in self.formats

    def quant_refusal(self, quant: str, file_quant: str | None) -> str | None:
        """Why this backend's runner refuses to hold the weights as ``quant`` (the name asked,
        not the file's own), in the runner's own words; None where it can."""
        return None

    def kv_dtype_refusal(self, kv_dtype: str | None, compute_dtype: str) -> str | None:
        """Why this backend's runner cannot keep its KV cache as ``kv_dtype`` (None: its own);
        None where it can. torch and MLX hold it in the compute dtype and nothing else."""
        if kv_dtype is None:
            return None
        asked = parse_kv(kv_dtype).name
        if asked == DTYPES.get(compute_dtype):
            return None
        dtype_hint = {kv: dtype for dtype, kv in DTYPES.items()}.get(asked)
        other = f"--dtype {dtype_hint}" if dtype_hint else "--backend llamacpp with a GGUF"
        return (
            f"the {self.name} backend keeps its KV cache in its compute dtype ({compute_dtype}), "
            f"not {asked}: leave --kv-dtype out, or use {other}"
        )

    def held_gguf_weights(
        self,
        tensors: Sequence[StoredTensor],
        arch: ArchSpec,
        compute_dtype: str,
        device_kind: str,
    ) -> HeldWeights | None:
        """The bytes this backend's runner holds for a GGUF with ``tensors`` (its header's,
        in the file's own quantization) at ``compute_dtype`` on ``device_kind``, in the runner's
        own form; None where the budget's general rule (stored_quant, recipe bytes) applies."""
        return None

    def weight_forms(
        self, stored: Mapping[str, int], device_kind: str, compute_dtype: str
    ) -> dict[str, str]:
        """The form this backend's runner holds a file's matrices in at ``compute_dtype`` on
        ``device_kind``, by the type they are stored as: ``stored`` maps each matrix type of the
        file ("Q4_K", "Q6_K", "BF16", ...) to the bytes stored so. A form is named as the
        project names quantizations: a GGUF type (its blocks as stored), "mlx-4bit-g32",
        "int4-g32", "int8", or a float dtype ("bf16", "f32"). Here, llama.cpp's rule: every
        tensor as stored (its kernels read each block type on every device)."""
        return {type_name: type_name for type_name in stored}

    def promoted_weight_bytes(self, arch: ArchSpec, quant: str, compute_dtype: str) -> int:
        """Bytes of a weight matrix's parts a forward pass converts to the compute dtype for
        the while it runs (the largest such conversion, counted with the compute buffers)."""
        return 0

    def kv_cells(self, ctx: int, sequences: int, window: int | None) -> int:
        """KV cells each of ``sequences`` keeps on a layer at ``ctx``: every position on a
        full-attention layer (``window`` None), at most the window on a sliding one."""
        return ctx if window is None else min(ctx, window)

    def compute_bytes(
        self,
        arch: ArchSpec,
        ctx: int,
        sequences: int,
        chunk: int,
        device_kind: str,
        cache: KVDtype | None,
    ) -> int | None:
        """The compute buffers of one prefill step of ``chunk`` tokens on ``device_kind`` as
        this backend's own model costs them (llama.cpp's graph allocator); None: the budget's
        general estimate (budget/planner.py, compute_buffer_bytes)."""
        return None

    def runtime(self, device_kind: str, vocab_size: int, kept_blocks: bool = False) -> int:
        """The runtime row: ``memory.runtime_for``, plus what grows with the vocabulary (the
        tokenizers' tables) where the backend counts that apart from its constant."""
        return self.memory.runtime_for(device_kind, kept_blocks)

    def fused_attention(
        self, device_kind: str, heads: AttentionHeads, ctx: int, chunk: int
    ) -> bool:
        """A prefill chunk's attention runs fused (no chunk x heads x ctx scores) on this
        device kind, for a model with these attention ``heads`` and ``ctx`` cells per sequence."""
        return self.memory.fused_attention

    def keeps_blocks(self) -> bool:
        """A CPU float32 runner keeps a GGUF's block matrices as stored (torch's native kernels)
        instead of dequantizing them."""
        return False

    def packs_matrices(self, stored: str) -> bool:
        """On CPU, matrices stored as ``stored`` are packed into a second layout (the LM head
        beside a tied embedding table is then held twice)."""
        return False

    def speculation(self, device: str, weights: str | None = None) -> SpeculationCosts:
        """Verification costs of a target on ``device`` holding ``weights`` (RunnerInfo.quant)."""
        if device.startswith(("cuda", "metal")):
            return GPU_SPECULATION
        return self.cpu_speculation
