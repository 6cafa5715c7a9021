"""Load and call cpu_kernels.c: the torch runner's native fp32 forward for small batches.

native_build.py compiles the C file for this machine; it is loaded here with ctypes. ``import
torch`` comes first so the library binds to the libgomp torch has already loaded (same soname):
torch's OpenMP threads and the kernels' are one pool, never two pools fighting over the cores.

Where no compiler is found, or the build fails, ``load_kernels`` returns None once with a logged
reason, and the runner keeps its pure-torch path.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from localinfer.backends.torch.native_build import BuildError, build, native_kernels_enabled

log = logging.getLogger(__name__)


class LayerPointers(ctypes.Structure):
    """li_layer in cpu_kernels.c: addresses of one layer's tensors."""

    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("qkv", ctypes.c_void_p),
        ("qkv_bias", ctypes.c_void_p),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("gate_up", ctypes.c_void_p),
        ("down", ctypes.c_void_p),
        ("kcache", ctypes.c_void_p),
        ("vcache", ctypes.c_void_p),
        ("window", ctypes.c_int64),
    ]


class Dims(ctypes.Structure):
    """li_dims in cpu_kernels.c."""

    _fields_ = [
        ("hidden", ctypes.c_int64),
        ("n_heads", ctypes.c_int64),
        ("n_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("ffn", ctypes.c_int64),
        ("max_ctx", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("attn_scale", ctypes.c_float),
    ]


@dataclass(frozen=True)
class NativeKernels:
    """The loaded library with its argument types declared."""

    lib: ctypes.CDLL
    path: Path

    def forward(self, *args) -> int:
        return self.lib.li_forward(*args)

    def scratch_floats(self, dims: Dims, tokens: int, threads: int) -> int:
        return self.lib.li_forward_scratch(ctypes.byref(dims), tokens, threads)

    def norm_linear(self, *args) -> None:
        self.lib.li_norm_linear(*args)

    def linear(
        self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, threads: int
    ) -> torch.Tensor:
        """x [T, in] . w[out, in]^T (+ bias), float32 contiguous: the bare matrix product."""
        _check_f32(x, w, *([bias] if bias is not None else []))
        y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
        self.lib.li_linear(
            x.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), w.shape[0],
            bias.data_ptr() if bias is not None else None, y.data_ptr(), threads,
        )  # fmt: skip
        return y


def _check_f32(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("native kernels take contiguous float32 CPU tensors")


def load_kernels() -> NativeKernels | None:
    """The compiled library, building it on first use; None (logged once) when unavailable
    or turned off with LOCALINFER_NATIVE_KERNELS=0."""
    return _load() if native_kernels_enabled() else None


@cache
def _load() -> NativeKernels | None:
    try:
        path = build()
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError, BuildError) as exc:
        log.warning("native CPU kernels unavailable, using torch ops: %s", exc)
        return None
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.li_forward_scratch.argtypes = [p, i64, i32]
    lib.li_forward_scratch.restype = i64
    lib.li_forward.argtypes = [p, p, i64, p, i64, p, p, p, p, p, i32]
    lib.li_forward.restype = i32
    lib.li_norm_linear.argtypes = [p, i64, i64, p, f32, p, p, i64, p, i32]
    lib.li_norm_linear.restype = None
    lib.li_linear.argtypes = [p, i64, i64, p, i64, p, p, i32]
    lib.li_linear.restype = None
    return NativeKernels(lib, path)
