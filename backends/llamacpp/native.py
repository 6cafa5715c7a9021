"""The llama-cpp-python low-level library, loaded once, with llama.cpp's log under our control.

llama.cpp prints hundreds of lines to stderr while loading a model. By default they are dropped,
except that code may listen for a while (:func:`listen`) to read llama.cpp's own figures (buffer
sizes, quantize progress, load errors) out of them. ``LOCALINFER_DEBUG=1`` passes everything
through to stderr as well.

:func:`weight_buffers` keeps model weights out of llama.cpp's AMX buffers: see there.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TypeVar

from localinfer.errors import BackendUnavailableError

INSTALL_HINT = "pip install 'localinfer[llamacpp]'"
AMX_ENV = "LOCALINFER_LLAMACPP_AMX"  # "1": let llama.cpp put weights in its AMX buffers anyway

# ggml_log_level in this llama.cpp: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues
# the previous message). (llama_cpp/_logger.py still documents an older numbering.)
LOG_ERROR = 4
LOG_CONT = 5
GGML_DEVICE_GPU, GGML_DEVICE_IGPU = 1, 2  # enum ggml_backend_dev_type

_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_:]*: ")

LogListener = Callable[[int, str], None]
P = TypeVar("P")

_lock = threading.Lock()
_lib: ModuleType | None = None
_mtmd: ModuleType | None = None
_callback: object = None  # the ctypes callback; kept referenced so it is never garbage-collected
_listeners: list[LogListener] = []
_last_level = 2


def _on_log(level: int, text: bytes, _user: object) -> None:
    global _last_level
    message = text.decode("utf-8", errors="replace") if text else ""
    if level == LOG_CONT:
        level = _last_level
    else:
        _last_level = level
    if os.environ.get("LOCALINFER_DEBUG"):
        sys.stderr.write(message)
    for listener in list(_listeners):
        listener(level, message)


def lib() -> ModuleType:
    """The ``llama_cpp`` module, initialised, with the log routed through :func:`_on_log`."""
    global _lib, _callback
    with _lock:
        if _lib is not None:
            return _lib
        try:
            import llama_cpp
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the llamacpp backend needs llama-cpp-python: {INSTALL_HINT} ({exc})"
            ) from exc
        llama_cpp.llama_backend_init()
        # Importing llama_cpp installs its own logger; ours replaces it for the whole process.
        _callback = llama_cpp.llama_log_callback(_on_log)
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
        _lib = llama_cpp
        return _lib


def mtmd() -> ModuleType:
    """llama-cpp-python's bindings of llama.cpp's multimodal library (libmtmd), its log (the
    projector's loader and encoder) routed like llama.cpp's own."""
    global _mtmd
    lib()  # first: the log callback it installs is the one passed on
    with _lock:
        if _mtmd is None:
            try:
                import llama_cpp.mtmd_cpp as mtmd_cpp
            except (ImportError, OSError) as exc:
                raise BackendUnavailableError(
                    f"this llama-cpp-python has no multimodal library (libmtmd): {exc}"
                ) from exc
            mtmd_cpp.mtmd_helper_log_set(_callback, ctypes.c_void_p(0))
            _mtmd = mtmd_cpp
        return _mtmd


def supports_gpu_offload() -> bool:
    """This llama-cpp-python build has a GPU backend (CUDA, Metal) that can hold layers."""
    llama = lib()
    if not llama.llama_supports_gpu_offload():
        return False
    # llama.cpp also says yes for a build whose only offload backend is RPC (its workers hold
    # layers as a GPU would): a GPU here means a GPU or integrated GPU device in ggml's registry.
    from llama_cpp import _ggml

    by_type = _ggml.libggml.ggml_backend_dev_by_type
    by_type.restype, by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    return bool(by_type(GGML_DEVICE_GPU) or by_type(GGML_DEVICE_IGPU))


def has_amx() -> bool:
    """Whether the loaded ggml CPU backend was compiled with its AMX kernels (x86 AMX_INT8)."""
    info = lib().llama_print_system_info()
    text = info.decode("utf-8", errors="replace") if info else ""
    return re.search(r"\bAMX_INT8 = 1\b", text) is not None


def weight_buffers(params: P) -> P:
    """``llama_model_params`` with llama.cpp's extra CPU weight buffers off where they hold AMX.

    With ``use_extra_bufts`` (the default) llama.cpp repacks Q4_0/Q4_1/Q8_0/K-quant weights into
    an AMX buffer whenever ggml was compiled with AMX (llama-cpp-python builds from source with
    ``-march=native``, so any AMX Xeon). Its AMX matmul, taken for every batch of 2+ rows, loads
    a tile configuration built on the stack with ``_tile_loadconfig``; GCC 12.2's intrinsic
    (``amxtileintrin.h``: an asm reading ``*(const void **)config``, 8 bytes) lets the compiler
    drop the stores of the tile rows and columns, so ``ldtilecfg`` gets garbage and faults: a
    segfault inside ``llama_decode`` on the first prompt, the high-level ``Llama`` included. The
    other extra buffers (repack) go with it: llama.cpp turns them on and off together. Plain CPU
    buffers run the same quantized types through ggml's own CPU dot products.
    ``LOCALINFER_LLAMACPP_AMX=1`` keeps them for a build known to be compiled right. Builds without
    ``use_extra_bufts`` (older than the field) are left as they are.
    """
    if hasattr(params, "use_extra_bufts") and has_amx() and os.environ.get(AMX_ENV) != "1":
        params.use_extra_bufts = False  # type: ignore[attr-defined]
    return params


def model_meta(llama: ModuleType, model: object, key: str) -> str | None:
    """A GGUF metadata value of the loaded ``model`` as llama.cpp read it, or None when absent."""
    buf = ctypes.create_string_buffer(512)
    n = llama.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


@contextmanager
def listen(listener: LogListener) -> Iterator[None]:
    """Call ``listener(level, text)`` for every llama.cpp log message inside the block."""
    lib()
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


class LogCapture:
    """Collects log messages; CONT fragments are glued onto the line they continue."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self._open = False  # the last message did not end with a newline

    def __call__(self, level: int, text: str) -> None:
        # llama.cpp builds some lines from several messages of one level; a message of another
        # level (an error after "type = q4_1, ") starts a line of its own.
        if self._open and self.lines and self.lines[-1][0] == level:
            self.lines[-1] = (level, self.lines[-1][1] + text)
        else:
            self.lines.append((level, text))
        self._open = not text.endswith("\n")

    def errors(self) -> list[str]:
        """Error messages without llama.cpp's ``function_name: `` prefix, first first."""
        out = []
        for level, text in self.lines:
            if level == LOG_ERROR and text.strip():
                out.append(_PREFIX_RE.sub("", text.strip(), count=1))
        return out

    def text(self) -> str:
        return "".join(t for _, t in self.lines)
