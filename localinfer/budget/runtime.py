"""Per-backend memory facts the budget cannot derive from the model: the runtime constant
(measured), whether attention is fused, how many tokens one forward pass carries, and the
dtype torch dequantizes GGUF weights to."""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("torch", "llamacpp", "mlx")
# Compute dtypes a runner may hold dequantized weights in -> the budget's quant name.
DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
# The torch runner dequantizes GGUF blocks to its dtype when it loads them; its default dtype is
# RunnerConfig's (float32) on CPU. Keep in step with what the engine passes as RunnerConfig.dtype.
TORCH_DEFAULT_DTYPE = {"cpu": "float32", "planned": "float32", "cuda": "bfloat16"}


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """Per-backend overhead that does not scale with the model.

    The runtime constants MUST BE MEASURED, not guessed: they are the framework's own resident
    memory (library code, allocator arenas, CUDA context). `how_measured` says where each figure
    came from; one still marked UNMEASURED is a placeholder to replace.
    """

    name: str
    runtime_bytes: int  # host memory (CPU device)
    accelerator_runtime_bytes: int  # on the GPU / Metal device
    fused_attention: bool  # False: a prefill chunk's attention scores are materialized
    prefill_chunk: int  # tokens one forward pass may carry: sizes the compute buffers
    how_measured: str
    # Device kinds where a logits buffer for every token of the chunk is resident. A backend that
    # reserves it up front (llama.cpp's graph, n_ubatch output rows) holds it on a GPU; on the
    # CPU the reserved pages stay untouched (not resident) because the engine asks logits for one
    # row per sequence. A backend that allocates per pass (torch, MLX) never holds more rows than
    # asked, so only one row per sequence counts anywhere.
    chunk_logits_on: tuple[str, ...] = ()
    # torch on CPU packs the LM head for oneDNN when its native kernels are not in use (bf16,
    # or f32 without a C compiler); with tied embeddings the dense table the embedding lookup
    # reads stays beside the packed copy, so the vocab x hidden matrix is held twice
    # (backends/torch/weights.py, compute._packs_matrices).
    tied_head_copy_on_cpu: bool = False
    # torch on CPU keeping a GGUF's Q8_0/Q4_0/Q4_1 blocks for its native kernels: nothing is
    # dequantized while loading, which leaves the heap smaller than runtime_bytes assumes.
    # None: runtime_bytes.
    kept_blocks_runtime_bytes: int | None = None

    def runtime_for(self, device_kind: str, kept_blocks: bool = False) -> int:
        if kept_blocks and self.kept_blocks_runtime_bytes is not None:
            return self.kept_blocks_runtime_bytes
        if device_kind in ("cuda", "metal"):
            return self.accelerator_runtime_bytes
        return self.runtime_bytes


