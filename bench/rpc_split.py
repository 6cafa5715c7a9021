"""The embedded model split across this machine and two `localinfer worker`s on loopback (llama.cpp
RPC), against the same model unsplit: decode tokens a second, CPU time a decoded token over every
process involved, prefill tokens a second, and what the node plan says the link carries. On one
machine the split can only cost: every token's hidden state goes through the loopback stack twice
and the logits come back from the last worker. On a machine busier than its cores the split's
three processes can draw more CPU time than the one unsplit process does, so its tok/s may even
come out ahead there; the CPU time a token is the overhead that does not depend on that.

Where the installed llama-cpp-python lacks the RPC backend, its RPC copy (bench/llamacpp_rpc.py)
is built once and this runs again with it first on PYTHONPATH.

    python -m bench.rpc_split [--tokens 64] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.rpc_workers import workers

# numpy is imported where it is used, after the arguments are parsed: `--help` does not import it.

PROMPT = (1, 504, 3458, 282, 4649, 314)  # a short chat-like prompt of the embedded model
CHUNK = 512


def _ensure_rpc() -> None:
    from localinfer.backends.llamacpp import rpc_ggml

    if rpc_ggml.supported():
        return
    if os.environ.get("LOCALINFER_BENCH_RPC_REEXEC"):
        raise SystemExit("error: the RPC build did not load")
    from bench import llamacpp_rpc

    site = llamacpp_rpc.ensure_built(log=lambda line: print(line, file=sys.stderr))
    path = llamacpp_rpc.pythonpath_with(site, os.environ.get("PYTHONPATH"))
    env = {**os.environ, "LOCALINFER_BENCH_RPC_REEXEC": "1", "PYTHONPATH": path}
    os.execve(sys.executable, [sys.executable, "-m", "bench.rpc_split", *sys.argv[1:]], env)


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process and of ``pids`` (the workers) so far: user + system."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def decode_rate(runner: object, tokens: int, pids: list[int]) -> tuple[float, float]:
    """Decoded tokens a second, and CPU milliseconds a token over every process involved."""
    import numpy as np

    from localinfer.backends.base import SlotWork

    runner.release(0)  # type: ignore[attr-defined]
    logits = runner.forward([SlotWork(0, PROMPT, 0)])[0]  # type: ignore[attr-defined]
    pos, token = len(PROMPT), int(np.argmax(logits[-1]))
    start, cpu = time.perf_counter(), cpu_seconds(pids)
    for _ in range(tokens):
        logits = runner.forward([SlotWork(0, (token,), pos)])[0]  # type: ignore[attr-defined]
        pos, token = pos + 1, int(np.argmax(logits[-1]))
    wall, used = time.perf_counter() - start, cpu_seconds(pids) - cpu
    return tokens / wall, 1000 * used / tokens


def prefill_rate(runner: object) -> float:
    """Prompt tokens a second over one CHUNK-token prefill."""
    from localinfer.backends.base import SlotWork

    runner.release(0)  # type: ignore[attr-defined]
    start = time.perf_counter()
    runner.forward([SlotWork(0, tuple(range(100, 100 + CHUNK)), 0)])  # type: ignore[attr-defined]
    return CHUNK / (time.perf_counter() - start)


def measure(
    runners: dict[str, object], tokens: int, repeats: int, pids: list[int]
) -> dict[str, tuple[float, ...]]:
    """Median decode rate, CPU ms a decoded token and prefill rate of each runner, their repeats
    interleaved so that what else the machine runs meanwhile falls on both alike."""
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            rate, cpu = decode_rate(runner, tokens, pids)
            rows[name].append((rate, cpu, prefill_rate(runner)))
    return {
        name: tuple(statistics.median(column) for column in zip(*values, strict=True))
        for name, values in rows.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rpc_split", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--tokens", type=int, default=64, help="decoded tokens per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="threads here and on each worker")
    args = p.parse_args(argv)
    _ensure_rpc()
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.budget.compute import BudgetRequest
    from localinfer.budget.memory import human_bytes
    from localinfer.loading import embedded_model_path, load_model
    from localinfer.rpc_nodes import node_budget

    path, ctx = embedded_model_path(), 2048
    model = load_model(path)
    with workers(2, ["--threads", str(args.threads)]) as ws:
        endpoints = tuple(w.endpoint for w in ws)
        plan = node_budget(BudgetRequest(str(path), ctx, 1), endpoints, None, [1.0, 1.0, 1.0])
        config = RunnerConfig(threads=args.threads, max_ctx=ctx, rpc=endpoints,
                              gpu_layers=plan.gpu_layers, rpc_split=tuple(plan.split))  # fmt: skip
        runners = {
            "unsplit": LlamaCppRunner(model, RunnerConfig(threads=args.threads, max_ctx=ctx)),
            "split: here + 2 workers": LlamaCppRunner(model, config),
        }
        try:
            rows = measure(runners, args.tokens, args.repeats, [w.pid for w in ws])
        finally:
            for runner in runners.values():
                runner.close()
    base_decode, base_cpu, base_prefill = rows["unsplit"]
    print(f"embedded model (SmolLM2-135M Q4_1), loopback, {args.threads} thread(s) per node, "
          f"median of {args.repeats} interleaved repeats")  # fmt: skip
    print(f"{'':26} {'decode tok/s':>12} {'ratio':>6} {'CPU ms/token':>13} {'ratio':>6} "
          f"{'prefill tok/s':>13} {'ratio':>6}")  # fmt: skip
    for name, (decode, cpu, prefill) in rows.items():
        print(f"{name:26} {decode:12.1f} {decode / base_decode:6.2f} {cpu:13.1f} "
              f"{cpu / base_cpu:6.2f} {prefill:13.0f} {prefill / base_prefill:6.2f}")  # fmt: skip
    layers = ", ".join(f"{n.name}: {n.layer_text}" for n in plan.nodes)
    print(f"layers: {layers}")
    print(f"link per token (node plan): {human_bytes(plan.bytes_per_token)}, {plan.hops} hops, "
          f"{plan.round_trips} round trips")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
