"""How llama.cpp's threads should wait while the chat's UI thread needs a slice.

For each setting (libgomp's OMP_WAIT_POLICY / GOMP_SPINCOUNT, the thread count, Python's
switch interval), a fresh process decodes the same greedy request on the embedded model alone,
beside a neighbour thread holding the GIL BURST ms every PERIOD ms (as Textual renders), and
beside one doing the same with the GIL released (CPU only). Settings take turns for --rounds
rounds; prints the median tok/s per setting and neighbour and each busy/alone ratio.
bench/chat_wait.py has the details.

    scripts/bench-chat-wait
    scripts/bench-chat-wait --rounds 3 --tokens 200 --cases default,passive,spin10k
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

CASES = {
    "default": {"env": (("GOMP_SPINCOUNT", "300000"),)},  # libgomp's own default
    "passive": {"env": (("OMP_WAIT_POLICY", "PASSIVE"),)},
    "active": {"env": (("OMP_WAIT_POLICY", "ACTIVE"),)},
    "spin1k": {"env": (("GOMP_SPINCOUNT", "1000"),)},  # localinfer's default
    "spin3k": {"env": (("GOMP_SPINCOUNT", "3000"),)},
    "spin10k": {"env": (("GOMP_SPINCOUNT", "10000"),)},
    "spin30k": {"env": (("GOMP_SPINCOUNT", "30000"),)},
    "spin100k": {"env": (("GOMP_SPINCOUNT", "100000"),)},
    "threads1": {"threads": 1},
    "switch1ms": {"switch_interval_s": 0.001},
    "spin10k+switch1ms": {"env": (("GOMP_SPINCOUNT", "10000"),), "switch_interval_s": 0.001},
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-chat-wait",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", default="default,passive,spin10k,spin100k,threads1")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--burst-ms", type=float, default=3.0)
    p.add_argument("--period-ms", type=float, default=33.0)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    from bench.chat_wait import NEIGHBOURS, Neighbour, WaitCase, measure_in_child

    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    cases = [WaitCase(name=n, **CASES[n]) for n in names]
    shape = Neighbour(args.burst_ms, args.period_ms)
    runs: dict[str, list[dict]] = {c.name: [] for c in cases}
    for r in range(args.rounds):
        for case in cases:
            load = os.getloadavg()[0]
            got = measure_in_child(case, args.tokens, shape)
            runs[case.name].append(got)
            figures = "  ".join(f"{k} {got[k] or 0:6.1f}" for k in NEIGHBOURS)
            print(f"round {r + 1} {case.name:18s} load {load:5.2f}  {figures}", flush=True)
    print(
        f"\nmedian tok/s over {args.rounds} rounds, {args.tokens} tokens; neighbour "
        f"{args.burst_ms} ms every {args.period_ms} ms"
    )
    for name, got in runs.items():
        med = {k: statistics.median(g[k] or 0.0 for g in got) for k in NEIGHBOURS}
        ratios = [g["gil"] / g["none"] for g in got if g["none"]]
        nogil = [g["nogil"] / g["none"] for g in got if g["none"]]
        print(
            f"{name:18s} alone {med['none']:6.1f}  gil {med['gil']:6.1f} "
            f"({statistics.median(ratios):.2f}x)  nogil {med['nogil']:6.1f} "
            f"({statistics.median(nogil):.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
