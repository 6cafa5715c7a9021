"""A llama.cpp runner's link to its RPC workers: each reached through a guard relay on
127.0.0.1 (rpc_relay.py), its devices given to llama.cpp as the model's offload devices.

llama.cpp places layers as it does on GPUs (llama-model.cpp ``load_tensors``): the first
``n_layer + 1 - n_gpu_layers`` repeating layers and the token embeddings stay on this machine's
CPU, the rest (and the output layer) go to the workers in the proportions of ``tensor_split``.
localinfer sizes both from the budget's node plan (budget/nodes.py).

A worker that cannot be reached is an error before anything loads; one that goes away later
turns its guard into a stand-in and the next :meth:`RpcLink.check` raises
:class:`RpcWorkerLost` naming it: the answer in flight ends with that error and every later
decode fails at once, without waiting on the network.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence
from typing import Any

from localinfer.backends.llamacpp import rpc_wire as wire
from localinfer.backends.llamacpp.native import supports_gpu_offload
from localinfer.backends.llamacpp.offload import gpu_layer_count
from localinfer.backends.llamacpp.rpc_ggml import rpc_functions
from localinfer.backends.llamacpp.rpc_relay import Relay, RelayConfig
from localinfer.errors import BackendUnavailableError, InvalidParameterError

CONNECT_TIMEOUT = 5.0
TIMEOUT_ENV = "LOCALINFER_RPC_TIMEOUT"  # seconds a worker may take to reply (default 300)
LLAMA_SPLIT_MODE_LAYER = 1


class RpcWorkerLost(BackendUnavailableError):
    """A worker holding part of the model stopped answering."""


def reach(endpoint: str, timeout: float = CONNECT_TIMEOUT) -> wire.Hello:
    """The worker's HELLO; BackendUnavailableError naming it when it does not answer."""
    try:
        host, port = wire.split_endpoint(endpoint)
    except ValueError as exc:
        raise InvalidParameterError(f"--rpc: {exc}") from None
    try:
        with contextlib.closing(wire.connect(host, port, timeout)) as sock:
            return wire.hello(sock)
    except (OSError, wire.WireError) as exc:
        raise BackendUnavailableError(
            f"the llama.cpp RPC worker {endpoint} is not reachable ({exc}); start it there with "
            f"`localinfer worker --host ADDRESS --port {port}`"
        ) from None


class RpcLink:
    def __init__(self, endpoints: Sequence[str]) -> None:
        self._rpc = rpc_functions()
        timeout = float(os.environ.get(TIMEOUT_ENV) or 300)
        self.relays: list[Relay] = []
        self.devices: list[int] = []
        self._keep: list[Any] = []
        try:
            for endpoint in endpoints:
                hello = reach(endpoint)
                config = RelayConfig(wire.split_endpoint(endpoint), endpoint, guard=True,
                                     timeout=timeout)  # fmt: skip
                relay = Relay("127.0.0.1", 0, config, hello).start()
                self.relays.append(relay)
                self.devices += self._rpc.server_devices(relay.endpoint)
        except BaseException:
            self.close()
            raise

    def configure(self, params: Any, layers: int | None, split: Sequence[float]) -> None:
        """``llama_model_params`` loading onto the workers: ``layers`` of them there (n_gpu_layers;
        None: all), split between the workers' devices as ``split`` (empty: by their memory)."""
        import llama_cpp

        devices = (ctypes.c_void_p * (len(self.devices) + 1))(*self.devices, None)
        slots = max(len(split), int(llama_cpp.llama_max_devices()))
        shares = (ctypes.c_float * slots)(*split)
        self._keep += [devices, shares]  # llama.cpp reads both while it loads
        params.devices = ctypes.cast(devices, ctypes.c_void_p).value
        params.split_mode = LLAMA_SPLIT_MODE_LAYER
        params.n_gpu_layers = -1 if layers is None else layers
        if split:
            params.tensor_split = ctypes.cast(shares, ctypes.POINTER(ctypes.c_float))

    @property
    def failure(self) -> str | None:
        return next((r.failure for r in self.relays if r.failure is not None), None)

    def check(self) -> None:
        """RpcWorkerLost when a worker has gone (the guard has stood in for it since)."""
        failure = self.failure
        if failure is not None:
            raise RpcWorkerLost(
                f"{failure}; the model split across it cannot answer until the worker is back "
                "and the model is loaded again (a worker serves one loaded model at a time)"
            )

    def close(self) -> None:
        for relay in self.relays:
            relay.close()


def offload_params(params: Any, config: Any, llama: Any) -> RpcLink | None:
    """Where ``llama_model_params`` put the layers for a runner built as ``config``: on its
    GPU (offload.py), or on its RPC workers (then the link to them, which the runner keeps)."""
    if not config.rpc:
        offload = supports_gpu_offload()
        params.n_gpu_layers = gpu_layer_count(config.device, config.gpu_layers, offload)
        return None
    link = RpcLink(config.rpc)
    link.configure(params, config.gpu_layers, config.rpc_split)
    return link


def decode_checked(llama: Any, ctx: Any, batch: Any, link: RpcLink | None) -> int:
    """``llama_decode``, then RpcWorkerLost if a worker went away meanwhile (its stand-in
    replies made the call return; its results are not the model's)."""
    rc = int(llama.llama_decode(ctx, batch))
    if link is not None:
        link.check()
    return rc


def close_link(link: RpcLink | None) -> None:
    if link is not None:
        link.close()
