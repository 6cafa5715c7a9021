"""8B Q4_K_M models on a GPU, as people download them: decode at 1 and 8 streams against the
device's bandwidth, and memory against the budget (scripts/gpu-check, issue #43).

For each real-shape random file (bench/random_gguf.py: Llama-3.1-8B's and Qwen3-8B's shapes, block
types and vocabularies, written once into the cache) and each backend asked, a session opens on
the device the routing picks (llama.cpp with every layer on the GPU; torch on CUDA), decodes
``--tokens`` tokens greedily at 1 and at 8 streams, and prints:

- tok/s, and at one stream its ratio to the bound: bandwidth / bytes one step reads (every
  tensor but the embedding table, whose rows are gathered);
- 8 streams' aggregate over one stream's rate;
- the memory the device gave up while the model loaded (torch: allocated + reserved; other
  backends: the device's free memory before and after) against the budget's total.

Then PASS / FAIL lines: one stream at least ``--min-ratio`` of the bound, 8 streams at least 3x one,
memory within ``--memory-tolerance`` of the budget. The bandwidth is a sum over a buffer far larger
than the caches (torch on CUDA; numpy on a CPU, where the same script checks its own logic).

    python -m bench.kquant_gpu --backends llamacpp,torch
    python -m bench.kquant_gpu --file model.gguf --backends llamacpp --streams 1,2 --tokens 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.llamacpp_peer import memory_bandwidth
from bench.random_gguf import SHAPES, cached

STREAMS = (1, 8)


@dataclass(frozen=True, slots=True)
class Row:
    file: str
    backend: str
    device: str
    streams: int
    tok_s: float
    bound: float  # tok/s at the bandwidth, one stream
    memory: int | None  # bytes the device gave up while loading (None: not measurable here)
    budget: int


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kquant_gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--file", action="append", help="a GGUF (repeatable); default: the 8B shapes")
    p.add_argument("--backends", default="llamacpp,torch")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--tokens", type=int, default=64, help="decoded per stream")
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localinfer-dev")
    p.add_argument("--min-ratio", type=float, default=0.5)
    p.add_argument("--memory-tolerance", type=float, default=0.15)
    return p.parse_args()


def device_bandwidth() -> tuple[str, float]:
    """("cuda", bytes/s) where torch sees a GPU, else ("cpu", bytes/s of a numpy read)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        buf = torch.ones(2**30 // 4, dtype=torch.float32, device="cuda")
        times = []
        for _ in range(7):
            torch.cuda.synchronize()
            start = time.perf_counter()
            buf.sum()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return "cuda", buf.nbytes / statistics.median(times[1:])
    return "cpu", memory_bandwidth(0.5)


def step_bytes(path: Path) -> int:
    """Bytes one decode step reads: every tensor but the embedding table."""
    from localinfer.budget.file_headers import read_gguf_header

    header = read_gguf_header(path)
    return sum(t.nbytes for t in header.tensors if t.name != "token_embd.weight")


def free_device_memory(device: str) -> int | None:
    if device == "cpu":
        return None
    import torch

    return int(torch.cuda.mem_get_info()[0])


def decode_rate(session, streams: int, tokens: int) -> float:
    """Aggregate greedy decode tok/s of ``streams`` requests submitted together, from the
    engine's own timings (a consumer thread per stream would time Python's thread switches):
    tokens after each one's first, over the time from the first first token to the last."""
    from localinfer.engine.types import Request, SamplingParams

    ids = session.raw_prompt_ids("The quick brown fox jumps over the lazy dog. " * 4)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    submitted = []
    for _ in range(streams):
        submitted.append((time.perf_counter(), session.engine.submit(Request(ids, params))))
    spans = []
    for at, handle in submitted:
        m = handle.result().metrics
        first = at + m.ttft_s
        spans.append((first, first + m.tpot_s * (m.completion_tokens - 1), m.completion_tokens))
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    return sum(n - 1 for _, _, n in spans) / max(end - start, 1e-9)


def measure(path: Path, backend: str, streams: list[int], args, bandwidth: float) -> list[Row]:
    from localinfer.session import open_session

    session = None
    try:
        before = free_device_memory("cuda" if _cuda() else "cpu")
        session = open_session(str(path), backend=backend, slots=max(streams), ctx=args.ctx)
        device = session.engine.runner.info.device
        after = free_device_memory(device)
        used = before - after if before is not None and after is not None else None
        budget = session.budget.total_bytes if session.budget is not None else 0
        bound = bandwidth / step_bytes(path)
        decode_rate(session, 1, 4)  # warm-up: kernels, graphs
        return [
            Row(
                path.name,
                backend,
                device,
                n,
                decode_rate(session, n, args.tokens),
                bound,
                used,
                budget,
            )  # fmt: skip
            for n in streams
        ]
    finally:
        if session is not None:
            session.close()


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def verdicts(rows: list[Row], min_ratio: float, tolerance: float) -> list[tuple[bool, str]]:
    """PASS/FAIL lines per file and backend."""
    out: list[tuple[bool, str]] = []
    keys = sorted({(r.file, r.backend) for r in rows})
    for file, backend in keys:
        mine = {r.streams: r for r in rows if (r.file, r.backend) == (file, backend)}
        one = mine.get(1)
        name = f"{file} on {backend}"
        if one is not None:
            ratio = one.tok_s / one.bound
            out.append((ratio >= min_ratio, f"{name}: 1 stream {ratio:.2f}x the bandwidth bound "
                                            f"(>= {min_ratio})"))  # fmt: skip
        if one is not None and 8 in mine:
            gain = mine[8].tok_s / one.tok_s
            out.append((gain >= 3.0, f"{name}: 8 streams {gain:.2f}x one stream (>= 3)"))
        first = next(iter(mine.values()))
        if first.memory is not None and first.budget:
            error = (first.memory - first.budget) / first.budget
            out.append((abs(error) <= tolerance, f"{name}: memory {error:+.1%} of the budget "
                                                 f"(within {tolerance:.0%})"))  # fmt: skip
    return out


def main() -> int:
    args = parse_args()
    files = [Path(f) for f in args.file] if args.file else [
        cached(shape, args.cache / "random-gguf") for shape in SHAPES.values()
    ]  # fmt: skip
    streams = [int(s) for s in args.streams.split(",")]
    kind, bandwidth = device_bandwidth()
    print(f"kquant-gpu: {kind}, bandwidth {bandwidth / 1e9:.0f} GB/s, {args.tokens} tokens/stream")
    rows: list[Row] = []
    failed = False
    for path in files:
        for backend in args.backends.split(","):
            try:
                found = measure(path, backend, streams, args, bandwidth)
            except Exception as exc:  # noqa: BLE001 - one backend's failure is a FAIL line
                print(f"FAIL {path.name} on {backend}: {type(exc).__name__}: {exc}")
                failed = True
                continue
            for r in found:
                ratio = f"{r.tok_s / r.bound:.2f}x bound" if r.streams == 1 else ""
                memory = f"{r.memory / 2**30:.2f} GiB" if r.memory is not None else "-"
                print(f"  {r.file:<36} {r.backend:<9} {r.device:<6} {r.streams:>2} streams "
                      f"{r.tok_s:8.1f} tok/s {ratio:>12}  memory {memory} "
                      f"budget {r.budget / 2**30:.2f} GiB")  # fmt: skip
            rows += found
    for ok, line in verdicts(rows, args.min_ratio, args.memory_tolerance):
        print(("PASS " if ok else "FAIL ") + line)
        failed = failed or not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
