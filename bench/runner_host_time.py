"""The llama.cpp runner's own Python per decode step: time in ``runner.forward`` outside
``llama_decode``.

Greedy decode steps with the token taken in the runner (what a plain request runs), at 1 and at
``--slots`` sequences, each sequence ``--depth`` tokens deep: per step the whole forward, the
``llama_decode`` call inside it, and the difference, which is the runner's batch building,
checks, sampling and bookkeeping. That Python runs between two decodes, so every microsecond of
it is a microsecond per step on top of llama.cpp (llama-server spends its own C++ there).

    python -m bench.runner_host_time [--model FILE] [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.llamacpp import runner as runner_module
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.backends.llamacpp.runner import LlamaCppRunner
from localinfer.backends.runner_sampling import RunnerSampling
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

GREEDY = RunnerSampling(1, 0.0)


class DecodeClock:
    """Wraps the runner module's llama_decode call and sums the time spent in it."""

    def __init__(self) -> None:
        self.inner: Callable[..., int] = runner_module.decode_checked
        self.seconds = 0.0

    def __call__(self, *args: object) -> int:
        began = time.perf_counter()
        try:
            return self.inner(*args)
        finally:
            self.seconds += time.perf_counter() - began


def run_steps(
    runner: LlamaCppRunner, clock: DecodeClock, slots: int, depth: int, steps: int
) -> tuple[float, float]:
    """Microseconds per step: the whole forward, and the part outside llama_decode."""
    last = {}
    for s in range(slots):
        runner.truncate(s, 0)
        (token,) = runner.forward([SlotWork(s, tuple(range(100, 100 + depth)), 0, sample=GREEDY)])
        last[s] = int(token[0])
    clock.seconds = 0.0
    began = time.perf_counter()
    for i in range(steps):
        batch = [SlotWork(s, (last[s],), depth + i, sample=GREEDY) for s in range(slots)]
        for s, token in zip(range(slots), runner.forward(batch), strict=True):
            last[s] = int(token[0])
    whole = (time.perf_counter() - began) / steps * 1e6
    return whole, whole - clock.seconds / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runner_host_time", description=__doc__)
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: the embedded model)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--depth", type=int, default=32, help="tokens each sequence holds first")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=physical_cores())
    args = p.parse_args(argv)
    model = load_model(args.model or embedded_model_path())
    config = RunnerConfig(slots=args.slots, max_ctx=args.depth + args.steps + 8,
                          threads=args.threads)  # fmt: skip
    clock = DecodeClock()
    runner_module.decode_checked = clock  # type: ignore[assignment]
    runner = LlamaCppRunner(model, config)
    print(f"runner-host-time: {model.name}, {args.threads} threads, greedy in the runner, "
          f"{args.depth} tokens deep, {args.steps} steps, "
          f"median of {args.rounds} rounds")  # fmt: skip
    print(f"{'sequences':>9s} {'step us':>9s} {'outside llama_decode us':>24s} {'share':>7s}")
    try:
        for slots in sorted({1, args.slots}):
            runs = [run_steps(runner, clock, slots, args.depth, args.steps)
                    for _ in range(args.rounds)]  # fmt: skip
            whole = statistics.median(r[0] for r in runs)
            host = statistics.median(r[1] for r in runs)
            print(f"{slots:9d} {whole:9.0f} {host:24.0f} {host / whole:7.1%}")
    finally:
        runner.close()
        runner_module.decode_checked = clock.inner  # type: ignore[assignment]
    return 0


if __name__ == "__main__":
    sys.exit(main())
