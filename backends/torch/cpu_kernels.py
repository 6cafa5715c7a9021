"""Load and call cpu_kernels.c: the torch runner's native CPU forward (float32 activations, weights
as float32 rows or GGUF block rows).

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from localinfer.backends.torch.block_weights import BlockMatrix
from localinfer.backends.torch.native_build import BuildError, build, native_kernels_enabled

log = logging.getLogger(__name__)

F32_FORMAT = 0  # li_mat.format for float32 rows


class Mat(ctypes.Structure):
    """li_mat in cpu_kernels.c: one weight matrix, float32 rows or GGUF block rows."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("format", ctypes.c_int32),
    ]


def mat(w: torch.Tensor | BlockMatrix) -> Mat:
    """The li_mat for a dense float32 [out, in] tensor or a BlockMatrix (the caller keeps
    ``w`` alive while the kernels may read it)."""
    if isinstance(w, BlockMatrix):
        return Mat(w.blocks.data_ptr(), w.row_bytes, w.format)
    _check_f32(w)
    return Mat(w.data_ptr(), w.shape[1] * 4, F32_FORMAT)


class LayerPointers(ctypes.Structure):
    """li_layer in cpu_kernels.c: addresses of one layer's tensors."""

    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("qkv", Mat),
        ("qkv_bias", ctypes.c_void_p),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("o", Mat),
        ("post_norm", ctypes.c_void_p),
        ("gate_up", Mat),
        ("down", Mat),
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

    def isa(self) -> int:
        """The vector ISA the library was built for: 512 (AVX-512), 256 (AVX2 + FMA), 0."""
        return int(self.lib.li_isa())

    def scratch_floats(self, dims: Dims, tokens: int, threads: int) -> int:
        return self.lib.li_forward_scratch(ctypes.byref(dims), tokens, threads)

    def norm_linear(self, *args) -> None:
        self.lib.li_norm_linear(*args)

    def linear(
        self,
        x: torch.Tensor,
        w: torch.Tensor | BlockMatrix,
        bias: torch.Tensor | None,
        threads: int,
    ) -> torch.Tensor:
        """x [T, in] . w[out, in]^T (+ bias), float32 contiguous (or w as blocks): the bare
        matrix product."""
        _check_f32(x, *([bias] if bias is not None else []))
        if x.shape[1] != w.shape[1]:
            raise ValueError(f"x has {x.shape[1]} columns, w {w.shape[1]}")
        y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
        m = mat(w)
        self.lib.li_linear(
            x.data_ptr(), x.shape[0], x.shape[1], ctypes.byref(m), w.shape[0],
            bias.data_ptr() if bias is not None else None, y.data_ptr(), threads,
        )  # fmt: skip
        return y

    def dequant_matrix(self, w: BlockMatrix, out: torch.Tensor, threads: int) -> torch.Tensor:
        """All of w as float32 [out, in], written into ``out`` (a float32 buffer of at least
        that many elements, reused across calls): the dequantized matrix, bit for bit."""
        rows, cols = w.shape
        if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() < rows * cols:
            raise ValueError("dequant_matrix needs a contiguous float32 buffer large enough")
        m = mat(w)
        self.lib.li_dequant_matrix(ctypes.byref(m), cols, rows, out.data_ptr(), threads)
        return out[: rows * cols].view(rows, cols)

    def dequant_rows(self, w: BlockMatrix, rows: torch.Tensor) -> torch.Tensor:
        """w's rows ``rows`` ([n] long, in range) as float32 [n, in]: the embedding lookup of a
        table kept as blocks, equal to indexing its dequantized float32 table."""
        rows = rows.contiguous()
        out = torch.empty(rows.shape[0], w.in_features, dtype=torch.float32)
        m = mat(w)
        self.lib.li_dequant_rows(
            ctypes.byref(m), w.in_features, rows.data_ptr(), rows.shape[0], out.data_ptr()
        )
        return out


def matrix_decoder(kernels: NativeKernels, threads: int) -> Callable[[BlockMatrix], torch.Tensor]:
    """``decode(w)``: all of w as float32, in one buffer reused from call to call (grown to the
    largest matrix asked for): what a torch op multiplies by, valid until the next call."""
    buffer = torch.empty(0, dtype=torch.float32)

    def decode(w: BlockMatrix) -> torch.Tensor:
        nonlocal buffer
        if buffer.numel() < w.out_features * w.in_features:
            buffer = torch.empty(w.out_features * w.in_features, dtype=torch.float32)
        return kernels.dequant_matrix(w, buffer, threads)

    return decode


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
        return open_library(build())
    except (OSError, subprocess.SubprocessError, BuildError) as exc:
        log.warning("native CPU kernels unavailable, using torch ops: %s", exc)
        return None


def open_library(path: Path) -> NativeKernels:
    """A built kernel library with its argument types declared (tests open other ISA builds)."""
    lib = ctypes.CDLL(str(path))
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.li_forward_scratch.argtypes = [p, i64, i32]
    lib.li_forward_scratch.restype = i64
    lib.li_forward.argtypes = [p, p, i64, p, i64, p, p, p, p, p, i32]
    lib.li_forward.restype = i32
    lib.li_norm_linear.argtypes = [p, i64, i64, p, f32, p, p, i64, p, i32]
    lib.li_norm_linear.restype = None
    lib.li_linear.argtypes = [p, i64, i64, p, i64, p, p, i32]
    lib.li_linear.restype = None
    lib.li_dequant_rows.argtypes = [p, i64, p, i64, p]
    lib.li_dequant_rows.restype = None
    lib.li_dequant_matrix.argtypes = [p, i64, i64, p, i32]
    lib.li_dequant_matrix.restype = None
    lib.li_isa.argtypes = []
    lib.li_isa.restype = ctypes.c_int
    return NativeKernels(lib, path)
