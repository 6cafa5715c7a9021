"""Benchmark the llama.cpp runner against its references, measured in the same run.

Prints, for one GGUF (default: the embedded SmolLM2-135M Q4_1) and one thread count:

* the machine's memory-bandwidth limit: numpy sum over a large buffer (GB/s), divided by the bytes
  one decode step reads (the GGUF's tensor bytes) = the single-stream tok/s ceiling;
* single-stream greedy decode tok/s through LlamaCppRunner vs llama-cpp-python's own
  ``Llama.create_completion`` (streaming) on the same file, threads and attention kernel;
* aggregate decode tok/s at 1/4/8 concurrent streams through the runner (all slots in one batch);
* the same through localinfer's Engine (end to end: prefill, sampling, detokenizing) if present.

Decode rates count the tokens after the first (prefill excluded) over the time they took.
Every figure is the median of --repeats runs; the machine may be shared, so rerun when quiet.

    scripts/bench-llamacpp [--model FILE] [--threads N] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# numpy is imported where it is used, after the arguments are parsed: `--help` does not import it.

PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a long story about a lighthouse keeper and a storm.<|im_end|>\n<|im_start|>assistant\n"
)


def median_of(repeats: int, fn: Callable[[], float]) -> tuple[float, list[float]]:
    runs = [fn() for _ in range(repeats)]
    return statistics.median(runs), runs


def memory_bandwidth(gib: float = 1.0, passes: int = 5) -> float:
    """Bytes/s of a streaming read: numpy sum over a buffer far larger than the caches (best of
    ``passes``, the first touch excluded)."""
    import numpy as np

    buf = np.ones(int(gib * (1 << 30)) // 4, dtype=np.float32)
    buf.sum()
    best = 0.0
    for _ in range(passes):
        start = time.perf_counter()
        buf.sum()
        best = max(best, buf.nbytes / (time.perf_counter() - start))
    del buf
    return best


def runner_decode(runner, prompt: tuple[int, ...], streams: int, tokens: int) -> float:
    """Aggregate greedy decode tok/s with ``streams`` slots decoding in one batch per step."""
    from localinfer.backends.base import SlotWork

    for slot in range(streams):
        runner.release(slot)
    # Slightly different prompts per slot, as real concurrent requests would be.
    outs = runner.forward([SlotWork(s, prompt + (100 + s,), 0) for s in range(streams)])
    last = [int(o[0].argmax()) for o in outs]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        batch = [SlotWork(s, (last[s],), runner.slot_length(s)) for s in range(streams)]
        last = [int(o[0].argmax()) for o in runner.forward(batch)]
    return streams * (tokens - 1) / (time.perf_counter() - start)


def high_level_decode(llm, prompt: tuple[int, ...], tokens: int) -> float:
    """llama-cpp-python's own streaming completion, greedy; rate between the first and the last
    streamed token. (No logit_bias to keep it going: that adds a Python logits processor to its
    path. The story prompt runs the full length; a shorter answer still gives a valid rate.)"""
    llm.reset()
    stamps = []
    for _ in llm.create_completion(
        list(prompt) + [100], max_tokens=tokens, temperature=0.0, stream=True
    ):
        stamps.append(time.perf_counter())
    if len(stamps) < 8:
        raise RuntimeError(f"llama-cpp-python streamed only {len(stamps)} tokens")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def engine_decode(runner, tokenizer, prompt: tuple[int, ...], streams: int, tokens: int) -> float:
    """Aggregate tok/s through the Engine: completion tokens after each request's first, over the
    span from the first first-token to the last request's end."""
    from localinfer.engine.engine import Engine
    from localinfer.engine.types import Request, SamplingParams

    for slot in range(streams):
        runner.release(slot)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    with Engine(runner, tokenizer) as engine:
        requests = [Request(list(prompt) + [100 + s], params) for s in range(streams)]
        handles = engine.submit_all(requests)
        first: list[float] = []
        end = 0.0
        counted = 0
        for handle in handles:
            stamps = []
            for event in handle:
                if event.token_ids:
                    stamps.append(time.perf_counter())
                    counted += len(event.token_ids)
            first.append(stamps[0])
            end = max(end, stamps[-1])
    # Handles are drained one after another, so a later handle's first stamp is late; the
    # engine's own start of decoding is bounded by the earliest first token.
    return (counted - streams) / (end - min(first))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench-llamacpp", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per stream")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", default="1,4,8", help="concurrency levels")
    parser.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="for both paths (auto: the runner's per-machine choice, attention_plan.py)",
    )
    parser.add_argument("--no-engine", action="store_true", help="skip the engine figures")
    return parser.parse_args()


