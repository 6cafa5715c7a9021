"""How many layers llama.cpp puts on the GPU (``n_gpu_layers``), from the runner's config.

On a GPU device every layer goes there unless the budget sized a partial offload (the layers
that fit with their KV cache and the compute buffers; the rest run on the CPU). A build without
a GPU backend is refused with the rebuild that gives it one, never run on the CPU silently.
"""

from __future__ import annotations

from localinfer.backends.llamacpp.profile import GPU_REBUILD_HINT
from localinfer.errors import BackendUnavailableError

ALL_LAYERS = -1  # llama.cpp's "every layer, and the output layer"


def gpu_layer_count(device: str, gpu_layers: int | None, build_offloads: bool) -> int:
    """``n_gpu_layers`` for a runner on ``device`` (cpu | cuda[:N] | metal) asked to hold
    ``gpu_layers`` there (None: all)."""
    if device == "cpu":
        return 0
    if not build_offloads:
        kind = "metal" if device == "metal" else "cuda"
        raise BackendUnavailableError(
            f"this llama-cpp-python build has no GPU backend for device '{device}'; use "
            f"--device cpu, or rebuild it: {GPU_REBUILD_HINT[kind]}"
        )
    if gpu_layers is None:
        return ALL_LAYERS
    if gpu_layers < 0:
        raise ValueError(f"gpu_layers must be >= 0, got {gpu_layers}")
    return gpu_layers
