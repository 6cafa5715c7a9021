"""A model split across `localinfer worker`s on loopback by llama.cpp's RPC backend: greedy
tokens equal to the unsplit run (the embedded model, a random 4-layer one, through serve), each
worker's memory as the budget's node plan says, a worker killed mid-answer, the allow-list and
the memory cap. Skipped where llama-cpp-python lacks the RPC backend (tests/rpc_workers.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.budget.compute import BudgetRequest
from localinfer.engine import Request, SamplingParams
from localinfer.errors import LocalinferError, OutOfMemoryBudgetError
from localinfer.loading import embedded_model_path, load_model
from localinfer.rpc_nodes import RpcOptions, node_budget, rpc_worker_memory
from tests.rpc_workers import require_rpc, start_worker, workers

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("session_cache")]
THIRDS = [1.0, 1.0, 1.0]  # this machine and two workers: a third of the layers each


@pytest.fixture(autouse=True)
def _rpc() -> None:
    require_rpc()


def greedy(runner: object, prompt: tuple[int, ...], n: int) -> list[int]:
    out, pos, tokens = [], 0, prompt
    for _ in range(n):
        logits = runner.forward([SlotWork(0, tokens, pos)])[0]  # type: ignore[attr-defined]
        pos += len(tokens)
        tokens = (int(np.argmax(logits[-1])),)
        out.append(tokens[0])
    return out


def split_runner(model: object, endpoints: list[str], ctx: int, path: Path) -> object:
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    plan = node_budget(BudgetRequest(str(path), ctx, 1), tuple(endpoints), None, THIRDS)
    config = RunnerConfig(threads=1, max_ctx=ctx, rpc=tuple(endpoints),
                          gpu_layers=plan.gpu_layers, rpc_split=tuple(plan.split))  # fmt: skip
    return LlamaCppRunner(model, config)  # type: ignore[arg-type]


class WorkerPool:
    """The module's two workers, started once: each test that needs a pair takes it here rather
    than starting its own (a worker is an interpreter plus llama.cpp: ~0.8 CPU s to start).
    ``fresh`` is a pair no model was ever loaded on (the first pair, else a new one); ``pair``
    restarts a worker a test killed."""

    def __init__(self) -> None:
        self.workers: list = []
        self.used = False

    def fresh(self) -> list:
        if self.used:  # a model was loaded on this pair: start another
            self.stop()
        return self.pair()

    def pair(self) -> list:
        if not self.workers:
            self.workers = [start_worker(), start_worker()]
        for i, worker in enumerate(self.workers):
            if worker.proc.poll() is not None:
                self.workers[i] = start_worker()
        self.used = True
        return self.workers

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    require_rpc()
    workers_ = WorkerPool()
    yield workers_
    workers_.stop()


@pytest.fixture
def two_workers(pool: WorkerPool) -> list:
    return pool.pair()


@pytest.fixture(scope="module")
def whole() -> object:
    """The unsplit engine with serve's settings, the reference the split answers are held to."""
    from localinfer.session import open_session

    with open_session(None, backend="llamacpp", slots=1, ctx=512, threads=1) as session:
        yield session


def test_each_worker_holds_what_the_budget_plans_and_the_split_decodes_as_unsplit(
    pool: WorkerPool,
) -> None:
    """Fresh workers: their RSS growth over the load and one full prefill chunk (at the end of
    the context, so the chunk's masks span every cell) is the plan's node total within 10%."""
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    path, ctx = embedded_model_path(), 1024
    model = load_model(path)
    prompt = (1, 504, 3458, 282, 4649, 314)
    local = LlamaCppRunner(model, RunnerConfig(threads=1, max_ctx=ctx))
    expected = greedy(local, prompt, 12)
    local.close()
    ws = pool.fresh()
    endpoints = [w.endpoint for w in ws]
    plan = node_budget(BudgetRequest(str(path), ctx, 1), tuple(endpoints), None, THIRDS)
    assert [n.layers for n in plan.nodes] == [10, 11, 9] and plan.nodes[2].output
    before = [w.rss() for w in ws]
    runner = split_runner(model, endpoints, ctx, path)
    try:
        runner.fill_synthetic(0, ctx - 512)  # type: ignore[attr-defined]
        runner.forward([SlotWork(0, tuple(range(100, 612)), ctx - 512)])  # type: ignore[attr-defined]
        grown = [w.rss() - b for w, b in zip(ws, before, strict=True)]
        for node, growth in zip(plan.nodes[1:], grown, strict=True):
            assert 0.9 <= growth / node.total_bytes <= 1.1, (node.name, growth, node)
        runner.release(0)  # type: ignore[attr-defined]
        assert greedy(runner, prompt, 12) == expected
    finally:
        runner.close()  # type: ignore[attr-defined]


