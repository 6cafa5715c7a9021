"""Decode speed by thread count while another thread of the same process is busy.

The chat UI and the HTTP server share the process with the engine; on a 2-core laptop a busy
neighbour can stall a backend whose threads all expect a core. For llama.cpp and the torch
runner's native kernels (the embedded model, single-stream greedy decode) this prints tokens/s
at 1..N threads (N: physical cores) with a Python thread busy 0%, 50% and 100% of every 10 ms,
and the ratio of each count to the default (physical cores): the basis of the --threads default
(localinfer/threads_option.py).

    scripts/bench-threads
    scripts/bench-threads --runs 5 --steps 48
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-threads", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs per figure (median)")
    p.add_argument("--steps", type=int, default=24, help="decode steps per run")
    p.add_argument("--backends", default="llamacpp,torch")
    return p.parse_args()


class BusyNeighbour:
    """A Python thread that spins ``share`` of every 10 ms (holding the GIL, as UI code does)."""

    def __init__(self, share: float) -> None:
        self.share, self._stop = share, threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            while time.perf_counter() - start < 0.01 * self.share:
                pass
            time.sleep(0.01 * (1 - self.share))

    def __enter__(self) -> BusyNeighbour:
        if self.share > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.share > 0:
            self._thread.join()


def decode_rate(runner, steps: int) -> float:
    from localinfer.backends.base import SlotWork

    prompt = tuple(range(1, 38))
    runner.release(0)
    runner.forward([SlotWork(0, prompt, 0)])
    start = time.perf_counter()
    for i in range(steps):
        runner.forward([SlotWork(0, (5,), len(prompt) + i)])
    return steps / (time.perf_counter() - start)


def make_runner(backend: str, model, threads: int):
    from localinfer.backends.base import RunnerConfig

    config = RunnerConfig(slots=1, max_ctx=256, dtype="float32", threads=threads)
    if backend == "llamacpp":
        from localinfer.backends.llamacpp.runner import LlamaCppRunner

        return LlamaCppRunner(model, config)
    from localinfer.backends.torch.native_plan import DEFAULT_MAX_TOKENS
    from localinfer.backends.torch.runner import TorchRunner

    return TorchRunner(model, config, native_max_tokens=DEFAULT_MAX_TOKENS, stored_blocks=True)


def main() -> int:
    args = parse_args()
    from localinfer.backends.llamacpp.cpu import physical_cores
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    cores = physical_cores()
    shares = (0.0, 0.5, 1.0)
    print(f"single-stream decode of the embedded model, tok/s (median of {args.runs} runs of "
          f"{args.steps} steps); default threads here: {cores}")  # fmt: skip
    print(f"{'backend':<9} {'threads':>7}  " + "  ".join(f"busy {s:4.0%}" for s in shares))
    for backend in args.backends.split(","):
        table = {}
        for threads in range(1, cores + 1):
            runner = make_runner(backend, model, threads)
            decode_rate(runner, 4)  # warm
            for share in shares:
                with BusyNeighbour(share):
                    rates = [decode_rate(runner, args.steps) for _ in range(args.runs)]
                table[threads, share] = statistics.median(rates)
            runner.close()
            cells = "  ".join(f"{table[threads, s]:9.1f}" for s in shares)
            print(f"{backend:<9} {threads:>7}  {cells}")
        for threads in range(1, cores):
            ratios = "  ".join(f"{table[threads, s] / table[cores, s]:8.2f}x" for s in shares)
            print(f"{backend:<9} {threads:>3}/{cores:<3}  {ratios}   (vs the default)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