@dataclass
class Setup:
    """The model, its prompt and the run's settings, shared by every section."""

    path: Path
    model: Any  # LoadedModel
    prompt: tuple[int, ...]
    threads: int
    levels: list[int]
    flash: bool | None  # None: the runner's own choice
    max_ctx: int

    def runner(self, slots: int):  # -> LlamaCppRunner
        from localinfer.backends.base import RunnerConfig
        from localinfer.backends.llamacpp.runner import LlamaCppRunner

        config = RunnerConfig(slots=slots, max_ctx=self.max_ctx, threads=self.threads)
        return LlamaCppRunner(self.model, config, flash_attn=self.flash)


def setup(args: argparse.Namespace) -> Setup:
    from localinfer.backends.llamacpp.cpu import physical_cores
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    path = Path(args.model) if args.model else embedded_model_path()
    model = load_model(path)
    prompt = tuple(model.tokenizer.encode(PROMPT))
    flash = {"auto": None, "on": True, "off": False}[args.flash_attn]
    levels = [int(s) for s in args.streams.split(",")]
    threads = args.threads or physical_cores()
    return Setup(path, model, prompt, threads, levels, flash, len(prompt) + args.tokens + 8)


def single_stream(s: Setup, args: argparse.Namespace, flash_attn: bool, ceiling: float) -> None:
    """The 1-slot runner against llama-cpp-python's high-level API on the same file, threads and
    attention kernel (``flash_attn``: as the runner chose), alternating run by run so a change in
    the machine's load hits both alike."""
    from bench.llamacpp_reference import reference_llama

    kwargs = dict(n_ctx=s.max_ctx + 8, n_threads=s.threads, n_threads_batch=s.threads)
    single = s.runner(1)
    ours_runs, theirs_runs = [], []
    try:
        with reference_llama(str(s.path), flash_attn=flash_attn, verbose=False, **kwargs) as llm:
            for _ in range(args.repeats):
                ours_runs.append(runner_decode(single, s.prompt, 1, args.tokens))
                theirs_runs.append(high_level_decode(llm, s.prompt, args.tokens))
    finally:
        single.close()
    ours, theirs = statistics.median(ours_runs), statistics.median(theirs_runs)
    print()
    print("single stream, greedy decode (1-slot runner)")
    print(f"  LlamaCppRunner                     {ours:7.1f} tok/s  runs {fmt(ours_runs)}")
    print(f"  llama-cpp-python create_completion {theirs:7.1f} tok/s  runs {fmt(theirs_runs)}")
    print(f"  ratio runner / llama-cpp-python    {ours / theirs:7.2f}x  (target >= 0.95)")
    print(f"  runner / bandwidth ceiling         {ours / ceiling:7.2f}")


def aggregate(title: str, levels: list[int], repeats: int, decode: Callable[[int], float]) -> None:
    """``decode(streams)`` at each level: median tok/s and the ratio to the first level."""
    print()
    print(title)
    base = None
    for streams in levels:
        rate, runs = median_of(repeats, lambda s=streams: decode(s))
        base = base or rate
        print(
            f"  {streams} stream(s): {rate:7.1f} tok/s  {rate / base:5.2f}x single  "
            f"runs {fmt(runs)}"
        )


def main() -> int:
    args = parse_args()
    s = setup(args)
    print(
        f"model: {s.path.name}  threads: {s.threads}  prompt: {len(s.prompt)} tokens  "
        f"decode: {args.tokens} tokens/stream  repeats: {args.repeats} (median)  "
        f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    bw, _ = median_of(1, memory_bandwidth)
    runner = s.runner(max(s.levels))
    weight_bytes = runner.memory().weights
    ceiling = bw / weight_bytes
    print(
        f"memory bandwidth (numpy sum, 1 GiB): {bw / 1e9:.1f} GB/s; "
        f"{weight_bytes / 1e6:.1f} MB of weights read per decode step "
        f"-> single-stream ceiling {ceiling:.0f} tok/s"
    )
    try:
        # As the runner chose (auto: measured).
        single_stream(s, args, runner.flash_attention is not False, ceiling)
        aggregate(
            f"aggregate decode through LlamaCppRunner ({max(s.levels)} slots, one batch per step)",
            s.levels,
            args.repeats,
            lambda n: runner_decode(runner, s.prompt, n, args.tokens),
        )
        if not args.no_engine:
            aggregate(
                "aggregate decode through the Engine (sampling, detokenizing; prefill excluded)",
                s.levels,
                args.repeats,
                lambda n: engine_decode(runner, s.model.tokenizer, s.prompt, n, args.tokens),
            )
    finally:
        runner.close()
    return 0


def fmt(runs: list[float]) -> str:
    return "[" + ", ".join(f"{r:.0f}" for r in runs) + "]"


if __name__ == "__main__":
    sys.exit(main())
