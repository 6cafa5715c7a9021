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

    def runtime_for(self, device_kind: str) -> int:
        if device_kind in ("cuda", "metal"):
            return self.accelerator_runtime_bytes
        return self.runtime_bytes


BACKEND_PROFILES: dict[str, BackendProfile] = {
    "torch": BackendProfile(
        "torch",
        # Measured 2026-11-30, torch 2.13.0+cpu, 2 threads, x86_64: RSS after `import torch` and
        # one pass of matmul / SDPA / embedding / softmax in fp32 and bf16 on tiny tensors, minus
        # the bare interpreter's RSS: 301.5-301.6 MiB in 3 runs.
        runtime_bytes=302 * 2**20,
        # UNMEASURED placeholder: CUDA context + cuBLAS workspace; measure nvidia-smi's used memory
        # of an idle runner minus torch.cuda.memory_allocated() on a GPU machine.
        accelerator_runtime_bytes=512 * 2**20,
        # SDPA with a boolean mask on CPU runs the flash kernel: q 512 x k 16384 x 32 heads grew
        # peak RSS by 44 MiB where materialized scores would take 1 GiB (measured, same machine).
        fused_attention=True,
        prefill_chunk=256,  # the engine's prefill_chunk: torch allocates per forward pass
        how_measured="CPU: measured RSS of import + kernel warm-up; CUDA: UNMEASURED placeholder",
    ),
    "llamacpp": BackendProfile(
        "llamacpp",
        # Measured 2026-11-30, llama-cpp-python 0.3.36, embedded SmolLM2 Q4_1, 2 threads:
        # `import llama_cpp` adds 35.5 MiB RSS; after loading with n_ctx 512 and 4096 and a
        # 100-token eval, RSS minus the model/KV/compute buffers llama.cpp reports is below zero
        # (reserved compute pages are not all touched), so the library itself is the constant.
        runtime_bytes=36 * 2**20,
        # UNMEASURED placeholder for CUDA/Metal builds of llama.cpp.
        accelerator_runtime_bytes=256 * 2**20,
        # llama-cpp-python leaves flash attention off ("flash_attn = disabled" in its log).
        fused_attention=False,
        # llama.cpp reserves its compute buffer for n_ubatch tokens (the runner's n_batch, 512)
        # whatever the engine sends.
        prefill_chunk=512,
        how_measured="CPU: measured RSS of import + load + eval minus reported buffers",
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
