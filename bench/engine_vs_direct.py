"""Engine benchmark: N concurrent greedy streams through the Engine, beside the same runner driven
directly with the same batch shapes, in one run (scripts/bench-engine).

For each stream count N the engine run submits N copies of a chat prompt (eos ignored, exactly
``--tokens`` each) and reports aggregate tok/s and TTFT/TPOT p50/p95 from the engine's own metrics.
The reference run drives the runner with no engine: one prefill forward of the N prompts, then
decode forwards of N one-token SlotWorks with a numpy argmax. Engine overhead is measured two ways:

* in-run: the runner is wrapped in a timer, so ``1 - forward time / engine step time`` is the share
  of each engine step spent outside the model (scheduling, sampling, detokenizing, events);
* against the reference: engine tok/s, TTFT and step time beside the direct run's (noisier: the
  two runs do not share the machine's moment).

Runs alternate engine/direct and repeat; the medians are printed (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

# numpy, the runners' types and the engine are imported where they are used, after the
# arguments are parsed: `--help` imports none of them.
if TYPE_CHECKING:
    import numpy as np

    from localinfer.backends.base import MemoryReport, Runner, SlotWork
    from localinfer.engine.engine import Engine

PROMPT = "What is the capital of France?"


class TimedRunner:
    """A Runner that forwards to another and adds up the time spent in ``forward``."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.info = inner.info
        self.forward_s = 0.0
        self.forwards = 0

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        try:
            return self.inner.forward(batch)
        finally:
            self.forward_s += time.perf_counter() - t0
            self.forwards += 1

    def slot_length(self, slot: int) -> int:
        return self.inner.slot_length(slot)

    def truncate(self, slot: int, length: int) -> None:
        self.inner.truncate(slot, length)

    def release(self, slot: int) -> None:
        self.inner.release(slot)

    def memory(self) -> MemoryReport:
        return self.inner.memory()

    def close(self) -> None:
        self.inner.close()


@dataclass(slots=True)
class EngineRun:
    tok_s: float
    ttft_p50: float
    ttft_p95: float
    tpot_p50: float
    tpot_p95: float
    step_s: float  # wall time per engine step
    forward_step_s: float  # runner.forward time per engine step
    forward_share: float  # forward time / wall time, over the whole run


@dataclass(slots=True)
class DirectRun:
    tok_s: float
    prefill_s: float
    step_s: float  # median decode forward + argmax


def run_engine(
    engine: Engine, timed: TimedRunner, prompt: list[int], n: int, tokens: int
) -> EngineRun:
    from localinfer.engine.metrics import percentile
    from localinfer.engine.types import Request, SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    steps0 = engine.metrics().steps
    timed.forward_s, timed.forwards = 0.0, 0
    t0 = time.perf_counter()
    # Queued at once so they share the first step, as the direct run's batch does.
    handles = engine.submit_all([Request(list(prompt), params) for _ in range(n)])
    results = [h.result() for h in handles]
    wall = time.perf_counter() - t0
    steps = engine.metrics().steps - steps0
    for r in results:
        if r.finish_reason != "length" or len(r.token_ids) != tokens:
            raise RuntimeError(f"bench request ended early: {r.finish_reason} {r.error}")
    ttft = [r.metrics.ttft_s for r in results if r.metrics and r.metrics.ttft_s is not None]
    tpot = [r.metrics.tpot_s for r in results if r.metrics and r.metrics.tpot_s is not None]
    return EngineRun(
        tok_s=n * tokens / wall,
        ttft_p50=percentile(ttft, 50) or 0.0,
        ttft_p95=percentile(ttft, 95) or 0.0,
        tpot_p50=percentile(tpot, 50) or 0.0,
        tpot_p95=percentile(tpot, 95) or 0.0,
        step_s=wall / max(steps, 1),
        forward_step_s=timed.forward_s / max(timed.forwards, 1),
        forward_share=timed.forward_s / wall,
    )


