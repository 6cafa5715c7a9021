"""Prefix reuse benchmark: TTFT of turns 1..8 of one chat about a pasted document, growing to about
2,000 tokens, with prefix reuse on (the session default) and off, side by side in one run.
  scripts/bench-prefix                          embedded model, this machine's default backend
  scripts/bench-prefix --backend torch --repeats 5 --answer-tokens 128
Each turn runs on the reuse session (which writes the answer that goes into the history) and
then, with the same prompt, on a session without reuse (one token: only its TTFT counts).
Figures are medians over --repeats conversations; each repeat starts a fresh reuse session, so
turn 1 is cold in both columns.
Then the KV-tier rows of issue #24 (bench/kv_tiers.py), each warm vs cold in one run:
(i) two conversations alternating on one slot, RAM tier on/off; (ii) eight conversations sharing
a ~1,000-token system prompt on 4 slots, prefix copy on/off; (iii) a ~2,000-token conversation
reopened by a new process through the disk tier, against a new process without it.
  scripts/bench-prefix --tiers-only --rows i,iii   only those tier rows
  scripts/bench-prefix --no-tiers                  only the turns table
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

# The engine, the session and the KV-tier rows (bench/kv_tiers.py) are imported where they are
# used, after the arguments are parsed: `--help` imports none of them.

QUESTIONS = [
    "Summarise this document in a few sentences.",
    "Which class does a program create first, and why?",
    "How are positional arguments different from optional ones?",
    "What does the 'action' keyword do? Give two examples.",
    "How would I add a --verbose flag?",
    "What happens when the user passes an invalid argument?",
    "How do sub-commands work?",
    "Write a short example program that uses everything we discussed.",
]


def document() -> str:
    # A real, fixed, offline text of about 580 tokens: the argparse module's own docstring.
    import argparse as doc_module

    return (doc_module.__doc__ or "").strip()


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-prefix")
    ap.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    ap.add_argument("--backend", choices=("torch", "llamacpp", "mlx"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="per slot")
    ap.add_argument("--turns", type=int, default=8, choices=range(1, len(QUESTIONS) + 1))
    ap.add_argument("--answer-tokens", type=int, default=192, help="max tokens per answer")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-tiers", action="store_true", help="skip the KV-tier rows")
    ap.add_argument("--tiers-only", action="store_true", help="only the KV-tier rows")
    ap.add_argument("--rows", default="i,ii,iii", help="which KV-tier rows (default: i,ii,iii)")
    ap.add_argument("--tier-turns", type=int, default=3, help="row i: turns per conversation")
    ap.add_argument("--tier-repeats", type=int, default=2, help="row iii: new processes each")
    ap.add_argument("--tier-answer-tokens", type=int, default=32, help="rows i-iii: answers")
    args = ap.parse_args()
    rows = {r.strip() for r in args.rows.split(",") if r.strip()}
    if not rows <= {"i", "ii", "iii"}:
        ap.error(f"--rows takes i, ii and iii, got {args.rows!r}")
    if not args.tiers_only:
        turns_table(args)
    if not args.no_tiers:
        tier_rows(args, rows)
    return 0


def tier_rows(args: argparse.Namespace, rows: set[str]) -> None:
    from bench import kv_tiers

    open_kw = dict(model_spec=args.model, backend=args.backend, ctx=args.ctx, threads=args.threads)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    out = []
    t0 = time.perf_counter()
    if "i" in rows:
        out.append(kv_tiers.alternating_row(open_kw, args.tier_turns, args.tier_answer_tokens))
        log(f"row i done, {time.perf_counter() - t0:.0f} s elapsed")
    if "ii" in rows:
        out.append(kv_tiers.shared_system_row(open_kw, args.tier_answer_tokens))
        log(f"row ii done, {time.perf_counter() - t0:.0f} s elapsed")
    if "iii" in rows:
        reps, answer = args.tier_repeats, args.tier_answer_tokens
        out.append(kv_tiers.disk_restart_row(open_kw, reps, answer, log))
        log(f"row iii done, {time.perf_counter() - t0:.0f} s elapsed")
    print(kv_tiers.header())
    for row in out:
        print(row.line())


def turns_table(args: argparse.Namespace) -> None:
    from localinfer.engine import Request, SamplingParams
    from localinfer.session import open_session

    common = dict(backend=args.backend, ctx=args.ctx, slots=args.slots, threads=args.threads)
    t0 = time.perf_counter()
    off = open_session(args.model, prefix_reuse=False, **common)
    print(
        f"model {off.model.name} · {off.runner_notice} · {args.slots} slots × {args.ctx} ctx · "
        f"answers up to {args.answer_tokens} tokens · median of {args.repeats} · "
        f"load {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    answer = SamplingParams(max_tokens=args.answer_tokens)
    probe = SamplingParams(max_tokens=1)
    # [repeat][turn] -> (prompt tokens, cached tokens, ttft on, ttft off)
    runs: list[list[tuple[int, int, float, float]]] = []
    try:
        off.engine.generate(Request(off.raw_prompt_ids("warm up"), probe))
        for rep in range(args.repeats):
            with open_session(args.model, prefix_reuse=True, **common) as on:
                on.engine.generate(Request(on.raw_prompt_ids("warm up"), probe))
                messages = [
                    {"role": "system", "content": "You answer questions about a document."},
                ]
                rows = []
                for turn, question in enumerate(QUESTIONS[: args.turns]):
                    content = f"{document()}\n\n{question}" if turn == 0 else question
                    messages.append({"role": "user", "content": content})
                    ids = on.chat_prompt_ids(messages)
                    warm = on.engine.generate(Request(ids, answer))
                    cold = off.engine.generate(Request(ids, probe))
                    assert warm.metrics is not None and cold.metrics is not None
                    assert cold.metrics.cached_tokens == 0
                    m_on, m_off = warm.metrics, cold.metrics
                    rows.append((len(ids), m_on.cached_tokens, m_on.ttft_s or 0.0,
                                 m_off.ttft_s or 0.0))  # fmt: skip
                    messages.append({"role": "assistant", "content": warm.text})
                hit = on.engine.metrics().prefix_hit_rate
                runs.append(rows)
                print(f"repeat {rep + 1}/{args.repeats}: {len(rows)} turns, last prompt "
                      f"{rows[-1][0]} tokens, {time.perf_counter() - t0:.0f} s elapsed",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        off.close()

    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'prefilled':>9} "
          f"{'TTFT reuse':>11} {'TTFT no reuse':>14} {'ratio':>6}")  # fmt: skip
    ratios = []
    for turn in range(args.turns):
        prompt, cached = runs[0][turn][0], runs[0][turn][1]
        on_s = statistics.median(r[turn][2] for r in runs)
        off_s = statistics.median(r[turn][3] for r in runs)
        ratio = on_s / off_s if off_s > 0 else float("nan")
        if turn > 0:
            ratios.append(ratio)
        print(f"{turn + 1:>4} {prompt:>7} {cached:>7} {prompt - cached:>9} "
              f"{on_s * 1000:>9.0f}ms {off_s * 1000:>12.0f}ms {ratio:>6.2f}")  # fmt: skip
    if ratios:
        worst = max(ratios)
        verdict = "meets" if worst <= 0.3 else "MISSES"
        print(f"turns 2..{args.turns}: TTFT with reuse / without, worst {worst:.2f}, median "
              f"{statistics.median(ratios):.2f} ({verdict} the <= 0.30 target)")  # fmt: skip
    if hit is not None:
        print(f"engine prefix_hit_rate (cached / prompt tokens, last repeat): {hit:.2f}")


if __name__ == "__main__":
    sys.exit(main())
