"""The llama.cpp backend's framework-free facts. Importing this never imports llama_cpp."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backend_profile import BackendProfile, MemoryModel, SpeculationCosts
from localinfer.backends.llamacpp.attention_plan import PREFILL_UBATCH, flash_attention
from localinfer.backends.llamacpp.compute_model import (
    RESERVED_ROWS_ON,
    compute_buffer_bytes,
    node_compute_bytes,
)
from localinfer.backends.llamacpp.context_shape import cells_per_sequence, sliding_cells
from localinfer.errors import BackendUnavailableError

if TYPE_CHECKING:
    from localinfer.facts.arch import ArchSpec, AttentionHeads
    from localinfer.facts.kv_dtype import KVDtype
    from localinfer.facts.quantize_events import QuantizeProgress, QuantizeResult

# Host bytes per vocabulary token of the tokenizer tables a llama.cpp session holds: the
# loader's (the GGUF's token list read into Python, the tokenizers library's vocabulary and
# merges) and llama.cpp's own (token texts, maps, caches). From the embedded model's 49,152
# tokens to Gemma 3's 262,144 (its file and random models with that vocabulary) RSS grows by
# ~520-580 bytes a token in the loader and ~120 in llama.cpp, plus what the heap keeps of the
# loader's peak while it builds the tokenizer: scripts/budget-accuracy fits 720.
VOCAB_TABLE_BYTES = 720


@dataclass(frozen=True, slots=True)
class LlamaCppProfile(BackendProfile):
    def kv_cells(self, ctx: int, sequences: int, window: int | None) -> int:
        """llama.cpp's cells per sequence, padded to 256, on sliding layers too (swa_full:
        context_shape.py)."""
        if window is None:
            return cells_per_sequence(ctx, sequences)
        return sliding_cells(ctx, sequences, window, PREFILL_UBATCH)

    def compute_bytes(
        self,
        arch: ArchSpec,
        ctx: int,
        sequences: int,
        chunk: int,
        device_kind: str,
        cache: KVDtype | None,
    ) -> int:
        """llama.cpp's graph at the runner's n_ubatch (compute_model.py), whatever the engine's
        chunk; a quantized cache turns flash attention on (cache_types.py)."""
        quantized_cache = cache is not None and cache.block > 1
        fused = quantized_cache or self.fused_attention(device_kind, arch, ctx, chunk)
        return compute_buffer_bytes(arch, ctx, sequences, PREFILL_UBATCH, device_kind, fused)

    def node_compute_bytes(
        self,
        arch: ArchSpec,
        ctx: int,
        sequences: int,
        cache: KVDtype | None,
        *,
        layers: bool,
        output: bool,
        host: bool,
    ) -> int:
        """One CPU node's compute when the model is split across machines (compute_model.py),
        with the flash attention choice this machine's runner makes."""
        fused = (cache is not None and cache.block > 1) or self.fused_attention(
            "cpu", arch, ctx, PREFILL_UBATCH
        )
        return node_compute_bytes(arch, ctx, sequences, PREFILL_UBATCH, fused,
                                  layers=layers, output=output, host=host)  # fmt: skip

    def runtime(self, device_kind: str, vocab_size: int, kept_blocks: bool = False) -> int:
        """The constant plus the tokenizer tables (VOCAB_TABLE_BYTES a token) in host memory;
        on a GPU the device's runtime alone."""
        base = self.memory.runtime_for(device_kind, kept_blocks)
        if device_kind in ("cuda", "metal"):
            return base
        return base + VOCAB_TABLE_BYTES * vocab_size

    def fused_attention(
        self, device_kind: str, heads: AttentionHeads, ctx: int, chunk: int
    ) -> bool:
        """On this machine's CPU, what the runner will choose (attention_plan.py, measured),
        which depends on its n_ubatch, not on the engine's chunk; elsewhere llama.cpp's own
        default, flash attention on."""
        if device_kind != "cpu":
            return True
        return flash_attention(heads, ctx, PREFILL_UBATCH)

    def kv_dtype_refusal(self, kv_dtype: str | None, compute_dtype: str) -> str | None:
        """llama.cpp keeps its cache in any type of cache_types.py (Q8_0/Q4_0: the runner turns
        flash attention on for them), whatever the activations' dtype."""
        from localinfer.backends.llamacpp.cache_types import cache_type
        from localinfer.errors import InvalidParameterError

        try:
            cache_type(kv_dtype)
        except InvalidParameterError as exc:
            return str(exc)
        return None

    def quant_refusal(self, quant: str, file_quant: str | None) -> str | None:
        """A name that is no GGUF type and not one llama.cpp can write (mlx-4bit, int4-g64): the
        runner's refusal (runner.py), which no `localinfer quantize` can lift. GGUF types are
        budgeted: a catalog entry offers them as files, `quantize` writes the others."""
        from localinfer.backends.llamacpp.quantize import TARGETS, requantize_advice

        key = quant.strip().lower()
        if key in TARGETS or key in _FLOAT_NAMES or key.upper().startswith(("Q", "IQ")):
            return None
        advice = requantize_advice(Path(quant), quant, file_quant)
        return (
            f"the llamacpp backend runs a GGUF as stored ({file_quant}); to use {quant}, {advice}"
        )


