"""Two llama.cpp engines in one process, as `localinfer serve` runs two models: each engine
thread keeps its own OpenMP team, and libgomp waits differently once it manages more threads
than the machine has CPUs (backends/llamacpp/omp_wait.py).

Each setting runs in a fresh process (libgomp reads its variables once): two sessions of the
embedded model on llama.cpp, then greedy answers from A, A, B, A, B in turn, ms per token each.
Settings: as localinfer sets the wait (``GOMP_SPINCOUNT`` and ``OMP_WAIT_POLICY``), and with the
spin count alone (the policy libgomp defaults to).

    python -m bench.omp_teams [--tokens 60] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.child import child_env
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.backends.llamacpp.omp_wait import DEFAULT_SPINCOUNT, POLICY_ENV, SPIN_ENV

ORDER = ("A", "A", "B", "A", "B")
SETTINGS = {
    "localinfer's (spin count + ACTIVE)": {},
    "spin count alone": {SPIN_ENV: str(DEFAULT_SPINCOUNT), POLICY_ENV: ""},
}


def child(tokens: int, threads: int) -> list[float]:
    """ms per token of each answer in ORDER, in this process."""
    from localinfer.engine.types import Request, SamplingParams
    from localinfer.session import open_session

    sessions = {name: open_session(None, backend="llamacpp", ctx=512, slots=1, threads=threads)
                for name in "AB"}  # fmt: skip
    try:
        prompt = sessions["A"].chat_prompt_ids([{"role": "user", "content": "Tell a story."}])
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
        out = []
        for name in ORDER:
            began = time.perf_counter()
            sessions[name].engine.generate(Request(list(prompt), params))
            out.append((time.perf_counter() - began) * 1000 / tokens)
        return out
    finally:
        for s in sessions.values():
            s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.omp_teams", description=__doc__)
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.tokens, args.threads)))
        return 0
    order = " ".join(ORDER)
    print(f"omp-teams: two embedded-model engines, llama.cpp, {args.threads} threads, "
          f"{args.tokens} greedy tokens an answer, ms per token in the order {order}")  # fmt: skip
    for label, extra in SETTINGS.items():
        env = {k: v for k, v in child_env().items() if k not in (SPIN_ENV, POLICY_ENV)}
        env.update({k: v for k, v in extra.items() if v})
        cmd = [sys.executable, "-m", "bench.omp_teams", "--child",
               "--tokens", str(args.tokens), "--threads", str(args.threads)]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"{label}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        times = json.loads(done.stdout.strip().splitlines()[-1])
        cells = " ".join(f"{n} {t:5.1f}" for n, t in zip(ORDER, times, strict=True))
        print(f"{label:36s} {cells}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
