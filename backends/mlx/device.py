"""Which MLX device a runner uses, and how much memory Apple says a process may use."""

from __future__ import annotations

import mlx.core as mx

from localinfer.errors import BackendUnavailableError


def metal_available() -> bool:
    return bool(mx.metal.is_available())


def resolve_device(name: str) -> mx.Device:
    """RunnerConfig.device -> an MLX device: "metal" (or "gpu") needs Metal; "cpu" always works."""
    if name in ("metal", "gpu", "mps"):
        if not metal_available():
            raise BackendUnavailableError(
                f"device {name!r} requested but MLX has no Metal device here; use --device cpu"
            )
        return mx.gpu
    if name == "cpu":
        return mx.cpu
    raise BackendUnavailableError(f"the mlx runner runs on metal or cpu, not {name!r}")


def device_label(device: mx.Device) -> str:
    return "metal" if device == mx.gpu else "cpu"


def recommended_working_set() -> int | None:
    """Bytes Metal recommends a process keep resident (the memory available to a model on
    Apple Silicon, about 67-84% of unified memory); None without Metal."""
    if not metal_available():
        return None
    # mx.device_info is the current API; mx.metal.device_info the one before 0.29.
    info_fn = getattr(mx, "device_info", None)
    info = info_fn(mx.gpu) if info_fn is not None else mx.metal.device_info()
    size = info.get("max_recommended_working_set_size")
    return int(size) if size else None