_FLOAT_NAMES = ("none", "f32", "f16", "bf16", "fp32", "fp16", "float32", "float16", "bfloat16")


PROFILE = LlamaCppProfile(
    name="llamacpp",
    module="llama_cpp",
    install_hint="pip install 'localinfer[llamacpp]'",
    formats=("gguf",),
    memory=MemoryModel(
        # scripts/budget-accuracy (embedded model): RSS growth minus predicted weights, KV,
        # compute and the tokenizer tables (VOCAB_TABLE_BYTES a token, counted apart) = ~23 MiB:
        # `import llama_cpp` and the session's modules, llama.cpp's loader, its threads' stacks.
        runtime_bytes=23 * 2**20,
        accelerator_runtime_bytes=256 * 2**20,  # UNMEASURED placeholder (CUDA/Metal builds)
        # On a GPU flash_attn = auto enables it; on the CPU it is measured per machine
        # (attention_plan.py, LlamaCppProfile.fused_attention). Without it the scores share the
        # compute buffer with the logits.
        fused_attention=True,
        # The compute buffer is reserved for n_ubatch (the runner's n_batch, 512) tokens.
        prefill_chunk=512,
        how_measured="CPU: measured RSS growth of load + forward minus weights, KV, compute",
        # Where the graph's reserved logits rows are held: LlamaCppProfile.compute_bytes.
        chunk_logits_on=RESERVED_ROWS_ON,
    ),
    # scripts/bench-speculative, embedded Q4_1, 2 threads: a (k+1)-token forward costs
    # 1 + 0.45 + 0.48 k one-token steps (a matrix-vector kernel for one token, compute-bound
    # batches); speculation pays up to 2 busy slots (1.51x / 1.04x at 1 / 2).
    cpu_speculation=SpeculationCosts(per_token=0.48, fixed=0.45, max_busy_slots=2),
    # LLAMA_MAX_SEQ (llama.cpp's src/llama-cparams.h): a context with more sequences fails to
    # initialize, "n_seq_max must be <= 256" (llama-cpp-python 0.3.36's libllama, measured).
    max_sequences=256,
)


# The rebuild that gives llama-cpp-python the device's GPU backend (scripts/run does it when it
# finds the toolkit; --no-cache-dir so pip does not reuse the CPU wheel it cached), keeping the
# RPC backend scripts/_env.sh builds in (`localinfer worker`, --rpc).
GPU_REBUILD_HINT = {
    "cuda": 'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON" pip install --force-reinstall '
    "--no-cache-dir llama-cpp-python",
    "metal": 'CMAKE_ARGS="-DGGML_METAL=on -DGGML_RPC=ON" pip install --force-reinstall '
    "--no-cache-dir llama-cpp-python",
}


def gpu_offload_built() -> bool:
    """Whether the installed llama-cpp-python can put layers on a GPU (native.py; loads the
    library when called, so only where a GPU is present): a CPU-only wheel cannot."""
    try:
        from localinfer.backends.llamacpp.native import supports_gpu_offload
    except ImportError:
        return False
    try:
        return supports_gpu_offload()
    except (OSError, BackendUnavailableError):  # the shared library itself failed to load
        return False


def quantize_gguf(
    source: Path,
    output: Path | None,
    target: str,
    *,
    threads: int | None = None,
    allow_requantize: bool = False,
    on_progress: Callable[[QuantizeProgress], None] | None = None,
) -> QuantizeResult:
    """Write ``source`` re-quantized to ``target`` with llama.cpp (quantize.py; imports
    llama_cpp when called): `localinfer quantize` reaches the backend through its profile."""
    from localinfer.backends.llamacpp.quantize import quantize_gguf as write

    return write(
        source, output, target,
        threads=threads, allow_requantize=allow_requantize, on_progress=on_progress,
    )  # fmt: skip


def start_rpc_worker(
    host: str,
    port: int,
    *,
    mem: int | None,
    allow: str | None,
    threads: int | None,
    available: Callable[[], tuple[int, int]],
    log: Callable[[str], None],
) -> object:
    """`localinfer worker`: llama.cpp's RPC server here, behind its relay (rpc_worker.py; loads
    llama_cpp when called). The Worker it returns serves until the process ends."""
    from localinfer.backends.llamacpp.rpc_worker import WorkerOptions, start_worker

    options = WorkerOptions(host, port, mem, allow, threads)
    return start_worker(options, available, log)


def rpc_worker_memory(endpoint: str, timeout: float = 5.0) -> tuple[str, int, int]:
    """(protocol version, free, total bytes) an RPC worker at HOST:PORT reports (rpc_wire.py:
    plain sockets, no llama_cpp). OSError or ConnectionError when it cannot be asked."""
    from localinfer.backends.llamacpp.rpc_wire import device_memory

    found = device_memory(endpoint, timeout)
    return found.version, found.free, found.total
