"""The torch runner's native CPU kernels, piece by piece, beside references in the same run.

1. The bare matrix product (li_linear) over SmolLM2-135M's fp32 matrix shapes (random values),
   at 1..16 tokens, in GB/s of weights read, on huge pages and on 4 KB pages, beside a sum over
   a 1 GiB huge-page buffer (the machine's read bandwidth) taken between the sweeps.
2. The threshold behind native_forward.DEFAULT_MAX_TOKENS: tokens/s of one chunk after a
   256-token prompt on the embedded model, native kernels vs the torch ops the runner uses above
   the limit (oneDNN on the same dense matrices).
3. The embedded GGUF with its Q4_1/Q8_0 blocks kept as stored (block_weights.py) beside
   torch ops on its dequantized float32 weights (native kernels off) and llama.cpp
   (LlamaCppRunner) on the same file and threads, interleaved repeats: single-stream greedy
   decode tokens/s and their ratios, a 512-token prefill, 8 slots decoding together (aggregate
   tokens/s), then the cost of a k+1-token forward (speculative verification) in one-token
   decode steps, k = 1, 2, 4, 8, 16: the basis of the CPU backend choice
   (backends/torch/profile.py). It ends with what the program picks by default for the file
   here (backends/select.py and this machine's calibration) beside the fastest path measured.

Where the CPU has AVX-512 it runs twice (--isa): as built for this machine, and with AVX-512
hidden (kernels built for AVX2, oneDNN/ATen at AVX2, llama.cpp's AVX2 build: built once per
machine, ~5 min), what most laptops run.

--prefill-only measures just the kept-blocks prefill against torch ops on the float32 weights,
at several prompt lengths, interleaved: wall time and this process's CPU time (with --threads 1
the CPU time is the work itself, steady on a machine other processes load).

    scripts/bench-native-kernels
    scripts/bench-native-kernels --rounds 5 --skip-threshold
    scripts/bench-native-kernels --only-llamacpp --threads 2
    scripts/bench-native-kernels --prefill-only --threads 1 --repeats 9

This VM's memory bandwidth changes from one half-minute to the next: each round prints its own
sum beside its sweeps; compare within a row.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

# torch is imported by the functions that use it, after the arguments are parsed: `--help` does
# not pay its import (about 2 s of CPU), nor does the parent of the --isa passes.


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-native-kernels", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of the product sweep")
    p.add_argument("--tokens", default="1,2,4,8,16", help="token counts for the product sweep")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip-threshold", action="store_true", help="skip part 2 (needs the model)")
    p.add_argument("--skip-llamacpp", action="store_true", help="skip part 3")
    p.add_argument("--only-llamacpp", action="store_true", help="part 3 alone")
    p.add_argument("--repeats", type=int, default=7, help="part 3: interleaved repeats")
    p.add_argument("--steps", type=int, default=32, help="part 3: decode steps per repeat")
    p.add_argument("--isa", default="auto", help="auto | native | avx2 | native,avx2")
    p.add_argument("--prefill-only", action="store_true", help="blocks vs torch ops prefill alone")
    p.add_argument("--prefill-tokens", default="64,256,512", help="--prefill-only prompt lengths")
    return p.parse_args()


def smollm2_shapes() -> list[tuple[int, int]]:
    layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q|k|v, o, gate|up, down
    return layer * 30 + [(49152, 576)]  # + the tied LM head


def median_time(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def product_sweep(args, kernels) -> None:
    import torch

    from localinfer.backends.torch.huge_pages import HugePageArena

    shapes = smollm2_shapes()
    arena = HugePageArena.create(HugePageArena.padded_bytes(shapes, 4))
    if arena is None:
        print("1. no huge-page arena on this platform: sweep on 4 KB pages only")
    gen = torch.Generator().manual_seed(0)
    plain = [torch.randn(s, generator=gen) for s in shapes]
    huge = None
    if arena is not None:
        huge = [arena.empty(s, torch.float32) for s in shapes]
        for h, p in zip(huge, plain, strict=True):
            h.copy_(p)
    probe_arena = HugePageArena.create(1 << 30)
    probe = probe_arena.empty((1 << 28,), torch.float32) if probe_arena else torch.empty(1 << 28)
    probe.fill_(1.0)
    counts = [int(t) for t in args.tokens.split(",")]
    xs = {i: torch.randn(max(counts), i, generator=gen) for i in {s[1] for s in shapes}}
    nbytes = sum(w.nbytes for w in plain)
    threads = args.threads or torch.get_num_threads()

    inputs = {t: {i: x[:t].contiguous() for i, x in xs.items()} for t in counts}
    out = torch.empty(max(counts) * max(s[0] for s in shapes))
    lib = kernels.lib  # called directly: no per-call checks or allocations in the timing
    from localinfer.backends.torch.cpu_kernels import mat

    def sweep(weights, tokens: int) -> float:
        mats = [mat(w) for w in weights]
        calls = [
            (inputs[tokens][w.shape[1]].data_ptr(), ctypes.byref(m), w.shape[0], w.shape[1])
            for w, m in zip(weights, mats, strict=True)
        ]

        def run() -> None:
            for x, w, rows, cols in calls:
                lib.li_linear(x, tokens, cols, w, rows, None, out.data_ptr(), threads)

        run()  # warm
        return nbytes / median_time(run) / 1e9

    print(f"1. matrix product over {nbytes / 1e6:.0f} MB of SmolLM2-shaped fp32 matrices, "
          f"{threads} threads, GB/s of weights read (median of 5)")  # fmt: skip
    header = "   round  sum(huge)  " + "  ".join(f"{t:>2} tok huge/4K" for t in counts)
    print(header)
    for r in range(args.rounds):
        bw = probe.nbytes / median_time(lambda: probe.sum().item(), 3) / 1e9
        cells = []
        for t in counts:
            h = sweep(huge, t) if huge is not None else float("nan")
            p = sweep(plain, t)
            cells.append(f"{h:5.1f} /{p:5.1f}")
        print(f"   {r + 1:>5}  {bw:9.1f}  " + "  ".join(f"{c:>14}" for c in cells))


def threshold(args) -> None:
    from localinfer.backends.base import RunnerConfig, SlotWork
    from localinfer.backends.torch.runner import TorchRunner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    config = RunnerConfig(slots=1, max_ctx=512, dtype="float32", threads=args.threads)
    # float32 weights (stored_blocks=False): block matrices would send every forward native
    native = TorchRunner(model, config, native_max_tokens=10**6, stored_blocks=False)
    ops = TorchRunner(model, config, stored_blocks=False)  # torch ops (oneDNN) above the limit
    prompt = tuple(range(1, 257))

    def rate(runner, chunk: int) -> float:
        times = []
        for _ in range(3):
            runner.release(0)
            runner.forward([SlotWork(0, prompt, 0)])
            t0 = time.perf_counter()
            runner.forward([SlotWork(0, tuple(range(300, 300 + chunk)), len(prompt))])
            times.append(time.perf_counter() - t0)
        return chunk / min(times)

    limit = ops.native_max_tokens
    ops._native.max_tokens = 0  # this runner: torch ops on its dense matrices for every chunk
    print("2. one chunk after a 256-token prompt, embedded SmolLM2 fp32, tokens/s "
          f"(best of 3); the runner's limit is {limit} tokens")  # fmt: skip
    print("   tokens   native   torch ops   native/ops")
    for chunk in (8, 16, 32, 48, 64, 128):
        a, b = rate(native, chunk), rate(ops, chunk)
        print(f"   {chunk:>6}   {a:6.0f}   {b:9.0f}   {a / b:10.2f}")
    native.close()
    ops.close()


def decode_rate(runner, prompt: tuple[int, ...], steps: int) -> float:
    """Single-stream greedy decode tokens/s after a fresh prefill of ``prompt`` in slot 0."""
    from localinfer.backends.base import SlotWork

    runner.release(0)
    (logits,) = runner.forward([SlotWork(0, prompt, 0)])
    token = int(logits[-1].argmax())
    t0 = time.perf_counter()
    for i in range(steps):
        (logits,) = runner.forward([SlotWork(0, (token,), len(prompt) + i)])
        token = int(logits[-1].argmax())
    return steps / (time.perf_counter() - t0)


def prefill_rate(runner, tokens: int) -> float:
    """Tokens/s of one fresh ``tokens``-token prompt in slot 0 (last logits only)."""
    from localinfer.backends.base import SlotWork

    runner.release(0)
    t0 = time.perf_counter()
    runner.forward([SlotWork(0, tuple(range(1, tokens + 1)), 0)])
    return tokens / (time.perf_counter() - t0)


def batched_rate(runner, prompt: tuple[int, ...], slots: int, steps: int) -> float:
    """Aggregate greedy decode tokens/s of ``slots`` streams stepping together."""
    from localinfer.backends.base import SlotWork

    for s in range(slots):
        runner.release(s)
    outs = runner.forward([SlotWork(s, prompt, 0) for s in range(slots)])
    tokens = [int(o[-1].argmax()) for o in outs]
    t0 = time.perf_counter()
    for i in range(steps):
        work = [SlotWork(s, (tokens[s],), len(prompt) + i) for s in range(slots)]
        tokens = [int(o[-1].argmax()) for o in runner.forward(work)]
    return slots * steps / (time.perf_counter() - t0)


DEEP_PROMPT = 960  # tokens before the long-context decode row (the runners hold 1,024 a slot)


def versus_llamacpp(args) -> None:
    import torch

    from bench.llamacpp_avx2 import loaded_build
    from bench.spec_replay import verification_costs
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.backends.torch.cpu_kernels import load_kernels
    from localinfer.backends.torch.runner import TorchRunner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    threads = args.threads or torch.get_num_threads()
    config = RunnerConfig(slots=8, max_ctx=1024, dtype="float32", threads=threads)
    # Blocks kept; the kernels take forwards up to the calibrated limit, torch ops on dequantized
    # matrices the longer ones (prefill), as the runner does by default.
    blocks = TorchRunner(model, config, stored_blocks=True)
    # float32 matrices by name: the file would otherwise be held converted (int4 / int8)
    ops = TorchRunner(model, config, native_max_tokens=0, stored_blocks=False)
    llama = LlamaCppRunner(model, config)
    runners = {"torch blocks": blocks, "torch ops": ops, "llama.cpp": llama}
    prompt = tuple(range(1, 38))  # the embedded model's chat prompt length (docs/facts.md)
    print(f"3. embedded SmolLM2 {model.file_quant}: torch runner on stored blocks "
          f"({blocks.info.quant}, {blocks.memory().weights / 1e6:.1f} MB of weights, kernels "
          f"ISA {load_kernels().isa()} up to {blocks.native_max_tokens} tokens) vs torch ops "
          f"(fp32) vs llama.cpp ({loaded_build()}, flash attention "
          f"{'on' if llama.flash_attention else 'off'}, "
          f"attention_plan.py), {threads} threads, "
          f"{args.repeats} interleaved repeats of {args.steps} greedy steps after a "
          f"{len(prompt)}-token prompt")  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for r in runners.values():
        decode_rate(r, prompt, 4)  # warm
    for _ in range(args.repeats):
        for name, r in runners.items():
            rates[name].append(decode_rate(r, prompt, args.steps))
    med = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in rates.items():
        print(f"   {name:<13} {med[name]:6.1f} tok/s  ({1000 / med[name]:5.2f} ms/token; "
              f"runs {min(v):.0f}-{max(v):.0f})")  # fmt: skip
    for other in ("torch ops", "llama.cpp"):
        paired = [a / b for a, b in zip(rates["torch blocks"], rates[other], strict=True)]
        print(f"   torch blocks / {other}: {med['torch blocks'] / med[other]:.2f}x "
              f"(median of per-repeat ratios {statistics.median(paired):.2f}x)")  # fmt: skip
    figures = {"single-stream decode": rates}
    long_prompt = tuple(1 + i % 5000 for i in range(DEEP_PROMPT))
    for label, measure in (
        ("prefill of a 512-token prompt", lambda r: prefill_rate(r, 512)),
        ("8 slots decoding together", lambda r: batched_rate(r, prompt, 8, args.steps // 2)),
        # Attention over a long context: where llama.cpp's attention kernel choice shows
        # (backends/llamacpp/attention_plan.py) and the kernels' attention is read in full.
        (f"decode after a {DEEP_PROMPT}-token prompt",
         lambda r: decode_rate(r, long_prompt, min(args.steps, 1024 - DEEP_PROMPT))),
    ):  # fmt: skip
        got: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(max(3, args.repeats // 2)):
            for name, r in runners.items():
                got[name].append(measure(r))
        mid = {name: statistics.median(v) for name, v in got.items()}
        figures[label] = got
        print(f"   {label}: " + ", ".join(f"{n} {mid[n]:.0f} tok/s" for n in runners)
              + f"; torch blocks / torch ops {mid['torch blocks'] / mid['torch ops']:.2f}x"
              + f", / llama.cpp {mid['torch blocks'] / mid['llama.cpp']:.2f}x")  # fmt: skip
    default_choice(model, figures)
    print("   verification: a k+1-token forward (all logits) in one-token steps, median of 9")
    print(f"   {'k':>3}  " + "  ".join(f"{name:>13}" for name in runners))
    ks = (1, 2, 4, 8, 16)
    measured = {}
    for name, r in runners.items():
        r.release(0)  # the batched run left slot 0 full
        measured[name] = verification_costs(r, prompt, ks)  # (one-token seconds, {k: steps})
    for k in ks:
        cells = [measured[name][1][k] for name in runners]
        print(f"   {k:>3}  " + "  ".join(f"{c:13.2f}" for c in cells))
    print("   one-token forward: " + ", ".join(
        f"{name} {measured[name][0] * 1000:.2f} ms" for name in runners))  # fmt: skip
    for r in runners.values():
        r.close()


def prefill_only(args) -> None:
    """Kept blocks vs torch ops on float32 weights: one fresh prompt per forward, interleaved."""
    import torch

    from localinfer.backends.base import RunnerConfig, SlotWork
    from localinfer.backends.torch.runner import TorchRunner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    threads = args.threads or torch.get_num_threads()
    counts = [int(t) for t in args.prefill_tokens.split(",")]
    config = RunnerConfig(slots=1, max_ctx=max(counts) + 8, dtype="float32", threads=threads)
    runners = {"blocks": TorchRunner(model, config, stored_blocks=True),
               "ops": TorchRunner(model, config, native_max_tokens=0,
                                  stored_blocks=False)}  # fmt: skip
    print(f"prefill: embedded SmolLM2 {model.file_quant}, kept blocks vs torch ops (fp32), "
          f"{threads} threads, median of {args.repeats} interleaved repeats; ratio = blocks "
          "speed / ops speed (median of per-repeat ratios)")  # fmt: skip
    for tokens in counts:
        prompt = tuple(range(1, tokens + 1))
        times = {name: {"wall": [], "cpu": []} for name in runners}
        for r in runners.values():
            r.release(0)
            r.forward([SlotWork(0, prompt, 0)])  # warm
        for _ in range(args.repeats):
            for name, r in runners.items():
                r.release(0)
                wall, cpu = time.perf_counter(), time.process_time()
                r.forward([SlotWork(0, prompt, 0)])
                times[name]["cpu"].append(time.process_time() - cpu)
                times[name]["wall"].append(time.perf_counter() - wall)
        cells = []
        for clock in ("wall", "cpu"):
            b, o = times["blocks"][clock], times["ops"][clock]
            ratio = statistics.median(y / x for x, y in zip(b, o, strict=True))
            cells.append(f"{clock} blocks {statistics.median(b) * 1000:6.0f} ms, ops "
                         f"{statistics.median(o) * 1000:6.0f} ms, ratio {ratio:.3f}")  # fmt: skip
        print(f"   {tokens:>4} tokens: " + "; ".join(cells))
    for r in runners.values():
        r.close()


def default_choice(model, figures: dict[str, dict[str, list[float]]]) -> None:
    """What the program runs this file on by default here, beside the fastest path measured.

    Where another path's median is faster, the repeats (run in turn, so paired) say whether
    that is a difference or noise: when the default won some of the pairs, the paired ratios'
    range is printed and the row reads "within the run-to-run spread".
    """
    from localinfer.backends.select import choose_backend
    from localinfer.backends.torch.native_plan import keeps_blocks

    choice = choose_backend(None, model.format, model.file_quant, model.config.arch)
    if choice.name == "torch":
        default = "torch blocks" if keeps_blocks() else "torch ops"
    else:
        default = "llama.cpp"
    print(f"   default here: {default} ({choice.reason})")
    for label, samples in figures.items():
        rates = {name: statistics.median(v) for name, v in samples.items()}
        fastest = max(rates, key=rates.get)
        verdict = "fastest"
        if fastest != default:
            pairs = [d / f for d, f in zip(samples[default], samples[fastest], strict=True)]
            verdict = f"{fastest} is faster"
            if max(pairs) >= 1.0:
                verdict += (f" by its median, within the run-to-run spread: paired ratios "
                            f"{min(pairs):.2f}-{max(pairs):.2f}")  # fmt: skip
        print(f"   {label}: default {rates[default] / rates[fastest]:.2f}x the fastest ({verdict})")


def main() -> int:
    args = parse_args()
    from bench.isa_levels import in_pass, run_levels

    if not in_pass():
        uses_llamacpp = not (args.skip_llamacpp or args.prefill_only)
        return run_levels("bench.native_kernels", sys.argv[1:], args.isa, uses_llamacpp)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from localinfer.backends.torch.cpu_kernels import load_kernels

    kernels = load_kernels()
    if kernels is None:
        print("native kernels unavailable here (see the logged reason)")
        return 1
    if args.prefill_only:
        prefill_only(args)
        return 0
    if not args.only_llamacpp:
        product_sweep(args, kernels)
        if not args.skip_threshold:
            threshold(args)
    if not args.skip_llamacpp:
        versus_llamacpp(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