def run_direct(runner: Runner, prompt: list[int], n: int, tokens: int) -> DirectRun:
    import numpy as np

    from localinfer.backends.base import SlotWork

    for s in range(n):
        runner.release(s)
    t0 = time.perf_counter()
    outs = runner.forward([SlotWork(s, tuple(prompt), 0) for s in range(n)])
    nxt = [int(np.argmax(o[-1])) for o in outs]
    prefill = time.perf_counter() - t0
    steps: list[float] = []
    for _ in range(tokens - 1):
        t = time.perf_counter()
        batch = [SlotWork(s, (nxt[s],), runner.slot_length(s)) for s in range(n)]
        outs = runner.forward(batch)
        nxt = [int(np.argmax(o[-1])) for o in outs]
        steps.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    for s in range(n):
        runner.release(s)
    return DirectRun(tok_s=n * tokens / wall, prefill_s=prefill, step_s=statistics.median(steps))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench-engine", description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="default: the embedded smollm2-135m")
    ap.add_argument("--backend", choices=("torch", "llamacpp", "mlx"))
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--streams", default="1,2,4,8", help="comma-separated stream counts")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.streams.split(",")]

    from localinfer.engine.engine import Engine
    from localinfer.session import open_session

    t_load = time.perf_counter()
    session = open_session(
        args.model, backend=args.backend, ctx=args.ctx, slots=max(counts), dtype=args.dtype
    )
    # Rebuild the engine over a timed view of the same runner (the session's engine stays idle).
    runner = session.engine.runner
    timed = TimedRunner(runner)
    engine = Engine(timed, session.model.tokenizer, prefill_chunk=512)
    # A base model has no chat: it is given the question as plain text.
    prompt = (
        session.raw_prompt_ids(PROMPT)
        if session.base_model
        else session.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    )
    info = runner.info
    print(
        f"model {session.model.name} · {session.runner_notice} · dtype {info.dtype} · "
        f"quant {info.quant} · prompt {len(prompt)} tokens · {args.tokens} tokens/stream · "
        f"median of {args.repeats} · load {time.perf_counter() - t_load:.1f} s",
        flush=True,
    )
    try:
        run_direct(runner, prompt, 1, 4)  # warm-up: first-call allocations
        run_engine(engine, timed, prompt, 1, 4)
        header = (
            f"{'streams':>7} | {'engine tok/s':>12} {'direct tok/s':>12} {'ratio':>6} | "
            f"{'TTFT p50':>8} {'TTFT p95':>8} {'direct':>8} {'TPOT p50':>8} {'TPOT p95':>8} | "
            f"{'direct step':>11} {'engine step':>11} {'of it fwd':>9} {'overhead':>8}"
        )
        print(header)
        print("-" * len(header))
        for n in counts:
            eng: list[EngineRun] = []
            ref: list[DirectRun] = []
            for _ in range(args.repeats):
                ref.append(run_direct(runner, prompt, n, args.tokens))
                eng.append(run_engine(engine, timed, prompt, n, args.tokens))
            e_tok = statistics.median(r.tok_s for r in eng)
            d_tok = statistics.median(r.tok_s for r in ref)
            d_step = statistics.median(r.step_s for r in ref)
            e_step = statistics.median(r.step_s for r in eng)
            e_fwd = statistics.median(r.forward_step_s for r in eng)
            overhead = 1.0 - statistics.median(r.forward_share for r in eng)
            print(
                f"{n:>7} | {e_tok:>12.1f} {d_tok:>12.1f} {e_tok / d_tok:>6.2f} | "
                f"{_ms(eng, 'ttft_p50')} {_ms(eng, 'ttft_p95')} "
                f"{statistics.median(r.prefill_s for r in ref) * 1000:>5.0f} ms "
                f"{_ms(eng, 'tpot_p50')} {_ms(eng, 'tpot_p95')} | "
                f"{d_step * 1000:>8.1f} ms {e_step * 1000:>8.1f} ms {e_fwd * 1000:>6.1f} ms "
                f"{overhead:>8.1%}",
                flush=True,
            )
        print(
            "ratio = engine tok/s / direct tok/s (same runner, same batch shapes, runs alternate); "
            "TTFT direct = the direct run's prefill forward of all N prompts; "
            "engine step = engine wall time / steps; of it fwd = time inside runner.forward per "
            "step; overhead = share of engine wall time spent outside runner.forward (scheduling, "
            "sampling, detokenizing, events, thread hand-offs)"
        )
    finally:
        engine.close()
        session.close()
    return 0


def _ms(runs: list[EngineRun], name: str) -> str:
    return f"{statistics.median(getattr(r, name) for r in runs) * 1000:>5.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
