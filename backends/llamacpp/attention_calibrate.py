"""Time llama.cpp's attention with flash attention on and off, on this CPU (attention_plan.py).

For each setting: a one-slot context for the embedded model, a synthetic DEPTH-token KV cache
restored into it (``fill_synthetic``: 16 real cells repeated; what the cells hold does not change
the work, and a restore costs milliseconds where prefilling 1,000 tokens costs seconds), then the
best of a few CHUNK-token forwards and the median of a few one-token decode steps at that depth.

Run as ``python -m localinfer.backends.llamacpp.attention_calibrate THREADS``: prints the result
as JSON and stores it for attention_plan.py; with ``--probe`` it only loads llama.cpp and runs
one forward (attention_plan.check_runs_here).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.llamacpp.attention_plan import (
    CHUNK,
    DEPTH,
    AttentionCalibration,
    AttentionTimes,
    running_in_the_probe,
    store_calibration,
)
from localinfer.backends.llamacpp.runner import LlamaCppRunner
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

DECODE_STEPS = 6
PREFILL_REPEATS = 2


def time_setting(flash: bool, threads: int) -> AttentionTimes:
    model = load_model(embedded_model_path())
    config = RunnerConfig(slots=1, max_ctx=DEPTH + CHUNK + DECODE_STEPS + 8, threads=threads)
    runner = LlamaCppRunner(model, config, flash_attn=flash)
    try:
        runner.fill_synthetic(0, DEPTH)
        chunk = tuple(range(200, 200 + CHUNK))
        chunks = []
        for _ in range(PREFILL_REPEATS + 1):  # the first warms up
            start = time.perf_counter()
            runner.forward([SlotWork(0, chunk, DEPTH)])
            chunks.append((time.perf_counter() - start) / CHUNK)
            runner.truncate(0, DEPTH)
        steps = []
        for i in range(DECODE_STEPS + 2):  # the first two warm up
            start = time.perf_counter()
            runner.forward([SlotWork(0, (300,), DEPTH + i)])
            steps.append(time.perf_counter() - start)
        return AttentionTimes(
            flash=flash, decode=statistics.median(steps[2:]), prefill=min(chunks[1:])
        )
    finally:
        runner.close()


def measure(threads: int) -> AttentionCalibration:
    rows = tuple(time_setting(flash, threads) for flash in (True, False))
    return AttentionCalibration(threads=threads, depth=DEPTH, rows=rows)


def probe() -> dict:
    """Load llama.cpp and run one forward of the embedded model (attention_plan.check_runs_here)."""
    model = load_model(embedded_model_path())
    runner = LlamaCppRunner(model, RunnerConfig(slots=1, max_ctx=64, threads=1), flash_attn=False)
    try:
        (logits,) = runner.forward([SlotWork(0, tuple(range(100, 108)), 0)])
        return {"ok": bool(logits.size)}
    finally:
        runner.close()


def main(argv: list[str]) -> int:
    running_in_the_probe()
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    result = measure(int(argv[0]))
    print(json.dumps(result.to_json()), flush=True)  # the parent reads it even if storing fails
    try:
        store_calibration(result)
    except OSError as exc:
        print(f"could not store the calibration: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