BACKEND_PROFILES: dict[str, BackendProfile] = {
    "torch": BackendProfile(
        "torch",
        # Measured 2026-11-30, torch 2.13.0+cpu, 2 threads, x86_64, with `scripts/budget-accuracy
        # --backends torch` (fresh process per cell): RSS growth from before `load_model` to
        # after the runner's first 256-token forward, minus the predicted weights (incl. file
        # mapping) + KV + compute, over the 9 cells of ctx {512, 2048, 8192} x {1, 4, 8}:
        # 257-279 MiB with the native fp32 kernels, 252-270 MiB with them off (oneDNN-packed
        # matrices; ctx {512, 8192} x {1, 8}). That is the library (`import torch` alone:
        # 213 MiB) plus localinfer's loader: 48 MiB for the embedded model, mostly its
        # 49152-token tokenizer, so it grows with the vocabulary. (An earlier single-cell figure,
        # 338 MiB, was not reproduced by the grid.)
        runtime_bytes=268 * 2**20,
        # UNMEASURED placeholder: CUDA context + cuBLAS workspace; measure nvidia-smi's used memory
        # of an idle runner minus torch.cuda.memory_allocated() on a GPU machine.
        accelerator_runtime_bytes=512 * 2**20,
        # SDPA with a boolean mask on CPU runs the flash kernel: q 512 x k 16384 x 32 heads grew
        # peak RSS by 44 MiB where materialized scores would take 1 GiB (measured, same machine).
        fused_attention=True,
        prefill_chunk=256,  # the engine's prefill_chunk: torch allocates per forward pass
        how_measured="CPU: measured RSS growth of load + forward minus weights, KV, compute; "
        "CUDA: UNMEASURED placeholder",
        chunk_logits_on=(),  # logits only for the rows asked (peak activations: 6.1 MiB, ctx 512)
        tied_head_copy_on_cpu=True,  # measured: weights() reports 621.1 MiB = 513.1 + 108.0
        # The model file's pages the load reads are not counted: the runner drops them once the
        # weights are copied out (GGUFFile.release_pages; RssFile 181 -> 87 MiB, embedded model).
        # The constants above and below were measured with them counted in the predicted
        # weights and resident, so they carry over.
        # Measured 2026-12-01 the same way (scripts/budget-accuracy --backends torch, 9 cells)
        # with the embedded model's Q4_1/Q8_0 blocks kept as stored: RSS growth minus the
        # predicted weights (blocks) + KV + compute, 308-315 MiB. It was 214-219 MiB while every
        # forward ran the native kernels; a 256-token forward now runs torch ops on matrices
        # dequantized as they are used, which brings in oneDNN's primitives and torch's
        # allocator arenas (~95 MiB) and the reused float32 buffer of the largest block matrix.
        kept_blocks_runtime_bytes=311 * 2**20,
    ),
    "llamacpp": BackendProfile(
        "llamacpp",
        # Measured 2026-11-30, llama-cpp-python 0.3.36, embedded SmolLM2 Q4_1, 2 threads, with
        # `scripts/budget-accuracy --cell llamacpp 1024 2` (outside the checked grid): a fresh
        # process's RSS growth from before `load_model` to after a 512-token forward, minus the
        # predicted weights + KV + compute (one logits row per sequence: llama.cpp reserves
        # 98.25 MiB of compute buffer but the pages for 512 logits rows stay untouched on the
        # CPU): 55.5 and 54.5 MiB in 2 runs. That is `import llama_cpp` (35.5 MiB alone) plus
        # localinfer's loader (the tokenizer built from the GGUF vocab; grows with the vocab).
        runtime_bytes=55 * 2**20,
        # UNMEASURED placeholder for CUDA/Metal builds of llama.cpp.
        accelerator_runtime_bytes=256 * 2**20,
        # llama.cpp 0.3.36 defaults to flash_attn = auto, and its log then says "Flash Attention
        # enabled" on CPU: the compute buffer is 98.25 MiB for the embedded model at n_ctx 512,
        # 8192 and 8 x 8192 alike, so no chunk x ctx scores are materialized.
        fused_attention=True,
        # llama.cpp reserves its compute buffer for n_ubatch tokens (the runner's n_batch, 512)
        # whatever the engine sends.
        prefill_chunk=512,
        how_measured="CPU: measured RSS growth of load + forward minus weights, KV, compute",
        # Its graph reserves n_ubatch rows of logits: physical memory on a GPU; on the CPU those
        # pages stay untouched when the engine asks one row per sequence (RSS measured).
        chunk_logits_on=("cuda", "metal", "planned"),
    ),
    "mlx": BackendProfile(
        "mlx",
        # UNMEASURED placeholders: measure mx.get_active_memory() + mx.get_cache_memory() of an
        # idle runner minus its weights and KV cache on an Apple Silicon Mac.
        runtime_bytes=128 * 2**20,
        accelerator_runtime_bytes=128 * 2**20,
        fused_attention=True,  # mx.fast.scaled_dot_product_attention
        prefill_chunk=256,  # the engine's prefill_chunk
        how_measured="UNMEASURED placeholder",
    ),
}