def test_a_random_four_layer_model_split_over_two_workers_decodes_as_unsplit(
    tmp_path: Path, two_workers: list
) -> None:
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.llamacpp_helpers import prompt, tiny_setup

    _, _, model = tiny_setup(tmp_path, n_layers=4)
    ids = prompt(7, seed=3, vocab=256, low=3)
    local = LlamaCppRunner(model, RunnerConfig(threads=1, max_ctx=128))
    expected = greedy(local, ids, 10)
    local.close()
    endpoints = [w.endpoint for w in two_workers]
    plan = node_budget(BudgetRequest(str(model.path), 128, 1), tuple(endpoints), None, THIRDS)
    assert [n.layers for n in plan.nodes] == [2, 2, 0] and plan.nodes[2].output
    runner = split_runner(model, endpoints, 128, model.path)
    try:
        assert greedy(runner, ids, 10) == expected
    finally:
        runner.close()  # type: ignore[attr-defined]


def test_serve_with_rpc_answers_as_the_unsplit_server(two_workers: list, whole: object) -> None:
    """`serve --rpc` answers what the unsplit engine does. The unsplit answer comes from an
    in-process session with serve's settings: a second server process would only start another
    interpreter to run the same engine (the split one is the real `localinfer serve`)."""
    import httpx

    from tests.serve_process import running_server

    messages = [{"role": "user", "content": "Name three colours."}]
    body = {"model": "smollm2-135m", "max_tokens": 12, "temperature": 0, "messages": messages}
    args = ["--port", "0", "--backend", "llamacpp", "--slots", "1", "--ctx", "512",
            "--threads", "1"]  # fmt: skip
    ids = whole.chat_prompt_ids(messages)  # type: ignore[attr-defined]
    unsplit = _run(whole, ids, SamplingParams(max_tokens=12, temperature=0)).text
    rpc = ["--rpc", ",".join(w.endpoint for w in two_workers), "--tensor-split", "1,1,1"]
    with running_server([*args, *rpc], "serve", env=dict(os.environ)) as url:
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
    assert unsplit and reply["choices"][0]["message"]["content"] == unsplit


def _run(session: object, ids: list[int], params: SamplingParams):  # noqa: ANN202
    from localinfer.engine import GenerationResult

    result: list = []
    handle = session.engine.submit(Request(ids, params))  # type: ignore[attr-defined]
    done = threading.Thread(target=lambda: result.append(GenerationResult.from_events(handle)))
    done.start()
    done.join(120)
    assert result, "no answer"
    return result[0]


def _wait(predicate: object, what: str) -> None:
    from tests.test_server_support import wait_until

    wait_until(predicate, timeout=120, what=what)  # type: ignore[arg-type]


def test_a_worker_refuses_a_client_not_on_its_allow_list_unread() -> None:
    """The list's other side, a worker that serves a client its list names (127.0.0.0/8), is
    test_mem_caps_what_a_worker_reports_and_what_a_forced_load_may_take's worker."""
    refusing = start_worker(["--allow", "192.0.2.1,198.51.100.0/24"])
    try:
        with pytest.raises((ConnectionError, OSError)):
            rpc_worker_memory(refusing.endpoint)
        _wait(lambda: any("refused 127.0.0.1" in line for line in refusing.log), "the refusal")
    finally:
        refusing.stop()


