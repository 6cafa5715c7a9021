"""A conversation past the context (#39): TTFT of the first question after a cut, against a cold
prefill of what the model then sees, on the embedded model with llama.cpp and torch.
  scripts/bench-context-cut                       both backends, 5 repeats, ctx 2048
  scripts/bench-context-cut --backend torch --repeats 9

Each repeat opens nothing new: on the chat's session (one slot, chunk reuse as `localinfer chat`
opens it) a conversation of about 1,900 tokens is answered turn by turn up to the context's edge,
as the chat would (each answer generated, so the slot holds exactly what the next prompt
repeats); then one more question no longer fits, the chat's fit (context_fit.fit_with_room)
leaves out the oldest turns, and that prompt's TTFT is measured (the kept turns' KV moved into
place, only the question prefilled). The cold figure is the same prompt on a session without any
reuse. Each repeat uses other words, so nothing carries over between repeats. Figures are
medians; the target is a ratio of at most 0.3.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Any

from localinfer.context_fit import fit_with_room
from localinfer.tui.settings import CHAT_CHUNK_REUSE

# The engine and the session are imported where they are used: `--help` imports neither.

TOPICS = ("rivers", "mountains", "bridges", "forests", "harbours", "deserts", "glaciers", "cities")
MAX_TOKENS = 256  # the answer's room a cut leaves (the chat's max-tokens setting)
ANSWER_TOKENS = 24  # what each earlier turn's answer is (generated, greedy)


@dataclass(slots=True)
class CutRun:
    """One repeat: the prompt after the cut, what it reused, and both TTFTs."""

    prompt_tokens: int
    cached_tokens: int
    dropped: int
    ttft_cut_s: float
    ttft_cold_s: float


def question(repeat: int, turn: int) -> str:
    topic = TOPICS[repeat % len(TOPICS)]
    return (
        f"Tell me about {topic} number {turn} (round {repeat}): where they are, how old they are, "
        f"and one story people tell about them."
    )


def ask(session: Any, messages: list[dict[str, str]], max_tokens: int, rid: str) -> Any:
    """The last event of a greedy request for ``messages``."""
    from localinfer.engine import Request, SamplingParams

    ids = session.chat_prompt_ids(messages)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    events = list(session.engine.submit(Request(ids, params, rid)))
    text = "".join(e.text for e in events)
    last = events[-1]
    if last.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"{rid}: {last.finish_reason}: {last.error}")
    return text, last


def one_repeat(chat: Any, cold: Any, repeat: int, ctx: int) -> CutRun:
    """Fill the chat's slot turn by turn to the context's edge, then measure the cut."""

    def count(m: Any) -> int:
        return len(chat.chat_prompt_ids(m))

    messages: list[dict[str, str]] = []
    turn = 0
    while True:
        messages.append({"role": "user", "content": question(repeat, turn)})
        fit = fit_with_room(messages, count, ctx, MAX_TOKENS, "drop-oldest")
        if fit.dropped:
            break
        text, _ = ask(chat, messages, ANSWER_TOKENS, f"r{repeat}-t{turn}")
        messages.append({"role": "assistant", "content": text})
        turn += 1
    _, after = ask(chat, fit.messages, 1, f"r{repeat}-cut")
    _, cold_end = ask(cold, fit.messages, 1, f"r{repeat}-cold")
    metrics = after.metrics
    return CutRun(metrics.prompt_tokens, metrics.cached_tokens, fit.dropped,
                  metrics.ttft_s, cold_end.metrics.ttft_s)  # fmt: skip


def bench_backend(backend: str, args: argparse.Namespace) -> list[CutRun]:
    from localinfer.session import open_session

    common = {"backend": backend, "ctx": args.ctx, "slots": 1, "threads": args.threads}
    chat = open_session(cache_reuse=CHAT_CHUNK_REUSE, **common)
    cold = open_session(prefix_reuse=False, **common)
    try:
        one_repeat(chat, cold, len(TOPICS) - 1, args.ctx)  # warm-up: first-call costs
        return [one_repeat(chat, cold, r, args.ctx) for r in range(args.repeats)]
    finally:
        chat.close()
        cold.close()


def report(backend: str, runs: list[CutRun]) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    cut = median([r.ttft_cut_s for r in runs])
    cold = median([r.ttft_cold_s for r in runs])
    prompt = median([r.prompt_tokens for r in runs])
    cached = median([r.cached_tokens for r in runs])
    dropped = median([r.dropped for r in runs])
    ratios = [r.ttft_cut_s / r.ttft_cold_s for r in runs]
    return (
        f"{backend:9} {prompt:7.0f} {cached:7.0f} {dropped:8.0f} {cut * 1000:10.1f} "
        f"{cold * 1000:10.1f} {cut / cold:6.2f}  (per-run ratios "
        f"{min(ratios):.2f}..{max(ratios):.2f})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-context-cut")
    ap.add_argument("--backend", choices=("llamacpp", "torch", "mlx"), action="append")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    backends = args.backend or ["llamacpp", "torch"]
    print(f"embedded model, ctx {args.ctx}, one slot, chunk reuse {CHAT_CHUNK_REUSE}, "
          f"{args.repeats} repeats (medians)")  # fmt: skip
    print(f"{'backend':9} {'prompt':>7} {'cached':>7} {'dropped':>8} {'cut TTFT':>10} "
          f"{'cold TTFT':>10} {'ratio':>6}")  # fmt: skip
    worst = 0.0
    for backend in backends:
        runs = bench_backend(backend, args)
        print(report(backend, runs), flush=True)
        worst = max(worst, statistics.median([r.ttft_cut_s for r in runs])
                    / statistics.median([r.ttft_cold_s for r in runs]))  # fmt: skip
    print(f"target: ratio <= 0.30 on each backend: {'met' if worst <= 0.3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
