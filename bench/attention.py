"""llama.cpp on the CPU: flash attention on vs off vs what localinfer chooses, in the same run.

For one GGUF (default: the embedded model) and this machine's default thread count, at each
depth (tokens already cached per sequence; a synthetic KV restored, as the calibration does):
tok/s of forwards carrying 1 token (decode), 1 token in each of 4 slots (batched decode),
16 tokens (speculative verification, a short prefill) and 512 tokens (a prefill chunk), with
flash attention on (llama.cpp's own CPU default) and off; then the setting localinfer's runner
picks (attention_plan.py, measured once per machine) and its ratio to the faster of the two in
each cell. Every cell is the median of --repeats timed forwards after one warm-up.

    scripts/bench-attention [--model FILE] [--depths 256,1024,2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.loading.embedded import embedded_model_path

# The runner, its attention plan and the model loader are imported where they are used, after
# the arguments are parsed: `--help` imports none of them.
if TYPE_CHECKING:
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

SHAPES = (("decode 1", 1, 1), ("4 slots x 1", 4, 1), ("16 tokens", 1, 16), ("512 tokens", 1, 512))


def time_shape(runner: LlamaCppRunner, depth: int, slots: int, tokens: int, repeats: int) -> float:
    """tok/s of forwards of ``tokens`` tokens in each of ``slots`` slots at ``depth``."""
    from localinfer.backends.base import SlotWork

    batch = [SlotWork(s, tuple(range(200, 200 + tokens)), depth) for s in range(slots)]
    runs = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        runner.forward(batch)
        if i:
            runs.append(time.perf_counter() - start)
        for s in range(slots):
            runner.truncate(s, depth)
    return slots * tokens / statistics.median(runs)


def measure(model, depth: int, flash: bool, threads: int, repeats: int) -> list[float]:
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    config = RunnerConfig(slots=4, max_ctx=depth + 520, threads=threads)
    runner = LlamaCppRunner(model, config, flash_attn=flash)
    try:
        for s in range(4):
            runner.fill_synthetic(s, depth)
        return [time_shape(runner, depth, slots, n, repeats) for _, slots, n in SHAPES]
    finally:
        runner.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench-attention", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    parser.add_argument("--depths", default="256,1024,2048")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from localinfer.backends.llamacpp.attention_plan import calibration, flash_attention
    from localinfer.backends.llamacpp.attention_probe import AttentionShape
    from localinfer.loading.loader import load_model

    path = Path(args.model) if args.model else embedded_model_path()
    model = load_model(path)
    threads = physical_cores()
    depths = [int(d) for d in args.depths.split(",")]
    result = calibration(threads, AttentionShape.of(model.config))
    print(f"{path.name}, {threads} threads; calibration: {result}")
    header = "".join(f"{name:>14}" for name, _, _ in SHAPES)
    print(f"{'depth':>6} {'flash':>7}{header}   (tok/s)")
    worst = 1.0
    for depth in depths:
        picked = flash_attention(model.config, depth + 520)  # as the runner asks for this context
        rows = {
            flash: measure(model, depth, flash, threads, args.repeats) for flash in (True, False)
        }
        for flash, rates in rows.items():
            cells = "".join(f"{r:14.1f}" for r in rates)
            print(f"{depth:>6} {'on' if flash else 'off':>7}{cells}")
        ratios = [rows[picked][i] / max(rows[True][i], rows[False][i]) for i in range(len(SHAPES))]
        worst = min(worst, *ratios)
        cells = "".join(f"{r:13.2f}x" for r in ratios)
        print(f"{depth:>6} {'picked ' + ('on' if picked else 'off'):>7}{cells}   (of the faster)")
        gains = [rows[picked][i] / rows[True][i] for i in range(len(SHAPES))]
        print(f"{depth:>6} {'vs on':>7}" + "".join(f"{g:13.2f}x" for g in gains)
              + "   (llama.cpp's default)")  # fmt: skip
    print(f"worst cell of the picked setting: {worst:.2f}x of the faster one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
