"""The split across machines without llama.cpp's RPC backend: the node plan (layers placed as
llama.cpp places them, per-node figures summing to the single-machine budget's), `budget
--nodes` offline, the relays' allow-list, memory cap and stand-in replies against a fake RPC
server in Python, and a worker that does not answer."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading

import pytest

from localinfer.backend_budget import compute_budget
from localinfer.backends.llamacpp import rpc_wire as wire
from localinfer.backends.llamacpp.profile import PROFILE
from localinfer.backends.llamacpp.rpc_relay import (
    MemoryLedger,
    Relay,
    RelayConfig,
    allowed,
    parse_allow,
)
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.model_facts import model_facts
from localinfer.budget.nodes import NodeSpec, place_layers, plan_nodes
from localinfer.errors import BackendUnavailableError, InvalidParameterError
from localinfer.facts.kv_dtype import kv_dtype
from localinfer.loading import embedded_model_path
from localinfer.resolve import resolve_model
from localinfer.rpc_nodes import node_budget, parse_workers
from tests.test_server_support import wait_until

pytestmark = pytest.mark.usefixtures("session_cache")
GiB = 2**30


def test_layers_go_where_llama_cpps_rule_puts_them() -> None:
    # 30 layers + output, a third each: the first 10 stay, llama.cpp gets n_gpu_layers 21.
    gpu_layers, split, owners = place_layers(30, [1, 1, 1])
    assert gpu_layers == 21 and split == [1.0, 1.0]
    assert owners == [0] * 10 + [1] * 11 + [2] * 10  # layer 30 is the output: the last worker
    # Memory-proportional: a worker with twice the memory takes about twice the layers.
    gpu_layers, _, owners = place_layers(30, [4 * GiB, 8 * GiB])
    assert owners.count(0) == 10 and owners.count(1) == 21 and gpu_layers == 21
    with pytest.raises(InvalidParameterError):
        place_layers(30, [1, 0])


def test_node_figures_add_up_to_the_single_machine_budget() -> None:
    path = str(embedded_model_path())
    facts = model_facts(resolve_model(path))
    whole = compute_budget(BudgetRequest(path, 2048, 2, backend="llamacpp", device="cpu"))
    nodes = [NodeSpec("here", 4 * GiB), NodeSpec("a", 2 * GiB), NodeSpec("b", 2 * GiB)]
    plan = plan_nodes(facts, PROFILE, whole.weights_bytes, 2048, 2, kv_dtype("f16"), nodes)
    assert sum(n.kv_cache_bytes for n in plan.nodes) == whole.kv_cache_bytes
    # A tied model: the worker with the output holds a copy of the embedding table.
    table = next(t.nbytes for t in facts.header.tensors if t.name == "token_embd.weight")
    assert sum(n.weights_bytes for n in plan.nodes) == whole.weights_bytes + table
    assert sum(n.layers for n in plan.nodes) == 30 and plan.nodes[-1].output and plan.fits
    assert plan.hops == 2 and plan.round_trips == 2  # here -> a -> b, logits back from b
    assert plan.bytes_per_token >= 2 * 576 * 4 + 49152 * 4


def budget_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "localinfer", "budget", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_budget_nodes_plans_offline_and_says_which_machine_is_over() -> None:
    done = budget_cli("qwen3-8b", "--ctx", "8k", "--nodes", "8GiB,6GiB", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [n["name"] for n in plan["nodes"]] == ["this machine", "node 2"]
    assert sum(n["layers"] for n in plan["nodes"]) == 36 and plan["fits"]
    assert all(n["total_bytes"] <= n["available_bytes"] for n in plan["nodes"])
    over = budget_cli("qwen3-8b", "--ctx", "8k", "--nodes", "2GiB,2GiB")
    assert over.returncode == 3 and "does not fit" in over.stdout
    assert "link per token" in over.stdout
    bad = budget_cli("qwen3-8b", "--nodes", "8GiB,6GiB", "--tensor-split", "1,1,1")
    assert bad.returncode == 1 and "3 shares for 2 nodes" in bad.stderr


def test_a_worker_that_does_not_answer_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(BackendUnavailableError, match=f"127.0.0.1:{port}"):
        node_budget(BudgetRequest(str(embedded_model_path())), (f"127.0.0.1:{port}",))
    with pytest.raises(InvalidParameterError):
        parse_workers("127.0.0.1")
    with pytest.raises(InvalidParameterError, match="twice"):
        parse_workers("a:1,a:1")


def test_allow_lists_take_addresses_and_networks() -> None:
    nets = parse_allow("10.0.0.5, 192.168.1.0/24,::1")
    assert allowed("10.0.0.5", nets) and allowed("192.168.1.77", nets) and allowed("::1", nets)
    assert allowed("::ffff:10.0.0.5", nets) and not allowed("10.0.0.6", nets)
    assert allowed("203.0.113.9", None)
    with pytest.raises(ValueError, match="not an IP"):
        parse_allow("10.0.0.300")


class FakeServer:
    """A ggml RPC server in a thread, as far as these tests need one: HELLO, alignment, memory,
    buffers and tensor reads; ``die_on`` closes the connection when that command arrives."""

    def __init__(self, die_on: int | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.die_on = die_on
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError, wire.WireError):
                self._client(conn)

    @staticmethod
    def _reply(cmd: int, payload: bytes) -> bytes | None:
        if cmd == wire.HELLO:
            return bytes((7, 0, 0, 0)) + bytes(24)
        if cmd == wire.GET_ALIGNMENT:
            return struct.pack("<Q", 64)
        if cmd == wire.ALLOC_BUFFER:
            return struct.pack("<QQ", 0x1000, struct.unpack("<IQ", payload)[1])
        if cmd == wire.GET_TENSOR:
            return b"\x07" * struct.unpack("<Q", payload[-8:])[0]
        return None

    def _client(self, conn: socket.socket) -> None:
        while (head := wire.read_header(conn)) is not None:
            cmd, size = head
            payload = wire.recv_exact(conn, size)
            if cmd == self.die_on:
                return
            reply = self._reply(cmd, payload)
            if reply is not None:
                conn.sendall(wire.size_prefix(len(reply)) + reply)


def _relay(server: FakeServer, **config: object) -> Relay:
    settings = RelayConfig(("127.0.0.1", server.port), "worker-x:1", **config)  # type: ignore[arg-type]
    return Relay("127.0.0.1", 0, settings, wire.Hello(7, 0, 0)).start()


def test_a_guard_stands_in_for_a_worker_that_went_away() -> None:
    server = FakeServer(die_on=wire.GET_TENSOR)
    relay = _relay(server, guard=True, timeout=10.0)
    try:
        with wire.connect("127.0.0.1", relay.address[1], 5.0) as sock:
            wire.hello(sock)
            assert wire.call(sock, wire.GET_ALIGNMENT, struct.pack("<I", 0)) == struct.pack(
                "<Q", 64
            )
            request = bytes(16) + struct.pack("<Q", 1000)  # a tensor, an offset, 1000 bytes
            assert wire.call(sock, wire.GET_TENSOR, request) == bytes(1000)  # stood in
            assert relay.failure is not None and "worker-x:1 stopped answering" in relay.failure
            # Later requests never reach the network: remembered or stand-in replies.
            assert wire.call(sock, wire.GET_ALIGNMENT, struct.pack("<I", 0)) == struct.pack(
                "<Q", 64
            )
            assert wire.call(sock, wire.BUFFER_GET_BASE, bytes(8)) != bytes(8)
            sock.sendall(wire.header(wire.GRAPH_COMPUTE, 3) + b"abc")  # no reply, read through
            assert wire.call(sock, wire.DEVICE_COUNT) == struct.pack("<I", 1)
    finally:
        relay.close()


def test_a_worker_relay_refuses_peers_and_allocations_past_its_cap() -> None:
    server = FakeServer()
    ledger = MemoryLedger(lambda: (10 * GiB, 16 * GiB), cap=1000)
    lines: list[str] = []
    relay = _relay(server, ledger=ledger)
    relay._log = lines.append
    try:
        with wire.connect("127.0.0.1", relay.address[1], 5.0) as sock:
            wire.hello(sock)
            assert struct.unpack("<QQ", wire.call(sock, wire.GET_DEVICE_MEMORY, bytes(4))) == (
                1000,
                1000,
            )
            ptr, size = struct.unpack(
                "<QQ", wire.call(sock, wire.ALLOC_BUFFER, struct.pack("<IQ", 0, 600))
            )
            assert ptr and size == 600 and ledger.used == 600
            refused = wire.call(sock, wire.ALLOC_BUFFER, struct.pack("<IQ", 0, 600))
            assert refused == bytes(16) and any("past --mem" in line for line in lines)
            assert struct.unpack("<QQ", wire.call(sock, wire.GET_DEVICE_MEMORY, bytes(4)))[0] == 400
        # ggml's server frees a client's buffers when it leaves: so does the ledger.
        wait_until(lambda: ledger.used == 0, timeout=30, what="the buffers released")
    finally:
        relay.close()
    closed = _relay(server, allow=parse_allow("192.0.2.1"))
    closed._log = lines.append
    try:
        with (
            pytest.raises((ConnectionError, OSError)),
            wire.connect("127.0.0.1", closed.address[1], 5.0) as sock,
        ):
            wire.hello(sock)
        assert any("refused 127.0.0.1" in line for line in lines)
    finally:
        closed.close()
