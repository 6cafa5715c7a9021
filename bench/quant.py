"""Quantization side by side, in one run: per runner and quantization, the measured weights
memory (and the budget's prediction), greedy decode tok/s for 1 stream and 8 streams (aggregate),
perplexity on the shipped evaluation text, and KL / top-1 agreement against the float32
reference (the embedded model dequantized to float32 on the torch runner).

    scripts/bench-quant                                   # torch fp32/int8/int4, llama.cpp Q4_1
    scripts/bench-quant --runs torch:int8,torch:int4-g32,mlx:int4 --tokens 512
    LOCALINFER_QUANT_KERNEL=fbgemm scripts/bench-quant --runs torch:int8   # a rejected kernel

Speeds are medians of --repeats runs on a shared machine; compare rows of the same run.
"""

from __future__ import annotations

import argparse
import time

DEFAULT_RUNS = "torch:int8,torch:int4,torch:int4-g32,llamacpp:none"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated backend:quant pairs")
    p.add_argument("--tokens", type=int, default=None, help="default: the whole text")
    add_eval_args(p)
    return p.parse_args()


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """--window, --steps, --repeats and --threads: what this comparison and bench/kv_dtype.py's
    read for scoring windows and timing decode."""
    p.add_argument("--window", type=int, default=512, help="tokens per scored window")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)


def main() -> int:
    args = parse_args()
    from localinfer.backends.select import is_installed
    from localinfer.loading.loader import load_model
    from localinfer.quality.evaluate import compare, eval_text, eval_windows
    from localinfer.quality.run import QualityOptions, build_runner
    from localinfer.resolve import resolve_model
    from localinfer.session import DEFAULT_MODEL

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    resolved = resolve_model(args.model or DEFAULT_MODEL)
    model = load_model(resolved.require_path(), name=resolved.name)
    opts = QualityOptions(window=args.window, threads=args.threads, slots=8)
    runs = []
    for item in args.runs.split(","):
        backend, _, quant = item.strip().partition(":")
        if not is_installed(backend):
            print(f"skipping {item}: {backend} is not installed")
            continue
        runs.append((backend, quant or "none"))

    def timed_build(backend: str, quant: str):
        t0 = time.perf_counter()
        r = build_runner(model, backend, quant, opts)
        return r, time.perf_counter() - t0

    reference, ref_load = timed_build("torch", "none")
    built = [timed_build(b, q) for b, q in runs]
    candidates = [r for r, _ in built]
    ids = model.tokenizer.encode(eval_text(), add_special_tokens=True)
    windows = eval_windows(ids, args.window, args.tokens)
    t0 = time.perf_counter()
    ref_sums, sums = compare(reference, candidates, windows)
    eval_s = time.perf_counter() - t0
    rows = [(reference, ref_load, ref_sums, True)]
    rows += [(r, load, s, False) for (r, load), s in zip(built, sums, strict=True)]
    print_rows(model, args, rows, eval_s)
    # A second load of each torch quantization reads the on-disk cache.
    for backend, quant in runs:
        if backend == "torch":
            r, load = timed_build(backend, quant)
            print(
                f"second load torch {r.info.quant}: {load:.1f} s "
                f"(cache hit: {getattr(r, 'quant_cache_hit', False)})"
            )
            r.close()
    return 0


def print_rows(model, args: argparse.Namespace, rows: list[tuple], eval_s: float) -> None:
    """One line per runner: (runner, load seconds, its sums, is the reference); the first row is
    the float32 reference. Closes each runner once measured."""
    from localinfer.quality.evaluate import decode_speed
    from localinfer.quality.run import SPEED_PROMPT, budget_weights

    ref_sums = rows[0][2]
    prompt = model.tokenizer.encode(SPEED_PROMPT, add_special_tokens=True)
    header = (
        f"{'backend':<9} {'quant':<9} {'weights':>9} {'budget':>9} {'Δ':>6} {'load s':>7} "
        f"{'tok/s x1':>9} {'tok/s x8':>9} {'x1/ref':>7} {'ppl':>8} {'Δppl':>7} {'KL':>7} "
        f"{'top-1':>7}"
    )
    print(
        f"{model.name}: {ref_sums.tokens} scored tokens, windows of {args.window} "
        f"({eval_s:.0f} s for all runners in lockstep)"
    )
    print(header)
    ref_speed = None
    for r, load, s, is_ref in rows:
        one = decode_speed(r, prompt, args.steps, 1, args.repeats).tokens_per_s
        eight = decode_speed(r, prompt, args.steps, 8, args.repeats).tokens_per_s
        ref_speed = ref_speed or one
        weights = r.memory().weights
        budget = budget_weights(model, "f32" if is_ref else r.info.quant, r.info.backend)
        err = "" if not budget else f"{weights / budget - 1:+.1%}"
        rise = s.perplexity / ref_sums.perplexity - 1
        kl = 0.0 if is_ref else s.mean_kl
        top1 = 1.0 if is_ref else s.top1_agreement
        print(
            f"{r.info.backend:<9} {r.info.quant:<9} {weights / 1e6:>7.1f}MB "
            f"{'' if not budget else f'{budget / 1e6:.1f}MB':>9} {err:>6} {load:>7.1f} "
            f"{one:>9.1f} {eight:>9.1f} {one / ref_speed:>7.2f} {s.perplexity:>8.3f} "
            f"{rise:>+7.1%} {kl:>7.4f} {top1:>7.1%}",
            flush=True,
        )
        r.close()


if __name__ == "__main__":
    raise SystemExit(main())