def test_mem_caps_what_a_worker_reports_and_what_a_forced_load_may_take() -> None:
    from localinfer.session import open_session

    # An allow-list naming loopback by its network: this client is served.
    with workers(1, ["--mem", "16MiB", "--allow", "127.0.0.0/8"]) as ws:
        version, free, total = rpc_worker_memory(ws[0].endpoint)
        assert version.startswith("7.") and (free, total) == (16 * 2**20, 16 * 2**20)
        rpc = RpcOptions((ws[0].endpoint,), (1.0, 1.0))
        kw = {"backend": "llamacpp", "slots": 1, "ctx": 256, "threads": 1, "rpc": rpc}
        with pytest.raises(OutOfMemoryBudgetError, match=ws[0].endpoint):
            open_session(None, **kw)
        with pytest.raises(LocalinferError, match="failed to allocate"):
            open_session(None, force=True, **kw)  # the worker refuses the buffer: no crash
        _wait(lambda: any("past --mem" in line for line in ws[0].log), "the refused buffer")


def test_chat_with_rpc_answers_as_unsplit(two_workers: list, whole: object) -> None:
    """`localinfer chat --rpc` opens its sessions through the same opener (tui/host.py)."""
    from localinfer.tui.host import open_with_settings
    from localinfer.tui.settings import ChatSettings

    settings = ChatSettings(backend="llamacpp", ctx=512, threads=1)
    rpc = RpcOptions(tuple(w.endpoint for w in two_workers), tuple(THIRDS))
    messages = [{"role": "user", "content": "Say a colour."}]
    ids = whole.chat_prompt_ids(messages)  # type: ignore[attr-defined]
    unsplit = _run(whole, ids, SamplingParams(max_tokens=8)).text
    session = open_with_settings(settings, rpc=rpc)
    try:
        assert session.chat_prompt_ids(messages) == ids
        split = _run(session, ids, SamplingParams(max_tokens=8)).text
    finally:
        session.close()
    assert unsplit and split == unsplit


def test_the_llama_server_export_carries_the_split(two_workers: list) -> None:
    """llama-server's own --rpc reaches a `localinfer worker` as it would llama.cpp's
    rpc-server: the plan gives it the workers, the layers they hold and their shares."""
    from localinfer.handoff import ExportRequest, export_plan

    endpoints = tuple(w.endpoint for w in two_workers)
    plan = export_plan(ExportRequest("smollm2-135m", "llama-server", ctx=512, rpc=endpoints,
                                     shares=tuple(THIRDS)))  # fmt: skip
    argv = plan.command
    assert argv[argv.index("--rpc") + 1] == ",".join(endpoints)
    assert argv[argv.index("-ngl") + 1] == "21" and argv[argv.index("-ts") + 1] == "0.5,0.5"


def test_a_worker_killed_mid_answer_ends_it_with_its_address_and_the_rest_keeps_serving(
    pool: WorkerPool, whole: object
) -> None:
    """The module's pair (pool.pair() restarts the killed worker for any test after this one)."""
    from localinfer.session import open_session

    params = SamplingParams(max_tokens=400, ignore_eos=True)
    ws = pool.pair()
    rpc = RpcOptions(tuple(w.endpoint for w in ws), tuple(THIRDS))
    kw = {"backend": "llamacpp", "slots": 1, "ctx": 512, "threads": 1}
    with open_session(None, rpc=rpc, **kw) as split:
        ids = split.chat_prompt_ids([{"role": "user", "content": "Count to a hundred."}])
        events: list = []
        handle = split.engine.submit(Request(ids, params))
        reader = threading.Thread(target=lambda: events.extend(handle), daemon=True)
        reader.start()
        _wait(lambda: sum(len(e.token_ids) for e in events) >= 3, "three tokens")
        ws[1].proc.kill()  # SIGKILL: no goodbye on the socket but the kernel's
        reader.join(120)
        assert not reader.is_alive(), "the answer never ended"
        last = events[-1]
        assert last.finish_reason == "error" and ws[1].endpoint in (last.error or "")
        again = _run(split, ids, SamplingParams(max_tokens=4))
        assert again.finish_reason == "error" and ws[1].endpoint in (again.error or "")
        other = _run(whole, ids, SamplingParams(max_tokens=4))
        assert other.finish_reason == "length" and other.error is None
