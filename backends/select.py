"""Which backend runs a model on this machine, and building its runner.

Default order (docs/design.md, "Choosing a backend"): on Apple Silicon or an NVIDIA GPU, the
routing rule of backends/routing.py (a GGUF to llama.cpp with every layer on the GPU, safetensors
to MLX on Metal or torch on CUDA, never an architecture its runner lacks); otherwise, or when no
GPU runner can take the model, on CPU: torch with its native kernels for a GGUF they read as
stored where they were measured faster than llama.cpp (backends/torch/profile.py), else
llama.cpp when installed (the fast CPU path), else torch. ``--backend`` overrides.
Nothing here imports a framework at module import: detection uses ``find_spec``, the platform and
``nvidia-smi``; a backend's module is imported only when its runner is built.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.backend_profile import BACKENDS
from localinfer.backends.routing import gpu_fallback_note, gpu_route
from localinfer.errors import (
    BackendUnavailableError,
    OutOfMemoryBudgetError,
    UnsupportedModelError,
)

if TYPE_CHECKING:
    from localinfer.backend_profile import BackendProfile
    from localinfer.backends.base import Runner, RunnerConfig
    from localinfer.loading.model import LoadedModel


def backend_profile(name: str) -> BackendProfile:
    """The framework-free profile of backend ``name`` (backends/<name>/profile.py)."""
    if name not in BACKENDS:
        raise BackendUnavailableError(
            f"unknown backend '{name}'; choose one of: {', '.join(BACKENDS)}"
        )
    return importlib.import_module(f"localinfer.backends.{name}.profile").PROFILE


@dataclass(slots=True, frozen=True)
class BackendChoice:
    name: str  # torch | llamacpp | mlx
    reason: str  # why, for the one-line notice
    device: str = "cpu"  # the device that choice implies: cpu | cuda | metal

    @property
    def notice(self) -> str:
        return f"backend: {self.name} ({self.reason})"

    @property
    def profile(self) -> BackendProfile:
        return backend_profile(self.name)


def is_installed(backend: str) -> bool:
    module = backend_profile(backend).module
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def has_nvidia_gpu() -> bool:
    """An NVIDIA GPU this process can use.

    No driver (no ``nvidia-smi``, no /proc/driver/nvidia) answers False without importing
    anything; with a driver, torch (when installed) has the last word, since it is the backend
    that would use the GPU and a CPU-only torch build cannot.
    """
    driver = shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia")
    if not driver:
        return False
    if is_installed("torch"):
        import torch

        return bool(torch.cuda.is_available())
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def gpu_kind() -> str | None:
    """The GPU this machine offers a runner: metal (Apple Silicon), cuda (an NVIDIA GPU), None."""
    if is_apple_silicon():
        return "metal"
    return "cuda" if has_nvidia_gpu() else None


def llamacpp_offloads() -> bool:
    """The installed llama-cpp-python was built with a GPU backend (CUDA, Metal): asked of the
    library itself, so a CPU-only wheel on a GPU machine is not sent layers it cannot hold."""
    if not is_installed("llamacpp"):
        return False
    from localinfer.backends.llamacpp.profile import gpu_offload_built

    return gpu_offload_built()


def _runnable(backend: str) -> bool:
    """Installed, and (MLX) part of this build."""
    return is_installed(backend) and (backend != "mlx" or _has_mlx_runner())


def _requested_device(name: str) -> str:
    """The device --backend NAME runs on here: its GPU where it has one, else the CPU."""
    gpu = gpu_kind()
    if gpu is None:
        return "cpu"
    if name == "llamacpp":
        return gpu if llamacpp_offloads() else "cpu"
    return gpu if name == {"cuda": "torch", "metal": "mlx"}[gpu] else "cpu"


def _require(backend: str) -> None:
    profile = backend_profile(backend)
    if backend == "mlx" and not _has_mlx_runner():
        raise BackendUnavailableError("the mlx backend is not part of this localinfer build yet")
    if not is_installed(backend):
        raise BackendUnavailableError(
            f"backend '{backend}' is not installed: {profile.install_hint}"
        )


def _hint(backend: str) -> str:
    return backend_profile(backend).install_hint


def _native_blocks_preferred(file_quant: str | None, arch: str | None) -> bool:
    from localinfer.backends.torch.profile import PROFILE

    return PROFILE.preferred_for_gguf(file_quant, arch)


def _has_mlx_runner() -> bool:
    try:
        return importlib.util.find_spec("localinfer.backends.mlx.runner") is not None
    except (ImportError, ValueError):
        return False


def choose_backend(
    requested: str | None = None,
    model_format: str | None = None,
    file_quant: str | None = None,
    arch: str | None = None,
    kv_dtype: str | None = None,
) -> BackendChoice:
    """The backend to use; ``requested`` (from --backend) wins when it is installed.

    ``model_format`` ("gguf" | "safetensors"), when known, keeps safetensors models off llama.cpp,
    which only reads GGUF. ``file_quant`` and ``arch`` (a GGUF's dominant type and architecture),
    when known, let a CPU pick the torch runner's native kernels for files they read as stored
    (backends/torch/profile.py), unless ``kv_dtype`` (--kv-dtype) is a cache type only llama.cpp
    holds. On a GPU the choice stays and the runner refuses such a type (create_runner).
    """
    if requested:
        name = requested.lower()
        _require(name)
        if not backend_profile(name).runs_format(model_format):
            raise UnsupportedModelError(
                f"the {name} backend runs GGUF files only, and this model is {model_format}; "
                "use --backend torch (or convert the model to GGUF)"
            )
        return BackendChoice(name, "requested with --backend", _requested_device(name))
    note = ""
    gpu = gpu_kind()
    if gpu is not None:
        route = gpu_route(gpu, model_format, arch, backend_profile, _runnable, llamacpp_offloads())
        if route is not None:
            return BackendChoice(route.backend, route.reason, route.device)
        note = gpu_fallback_note(gpu, model_format, arch, backend_profile, _runnable)
    choice = _cpu_choice(model_format, file_quant, arch, note, kv_dtype)
    if choice is None:
        raise BackendUnavailableError(
            "no backend is installed: " + "; ".join(f"{name}: {_hint(name)}" for name in BACKENDS)
        )
    return choice


def _cpu_choice(
    model_format: str | None,
    file_quant: str | None,
    arch: str | None,
    note: str = "",
    kv_dtype: str | None = None,
) -> BackendChoice | None:
    """This CPU's engine among the installed ones (None: none is): the native kernels for a
    GGUF they read as stored where measured faster and torch holds the KV cache type asked
    (only its float32), else llama.cpp for GGUF, else torch."""
    native = (
        model_format == "gguf"
        and is_installed("torch")
        and _native_blocks_preferred(file_quant, arch)
    )
    if native and backend_profile("torch").kv_dtype_refusal(kv_dtype, "float32") is None:
        return BackendChoice(
            "torch",
            f"CPU: localinfer's native kernels on the file's {file_quant} blocks, faster than "
            "llama.cpp on this CPU",
        )
    if is_installed("llamacpp"):
        if model_format in (None, "gguf"):
            why = f"; it holds the {kv_dtype} KV cache asked" if native else ""
            return BackendChoice(
                "llamacpp", "CPU: llama.cpp, the fast CPU path for this file" + why + note
            )
        if is_installed("torch"):
            return BackendChoice(
                "torch", f"CPU: llama.cpp reads GGUF only and this model is {model_format}" + note
            )
    if is_installed("torch"):
        return BackendChoice(
            "torch", f"CPU: PyTorch; for faster CPU inference: {_hint('llamacpp')}" + note
        )
    return None


def planned_backend(
    device_kind: str,
    requested: str | None = None,
    model_format: str | None = None,
    file_quant: str | None = None,
    arch: str | None = None,
    kv_dtype: str | None = None,
) -> str:
    """The backend the budget costs on a device of ``device_kind`` (cpu | cuda | metal | planned:
    a named machine), installed here or not: on a GPU the routing rule as on a machine with
    every backend installed and llama.cpp built for that GPU, a planned machine of unknown kind
    -> llama.cpp, this CPU -> choose_backend's CPU rule (torch when nothing is installed), which
    ``kv_dtype`` takes part in."""
    if requested:
        return backend_profile(requested.lower()).name
    if device_kind in ("cuda", "metal"):
        route = gpu_route(
            device_kind, model_format, arch, backend_profile, lambda _: True, llamacpp_offloads=True
        )
        return route.backend if route is not None else "llamacpp"
    if device_kind == "planned":
        return "llamacpp"
    choice = _cpu_choice(model_format, file_quant, arch, kv_dtype=kv_dtype)
    return choice.name if choice is not None else "torch"


def create_runner(model: LoadedModel, config: RunnerConfig, choice: BackendChoice) -> Runner:
    """Build the runner of the backend already chosen (choose_backend); selection runs once."""
    _require(choice.name)
    refusal = choice.profile.kv_dtype_refusal(config.kv_dtype, config.dtype)
    if refusal is not None:
        raise UnsupportedModelError(refusal)
    module = importlib.import_module(f"localinfer.backends.{choice.name}.runner")
    try:
        return module.create_runner(model, config)
    except (MemoryError, RuntimeError) as exc:
        if not _allocation_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise OutOfMemoryBudgetError(
            f"not enough memory for {choice.name} with {config.slots} slot(s) of "
            f"{config.max_ctx} tokens ({first}); `localinfer budget` shows what fits"
        ) from None


# What the frameworks raise when an allocation fails: torch's CPU allocator ("can't allocate
# memory") and torch.OutOfMemoryError (CUDA), MLX's "[malloc]" / "[metal::malloc] Attempting to
# allocate" / "Resource limit (N) exceeded", Python's MemoryError. Matched by name and text:
# this module never imports a framework.
_ALLOCATION_WORDS = (
    "can't allocate memory",
    "out of memory",
    "malloc]",
    "unable to allocate",
    "resource limit",
)


def _allocation_failure(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return any(words in text for words in _ALLOCATION_WORDS)
