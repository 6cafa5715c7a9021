"""llama.cpp's RPC protocol on the wire, as far as localinfer's relays and queries need it.

The vendored llama.cpp's ggml-rpc (ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.x) frames every
request as ``command (1 byte) | size (8 bytes, little-endian) | payload`` and every reply, for the
commands that have one, as ``size (8) | payload``. A connection starts with HELLO, whose reply
carries the server's protocol version and its transport capabilities (RDMA: all zero here, so
the connection stays plain TCP). The server serves one connection at a time.

Framework-free: plain sockets. The relays (rpc_relay.py) read requests and replies with
:func:`read_request` and :func:`reply_size`; `budget --rpc` asks a worker's memory with
:func:`device_memory`.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

# enum rpc_cmd (ggml-rpc.cpp)
ALLOC_BUFFER = 0
GET_ALIGNMENT = 1
GET_MAX_SIZE = 2
BUFFER_GET_BASE = 3
FREE_BUFFER = 4
BUFFER_CLEAR = 5
SET_TENSOR = 6
SET_TENSOR_HASH = 7
GET_TENSOR = 8
COPY_TENSOR = 9
GRAPH_COMPUTE = 10
GET_DEVICE_MEMORY = 11
INIT_TENSOR = 12
GET_ALLOC_SIZE = 13
HELLO = 14
DEVICE_COUNT = 15
GRAPH_RECOMPUTE = 16
MEMSET_TENSOR = 17
COMMANDS = 18  # RPC_CMD_NONE and beyond are never sent

CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: transport capabilities in HELLO
HELLO_REQUEST = bytes(CAPS_SIZE)  # no RDMA
HELLO_REPLY_SIZE = 4 + CAPS_SIZE  # major, minor, patch, padding, caps
PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION of the vendored llama.cpp

# The reply's size for the commands that have one and whose size is fixed; GET_TENSOR's is the
# size its request asks for. The others (FREE_BUFFER, SET_TENSOR, GRAPH_COMPUTE, ...) have none.
FIXED_REPLY = {
    ALLOC_BUFFER: 16,  # remote_ptr, remote_size
    GET_ALIGNMENT: 8,
    GET_MAX_SIZE: 8,
    BUFFER_GET_BASE: 8,
    SET_TENSOR_HASH: 1,
    COPY_TENSOR: 1,
    GET_DEVICE_MEMORY: 16,  # free, total
    GET_ALLOC_SIZE: 8,
    HELLO: HELLO_REPLY_SIZE,
    DEVICE_COUNT: 4,
}
# Requests whose payload can be large (weights, graphs): relayed in pieces, never parsed.
STREAMED = frozenset({SET_TENSOR, GRAPH_COMPUTE})
CHUNK = 1 << 20

_HEADER = struct.Struct("<BQ")
_SIZE = struct.Struct("<Q")


class WireError(ConnectionError):
    """The peer closed the connection, or sent what the protocol does not allow."""


@dataclass(frozen=True, slots=True)
class Hello:
    major: int
    minor: int
    patch: int

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def reply(self) -> bytes:
        """This version's HELLO reply with no transport capabilities (plain TCP)."""
        return bytes((self.major, self.minor, self.patch, 0)) + bytes(CAPS_SIZE)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes; WireError when the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise WireError("connection closed")
        got += k
    return bytes(buf)


def read_header(sock: socket.socket) -> tuple[int, int] | None:
    """A request's command and payload size; None when the peer closed between requests."""
    first = sock.recv(1)
    if not first:
        return None
    rest = recv_exact(sock, _HEADER.size - 1)
    cmd, size = _HEADER.unpack(first + rest)
    if cmd >= COMMANDS:
        raise WireError(f"unknown RPC command {cmd}")
    return cmd, size


def header(cmd: int, size: int) -> bytes:
    return _HEADER.pack(cmd, size)


def size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)


def read_size(sock: socket.socket) -> int:
    return int(_SIZE.unpack(recv_exact(sock, _SIZE.size))[0])


def reply_size(cmd: int, payload: bytes) -> int | None:
    """The size of ``cmd``'s reply (None: it has none). GET_TENSOR's request ends with the
    size it asks for."""
    if cmd == GET_TENSOR:
        return int(_SIZE.unpack(payload[-_SIZE.size :])[0])
    return FIXED_REPLY.get(cmd)


def relay_payload(src: socket.socket, dst: socket.socket, size: int) -> None:
    """Copy ``size`` bytes from ``src`` to ``dst`` in pieces of at most CHUNK."""
    buf = bytearray(min(size, CHUNK))
    view = memoryview(buf)
    left = size
    while left:
        k = src.recv_into(view, min(left, len(buf)))
        if k == 0:
            raise WireError("connection closed")
        dst.sendall(view[:k])
        left -= k


def discard(sock: socket.socket, size: int) -> None:
    """Read and drop ``size`` bytes."""
    buf = bytearray(min(size, CHUNK))
    left = size
    while left:
        k = sock.recv_into(buf, min(left, len(buf)))
        if k == 0:
            raise WireError("connection closed")
        left -= k


def call(sock: socket.socket, cmd: int, payload: bytes = b"") -> bytes:
    """Send one request and read its reply (for commands that have one)."""
    sock.sendall(header(cmd, len(payload)) + payload)
    size = read_size(sock)
    expected = reply_size(cmd, payload)
    if expected is not None and size != expected:
        raise WireError(f"RPC command {cmd}: a {size}-byte reply, {expected} expected")
    return recv_exact(sock, size)


def hello(sock: socket.socket) -> Hello:
    """The HELLO exchange that opens a connection; WireError for another protocol major."""
    reply = call(sock, HELLO, HELLO_REQUEST)
    found = Hello(reply[0], reply[1], reply[2])
    if found.major != PROTOCOL_MAJOR:
        raise WireError(
            f"llama.cpp RPC protocol {found.version}; this build speaks {PROTOCOL_MAJOR}.x"
        )
    return found


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection with Nagle off (each request is written whole and waited on)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@dataclass(frozen=True, slots=True)
class WorkerMemory:
    endpoint: str
    version: str
    devices: tuple[tuple[int, int], ...]  # (free, total) bytes per device

    @property
    def free(self) -> int:
        return sum(free for free, _ in self.devices)

    @property
    def total(self) -> int:
        return sum(total for _, total in self.devices)


def device_memory(endpoint: str, timeout: float = 5.0) -> WorkerMemory:
    """Ask the RPC server at ``endpoint`` (HOST:PORT) for each device's free and total memory.
    OSError (refused, unreachable, timed out) or WireError when it cannot say."""
    host, port = split_endpoint(endpoint)
    with connect(host, port, timeout) as sock:
        version = hello(sock)
        (count,) = struct.unpack("<I", call(sock, DEVICE_COUNT))
        devices = []
        for device in range(count):
            free, total = struct.unpack(
                "<QQ", call(sock, GET_DEVICE_MEMORY, struct.pack("<I", device))
            )
            devices.append((int(free), int(total)))
    return WorkerMemory(endpoint, version.version, tuple(devices))


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); ValueError when malformed."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"'{endpoint}' is not HOST:PORT")
    return host.strip("[]"), int(port)
