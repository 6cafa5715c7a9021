"""Drawing a token inside the llama.cpp runner against the engine's host sampler, per output row.

For each model (the embedded one, and Gemma 3 270M with its 262k vocabulary where the ``bench``
extra is installed), 8 slots decode one step, then each row's token is drawn both ways from the
same logits, many times: the host's way (the row copied out of llama.cpp's buffer, then
engine/sampler.py) and the runner's (backends/llamacpp/sampling.py: argmax on the row in place
when greedy, llama.cpp's sampler chain otherwise). Prints microseconds per row and the ratio.

    python -m bench.runner_sampling [--repeats N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bench.paths import default_models

# numpy, the runner and the engine are imported where they are used: `--help` imports none.
if TYPE_CHECKING:
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

SLOTS = 8
MIXES: dict[str, dict[str, float | int]] = {
    "greedy": {},
    "t=0.7": {"temperature": 0.7},
    "t=0.7 top_p=0.95": {"temperature": 0.7, "top_p": 0.95},
    "t=0.8 top_k=40": {"temperature": 0.8, "top_k": 40},
}


def per_call_us(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def compare(
    runner: LlamaCppRunner, mix: dict[str, float | int], repeats: int
) -> tuple[float, float]:
    """Microseconds per step of SLOTS rows: drawn on the host, drawn in the runner. These are the
    two halves of LlamaCppRunner.forward after its decode, on the same rows: the harness reaches
    into the runner so that the decode itself is not timed."""
    import numpy as np

    from localinfer.backends.runner_sampling import RunnerSampling
    from localinfer.engine.sampler import TokenSampler
    from localinfer.engine.types import SamplingParams

    vocab = runner.info.vocab_size
    host = TokenSampler(SamplingParams(**mix), vocab, ())  # type: ignore[arg-type]
    spec = RunnerSampling(stream=1, seed=0, **mix)  # type: ignore[arg-type]
    rows = np.arange(SLOTS)

    def host_draw() -> None:
        for row in runner._copy_logits(rows):  # noqa: SLF001
            host.sample(row)

    def runner_draw() -> None:
        for slot in range(SLOTS):
            runner._samplers.sample(runner._ctx, slot, spec, slot)  # noqa: SLF001

    return per_call_us(host_draw, repeats), per_call_us(runner_draw, repeats)


def measure(model_path: str, repeats: int) -> list[str]:
    from localinfer.backends.base import RunnerConfig, SlotWork
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.session import open_model

    model = open_model(model_path).model
    runner = LlamaCppRunner(model, RunnerConfig(slots=SLOTS, max_ctx=64))
    try:
        # One token a slot: the output rows are the batch rows 0..SLOTS-1, as in a decode step.
        runner.forward([SlotWork(s, (10 + s,), 0) for s in range(SLOTS)])
        vocab = runner.info.vocab_size
        rows = [f"{model_path.rsplit('/', 1)[-1]} ({vocab} vocabulary), {SLOTS} rows a step:"]
        for name, mix in MIXES.items():
            host_us, runner_us = compare(runner, mix, repeats)
            rows.append(
                f"  {name:<18} host {host_us / SLOTS:8.1f} us/row   "
                f"runner {runner_us / SLOTS:8.1f} us/row   runner/host {runner_us / host_us:5.2f}x"
            )
        return rows
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    for path in default_models():
        print("\n".join(measure(path, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
