"""A TCP relay that reads llama.cpp's RPC protocol as it passes (rpc_wire.py), on either side.

llama.cpp's RPC server has no authentication and its client aborts the whole process
(GGML_ABORT) when a server stops answering. Both are handled here, in front of llama.cpp:

- **worker side** (``localinfer worker``): ggml's server listens on 127.0.0.1 on a port of its
  own; this relay listens on the address the user gave and refuses any peer not in ``--allow``
  before reading a byte. It answers the memory questions itself (HELLO, DEVICE_COUNT,
  GET_DEVICE_MEMORY: the machine's available RAM, within ``--mem``), so a budget can ask while
  the server serves a runner (it serves one connection at a time), and refuses an allocation
  past ``--mem`` as a full device would (a null buffer: llama.cpp's load then fails cleanly).
- **runner side** (the guard): each worker is reached through a relay on 127.0.0.1. When the
  worker goes away (connection reset or closed, or no reply within the timeout) the relay
  records why and from then on answers llama.cpp itself with stand-in replies of the right
  sizes, so llama.cpp never blocks or aborts; the runner reads ``failure`` after every decode
  and ends the answer with an error that names the worker (rpc_link.py).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.backends.llamacpp import rpc_wire as wire

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
STAND_IN = {  # replies llama.cpp must not get as zeros (it asserts a buffer base is set)
    wire.BUFFER_GET_BASE: struct.pack("<Q", 4096),
    wire.GET_ALIGNMENT: struct.pack("<Q", 32),
    wire.GET_MAX_SIZE: struct.pack("<Q", 1 << 62),
    wire.DEVICE_COUNT: struct.pack("<I", 1),
}
UPSTREAM_WAIT_S = 10.0  # a second client waits this long for ggml's server to be free
CACHED = frozenset({wire.GET_ALIGNMENT, wire.GET_MAX_SIZE, wire.DEVICE_COUNT})


class UpstreamLost(Exception):
    """The relay's upstream (the worker, or ggml's server) failed; the message says how."""


class MemoryLedger:
    """What the worker's server holds for its clients, against the machine's RAM and ``cap``."""

    def __init__(self, available: Callable[[], tuple[int, int]], cap: int | None) -> None:
        self._available = available  # (available, total) bytes of this machine now
        self.cap = cap
        self.used = 0
        self._lock = threading.Lock()

    def fits(self, size: int) -> bool:
        return self.cap is None or self.used + size <= self.cap

    def add(self, size: int) -> None:
        with self._lock:
            self.used += size

    def release(self, size: int) -> None:
        with self._lock:
            self.used = max(0, self.used - size)

    def memory(self) -> tuple[int, int]:
        """(free, total) as the worker reports them: RAM available now, within the cap."""
        free, total = self._available()
        if self.cap is None:
            return free, total
        with self._lock:
            return min(free, max(0, self.cap - self.used)), min(total, self.cap)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    upstream: tuple[str, int]
    label: str  # the worker's address as the user wrote it, for messages
    allow: tuple[Network, ...] | None = None  # None: any peer
    ledger: MemoryLedger | None = None  # worker side: memory answered here, within its cap
    guard: bool = False  # runner side: stand-in replies once the worker is gone
    timeout: float | None = None  # seconds a reply may take before the worker counts as gone


def parse_allow(text: str | None) -> tuple[Network, ...] | None:
    """``--allow 10.0.0.5,192.168.1.0/24`` as networks; ValueError naming a bad entry."""
    if not text:
        return None
    nets = []
    for item in (part.strip() for part in text.split(",")):
        if item:
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"--allow: '{item}' is not an IP address or network") from None
    return tuple(nets)


def allowed(peer: str, allow: tuple[Network, ...] | None) -> bool:
    if allow is None:
        return True
    address = ipaddress.ip_address(peer.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in allow)


class Relay:
    """Listens on (host, port) and relays each accepted connection to ``config.upstream``."""

    def __init__(
        self,
        host: str,
        port: int,
        config: RelayConfig,
        hello: wire.Hello,
        log: Callable[[str], None] | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = socket.create_server((host, port), family=family, backlog=16)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self.config = config
        self.hello = hello
        self.failure: str | None = None  # guard side: why the worker counts as gone
        self._log = log or (lambda _line: None)
        self._cache: dict[int, bytes] = {}
        self._upstream_lock = threading.Lock()  # worker side: ggml's server takes one client
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="li-rpc-relay", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def start(self) -> Relay:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        for sock in list(self._open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    # -- accepting --------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, peer = self._server.accept()
            except OSError:
                return
            if not allowed(peer[0], self.config.allow):
                self._log(f"refused {peer[0]}: not in --allow")
                client.close()
                continue
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._open.add(client)
            name = f"li-rpc-{peer[0]}:{peer[1]}"
            threading.Thread(
                target=self._serve, args=(client, peer), name=name, daemon=True
            ).start()

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        session = _Session(self, client)
        try:
            session.run()
        except (OSError, wire.WireError):
            pass  # the client went away: nothing to answer
        finally:
            session.end()
            self._open.discard(client)
            with contextlib.suppress(OSError):
                client.close()

    # -- what the sessions share ------------------------------------------------------------

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = f"the llama.cpp RPC worker {self.config.label} {reason}"
            self._log(self.failure)

    def stand_in(self, cmd: int, payload: bytes) -> bytes | None:
        """A reply of the right size for ``cmd`` when the worker is gone (None: it has none)."""
        size = wire.reply_size(cmd, payload)
        if size is None:
            return None
        if cmd == wire.HELLO:
            return self.hello.reply()
        if cmd == wire.GET_DEVICE_MEMORY:
            return bytes(16)
        cached = self._cache.get(cmd, STAND_IN.get(cmd))
        return cached if cached is not None and len(cached) == size else bytes(size)

    def remember(self, cmd: int, reply: bytes) -> None:
        if cmd in CACHED:
            self._cache[cmd] = reply


class _Session:
    """One client connection: its requests, relayed or answered, and its upstream."""

    def __init__(self, relay: Relay, client: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.upstream: socket.socket | None = None
        self.buffers: dict[int, int] = {}  # remote_ptr -> size (worker side, for the ledger)
        self.holds_server = False

    def run(self) -> None:
        relay, client = self.relay, self.client
        while (head := wire.read_header(client)) is not None:
            cmd, size = head
            if relay.config.guard and relay.failure is not None:
                self._answer_stand_in(cmd, size)
                continue
            if cmd in wire.STREAMED:
                self._forward_streamed(cmd, size)
                continue
            payload = wire.recv_exact(client, size)
            local = self._local(cmd, payload)
            if local is not None:
                client.sendall(wire.size_prefix(len(local)) + local)
                continue
            try:
                self._forward(cmd, payload)
            except UpstreamLost as exc:
                if not relay.config.guard:
                    raise OSError(str(exc)) from None  # worker side: drop the client
                relay.fail(str(exc))
                reply = relay.stand_in(cmd, payload)
                if reply is not None:
                    client.sendall(wire.size_prefix(len(reply)) + reply)

    def end(self) -> None:
        ledger = self.relay.config.ledger
        if ledger is not None:  # ggml's server frees a client's buffers when it leaves
            for size in self.buffers.values():
                ledger.release(size)
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.close()
        if self.holds_server:
            self.relay._upstream_lock.release()

    # -- answered here ----------------------------------------------------------------------

    def _local(self, cmd: int, payload: bytes) -> bytes | None:
        relay = self.relay
        if cmd == wire.HELLO:
            return relay.hello.reply()
        ledger = relay.config.ledger
        if ledger is None:
            return None
        if cmd == wire.DEVICE_COUNT:
            return struct.pack("<I", 1)
        if cmd == wire.GET_DEVICE_MEMORY:
            return struct.pack("<QQ", *ledger.memory())
        if cmd == wire.ALLOC_BUFFER and ledger.cap is not None:
            (_device, size) = struct.unpack("<IQ", payload)
            if not ledger.fits(size):
                relay._log(f"refused a {size >> 20} MiB buffer: past --mem")
                return bytes(16)  # a null buffer: llama.cpp reports the allocation failed
        return None

    def _answer_stand_in(self, cmd: int, size: int) -> None:
        if cmd in wire.STREAMED:
            wire.discard(self.client, size)
            return
        payload = wire.recv_exact(self.client, size)
        reply = self.relay.stand_in(cmd, payload)
        if reply is not None:
            self.client.sendall(wire.size_prefix(len(reply)) + reply)

    # -- relayed ----------------------------------------------------------------------------

    def _up(self) -> socket.socket:
        if self.upstream is not None:
            return self.upstream
        config = self.relay.config
        if config.ledger is not None:
            # A client that just left (a budget's memory question before the load) may still
            # be closing on its relay thread: wait for it a little before calling it busy.
            if not self.relay._upstream_lock.acquire(timeout=UPSTREAM_WAIT_S):
                raise UpstreamLost("is serving another client (one at a time)")
            self.holds_server = True
        host, port = config.upstream
        try:
            sock = wire.connect(host, port, timeout=config.timeout or 10.0)
            sock.settimeout(config.timeout)
            _keepalive(sock)
            wire.hello(sock)
        except (OSError, wire.WireError) as exc:
            raise UpstreamLost(f"is not reachable ({_reason(exc)})") from None
        self.upstream = sock
        return sock

    def _forward(self, cmd: int, payload: bytes) -> None:
        up = self._up()
        try:
            up.sendall(wire.header(cmd, len(payload)) + payload)
            expected = wire.reply_size(cmd, payload)
            if expected is None:
                self._account(cmd, payload, b"")
                return
            size = wire.read_size(up)
            if size != expected:
                raise wire.WireError(f"a {size}-byte reply to command {cmd}, {expected} expected")
            if size > wire.CHUNK:
                self.client.sendall(wire.size_prefix(size))
                wire.relay_payload(up, self.client, size)
                return
            reply = wire.recv_exact(up, size)
        except (OSError, wire.WireError) as exc:
            raise UpstreamLost(f"stopped answering ({_reason(exc)})") from None
        self._account(cmd, payload, reply)
        self.relay.remember(cmd, reply)
        self.client.sendall(wire.size_prefix(size) + reply)

    def _forward_streamed(self, cmd: int, size: int) -> None:
        """A large request (weights, a graph): relayed in pieces; when the worker fails
        midway, the rest is still read from the client so the stream stays in step."""
        try:
            up = self._up()
            up.sendall(wire.header(cmd, size))
        except (UpstreamLost, OSError) as exc:
            self._lost_midway(exc, size)
            return
        buf = bytearray(min(size, wire.CHUNK))
        view, left = memoryview(buf), size
        while left:
            k = self.client.recv_into(view, min(left, len(buf)))
            if k == 0:
                raise wire.WireError("connection closed")
            left -= k
            try:
                up.sendall(view[:k])
            except OSError as exc:
                self._lost_midway(UpstreamLost(f"stopped answering ({_reason(exc)})"), left)
                return

    def _lost_midway(self, exc: Exception, left: int) -> None:
        if not self.relay.config.guard:
            raise OSError(str(exc))
        message = str(exc) if isinstance(exc, UpstreamLost) else f"stopped answering ({exc})"
        self.relay.fail(message)
        wire.discard(self.client, left)

    def _account(self, cmd: int, payload: bytes, reply: bytes) -> None:
        ledger = self.relay.config.ledger
        if ledger is None:
            return
        if cmd == wire.ALLOC_BUFFER:
            ptr, size = struct.unpack("<QQ", reply)
            if ptr:
                ledger.add(size)
                self.buffers[ptr] = size
        elif cmd == wire.FREE_BUFFER:
            (ptr,) = struct.unpack("<Q", payload)
            ledger.release(self.buffers.pop(ptr, 0))


def _keepalive(sock: socket.socket) -> None:
    """Probe an idle connection so a worker whose machine vanished is found in ~30 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no reply in time"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or type(exc).__name__
