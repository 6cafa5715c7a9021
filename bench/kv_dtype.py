"""llama.cpp's KV cache types side by side (--kv-dtype), in one run, on one model: per type, the
cache's bytes (llama.cpp's own allocation log) beside the budget's prediction, teacher-forced
perplexity on the shipped evaluation text with KL and top-1 agreement against an f32 cache (the
reference, same weights), and greedy decode tok/s after a short and a long prompt; every figure
also as a ratio to the default f16 cache.

    scripts/bench-kv-dtype                          # embedded SmolLM2-135M, 1024 tokens
    scripts/bench-kv-dtype --types f16,q8_0 --tokens 512 --ctx 8192

Speeds are medians of --repeats runs on a shared machine; compare rows of the same run.
"""

from __future__ import annotations

import argparse
import statistics

from bench.quant import add_eval_args


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-kv-dtype", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the embedded model)")
    p.add_argument("--types", default="f16,bf16,q8_0,q4_0", help="cache types besides f32")
    p.add_argument("--tokens", type=int, default=1024, help="evaluation tokens (default 1024)")
    p.add_argument("--ctx", type=int, default=2048, help="cells per slot (the cache's size)")
    p.add_argument("--long", type=int, default=1536, help="the long prompt's tokens")
    add_eval_args(p)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    from localinfer.backend_budget import compute_budget
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.budget.compute import BudgetRequest
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model
    from localinfer.quality.evaluate import compare, decode_speed, eval_text, eval_windows

    model = load_model(args.model or embedded_model_path())
    ids = model.tokenizer.encode(eval_text())
    windows = eval_windows(ids, args.window, args.tokens)
    long_prompt = [ids[i % len(ids)] for i in range(args.long)]
    types = ["f32", *[t.strip() for t in args.types.split(",") if t.strip() and t != "f32"]]
    runners = {
        kv: LlamaCppRunner(
            model, RunnerConfig(slots=1, max_ctx=args.ctx, threads=args.threads, kv_dtype=kv)
        )
        for kv in types
    }
    ref_sums, sums = compare(runners["f32"], [runners[k] for k in types[1:]], windows)
    metrics = {"f32": ref_sums, **dict(zip(types[1:], sums, strict=True))}
    short = {kv: [] for kv in types}
    long = {kv: [] for kv in types}
    for _ in range(args.repeats):  # interleaved: a slow phase of the machine hits every type
        for kv, r in runners.items():
            short[kv].append(decode_speed(r, ids[:32], args.steps, repeats=1).tokens_per_s)
            long[kv].append(decode_speed(r, long_prompt, args.steps, repeats=1).tokens_per_s)
    scored = sum(len(w) - 1 for w in windows)
    print(f"model {model.name}, llama.cpp, {args.ctx} cells, {scored} scored tokens in windows "
          f"of {args.window}; decode after 32 and {args.long} tokens, {args.steps} steps, "
          f"median of {args.repeats}")  # fmt: skip
    head = ("type", "KV MiB", "budget", "flash", "ppl", "KL vs f32", "top-1", "tok/s", "long tok/s")
    print(f"{head[0]:<5} {head[1]:>8} {head[2]:>7} {head[3]:>5} {head[4]:>7} {head[5]:>10} "
          f"{head[6]:>6} {head[7]:>7} {head[8]:>10}   vs f16: KV, tok/s, long tok/s")  # fmt: skip
    base = "f16" if "f16" in runners else "f32"
    rate = {kv: statistics.median(v) for kv, v in short.items()}
    long_rate = {kv: statistics.median(v) for kv, v in long.items()}
    kv_bytes = {kv: r.memory().kv_cache for kv, r in runners.items()}
    for kv, r in runners.items():
        budget = compute_budget(BudgetRequest(str(model.path), args.ctx, 1, None,
                                              backend="llamacpp", kv_dtype=kv))  # fmt: skip
        m = metrics[kv]
        kl = f"{m.mean_kl:10.5f}" if kv != "f32" else f"{'-':>10}"
        top1 = f"{m.top1_agreement:6.3f}" if kv != "f32" else f"{'-':>6}"
        print(f"{kv:<5} {kv_bytes[kv] / 2**20:8.2f} {budget.kv_cache_bytes / kv_bytes[kv]:7.3f} "
              f"{'on' if r.flash_attention else 'off':>5} {m.perplexity:7.3f} {kl} {top1} "
              f"{rate[kv]:7.1f} {long_rate[kv]:10.1f}   "
              f"{kv_bytes[kv] / kv_bytes[base]:.3f}x {rate[kv] / rate[base]:.2f}x "
              f"{long_rate[kv] / long_rate[base]:.2f}x")  # fmt: skip
    print("budget: the budget's KV bytes / llama.cpp's logged allocation (1.000 = exact, to the "
          "log's 0.01 MiB)")  # fmt: skip
    for r in runners.values():
        r.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
