"""Which runner takes a model on a GPU: by the file's format, its architecture and the device.

The rule (docs/design.md, "Choosing a backend"):

- a GGUF goes to llama.cpp with every layer on the GPU (CUDA or Metal), as Ollama and LM Studio
  run it: llama.cpp keeps every K-quant as stored and has kernels for each on both devices;
- a safetensors model (an MLX-format repo included) goes to the device's own framework runner:
  MLX on Metal, torch on CUDA;
- an architecture a runner does not implement never lands on it: the next candidate takes it,
  and when none can, the model runs on the CPU with the reason said.

Pure: the caller says what is installed and whether llama.cpp's build offloads, so the table is
tested with simulated devices (tests/test_routing.py) and the budget plans for a machine that is
not this one with the same rule. Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localinfer.backend_profile import BackendProfile
from localinfer.backends.llamacpp.profile import GPU_REBUILD_HINT

GPU_KINDS = ("cuda", "metal")
DEVICE_NAMES = {"cuda": "an NVIDIA GPU", "metal": "Apple Silicon"}
FRAMEWORK_RUNNER = {"cuda": "torch", "metal": "mlx"}
FRAMEWORK_WORDS = {"torch": "PyTorch on CUDA", "mlx": "MLX on Metal"}


@dataclass(frozen=True, slots=True)
class Route:
    """A runner for a model on a device, and why; ``device`` "cpu" when no GPU runner can."""

    backend: str  # torch | llamacpp | mlx
    device: str  # cpu | cuda | metal
    reason: str


def runs_arch(profile: BackendProfile, arch: str | None) -> bool:
    """The runner implements ``arch`` (None: not known yet, assumed)."""
    return arch is None or profile.archs is None or arch in profile.archs


def gpu_route(
    device_kind: str,
    model_format: str | None,
    arch: str | None,
    profile: Callable[[str], BackendProfile],
    installed: Callable[[str], bool],
    llamacpp_offloads: bool,
) -> Route | None:
    """The runner for a model on ``device_kind`` (cuda | metal); None when no installed runner
    can run it on that GPU (the caller falls back to the CPU rule and says why).

    ``installed``: whether a backend's framework imports here; ``llamacpp_offloads``: whether the
    installed llama.cpp build has the device's GPU backend (a CPU-only wheel does not).
    """
    where = DEVICE_NAMES[device_kind]
    framework = FRAMEWORK_RUNNER[device_kind]
    if model_format in (None, "gguf") and installed("llamacpp") and llamacpp_offloads:
        return Route("llamacpp", device_kind, f"{where}: llama.cpp with every layer on the GPU")
    native = profile(framework)
    if installed(framework) and native.runs_format(model_format) and runs_arch(native, arch):
        why = FRAMEWORK_WORDS[framework]
        if model_format in (None, "gguf"):
            why += "; llama.cpp has no GPU build here" if installed("llamacpp") else ""
        return Route(framework, device_kind, f"{where}: {why}")
    return None


def gpu_fallback_note(
    device_kind: str,
    model_format: str | None,
    arch: str | None,
    profile: Callable[[str], BackendProfile],
    installed: Callable[[str], bool],
) -> str:
    """Why a model on ``device_kind`` runs on the CPU instead, with the command that fixes it."""
    where = DEVICE_NAMES[device_kind]
    framework = FRAMEWORK_RUNNER[device_kind]
    native = profile(framework)
    if model_format in (None, "gguf"):
        if not installed("llamacpp"):
            return f"; {where} is present, for GGUF on it: {profile('llamacpp').install_hint}"
        return (
            f"; {where} is present, but this llama.cpp build has no GPU backend: "
            + GPU_REBUILD_HINT[device_kind]
        )
    if not installed(framework):
        return f"; {where} is present, to use it: {native.install_hint}"
    if not runs_arch(native, arch):
        return f"; the {framework} runner does not implement {arch!r} (its GGUF runs on the GPU)"
    return ""
