"""ggml's RPC backend through ctypes: start a server on a device, register a client's servers.

Built with ``GGML_RPC=ON`` (scripts/_env.sh builds llama-cpp-python so), libggml registers a
backend named "RPC" whose two entry points are found through its registry, as llama.cpp's own
rpc-server finds them: ``ggml_backend_rpc_start_server`` (blocks, serving one client at a time)
and ``ggml_backend_rpc_add_server`` (a client's registry of one server's devices). A build
without it has no such backend: :func:`rpc_functions` says how to rebuild.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from localinfer.backends.llamacpp import native
from localinfer.errors import BackendUnavailableError

NO_RPC = (
    "this llama-cpp-python was built without llama.cpp's RPC backend; rebuild it with "
    'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python (scripts/_env.sh builds it so)"
)
CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU

_START = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_void_p),
)  # fmt: skip
_ADD = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)


@dataclass(frozen=True)
class RpcFunctions:
    lib: Any  # libggml (ctypes.CDLL)
    start_server: Any  # (endpoint, cache_dir, n_threads, n_devices, devices) -> None
    add_server: Any  # (endpoint) -> ggml_backend_reg_t

    def cpu_device(self) -> int:
        device = self.lib.ggml_backend_dev_by_type(CPU_DEVICE)
        if not device:
            raise BackendUnavailableError("ggml has no CPU device")
        return int(device)

    def server_devices(self, endpoint: str) -> list[int]:
        """The devices of the RPC server at ``endpoint`` (a connection to it is made now)."""
        reg = self.add_server(endpoint.encode())
        if not reg:
            raise BackendUnavailableError(f"the llama.cpp RPC server at {endpoint} has no device")
        count = self.lib.ggml_backend_reg_dev_count(reg)
        return [int(self.lib.ggml_backend_reg_dev_get(reg, i)) for i in range(count)]


def supported() -> bool:
    """Whether the loaded llama.cpp has the RPC backend."""
    try:
        rpc_functions()
    except BackendUnavailableError:
        return False
    return True


@functools.cache
def rpc_functions() -> RpcFunctions:
    llama = native.lib()  # initialises the backends and routes llama.cpp's log
    if not llama.llama_supports_rpc():
        raise BackendUnavailableError(NO_RPC)
    from llama_cpp import _ggml

    lib = _ggml.libggml
    _declare(lib)
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    start = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server")
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not (reg and start and add):
        raise BackendUnavailableError(NO_RPC)
    return RpcFunctions(lib, _START(start), _ADD(add))


def _declare(lib: Any) -> None:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    signatures = {
        "ggml_backend_reg_by_name": (vp, [ctypes.c_char_p]),
        "ggml_backend_reg_get_proc_address": (vp, [vp, ctypes.c_char_p]),
        "ggml_backend_reg_dev_count": (sz, [vp]),
        "ggml_backend_reg_dev_get": (vp, [vp, sz]),
        "ggml_backend_dev_by_type": (vp, [ctypes.c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
