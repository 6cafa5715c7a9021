"""Structured output (constrained decoding) benchmark on the embedded SmolLM2-135M, in one run:
  1. schema compile time over the JSON schemas of bench/structured_cases.py
     (p50/max), after the vocabulary index is built once (its time printed apart);
  2. one stream: aggregate decode tok/s of every schema's prompt constrained by its schema vs
     the same prompt free for as many tokens (target: constrained >= 0.9x free);
  3. four busy slots, two of them constrained, vs the same four free;
  4. mask time per token (the constraint's bitmask applied to a logits row, what the sampler
     adds to a constrained token) p50/p99/max, replaying every constrained answer;
and whether every constrained answer parses (and validates, when jsonschema is installed).
Greedy throughout; constrained and free runs interleave per repeat; medians over --repeats.
Runners use the backend's default threads unless --threads says otherwise; run it on a quiet
machine. A table, then one JSON line.
  scripts/bench-structured                     this machine's default backend
  scripts/bench-structured --backend llamacpp --threads 1 --repeats 5
  scripts/bench-structured --quick             8 schemas, 1 repeat (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.structured_cases import CASES, prompt_text
from localinfer.bench.stats import percentile
from localinfer.model_options import BACKENDS

# The engine, the runners and the constraint compiler are imported where they are used, after
# the arguments are parsed: `--help` imports none of them.

TARGET = 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-structured", description="constrained decoding benchmark (JSON schemas)"
    )
    p.add_argument("--backend", choices=BACKENDS, help="default: this machine's default")
    p.add_argument("--threads", type=int, default=None, help="runner threads (default: all cores)")
    p.add_argument("--repeats", type=int, default=3, help="runs per comparison (median taken)")
    p.add_argument("--max-tokens", type=int, default=200, help="cap on a constrained answer")
    p.add_argument("--schemas", type=int, default=len(CASES), help="how many schemas to use")
    p.add_argument("--quick", action="store_true", help="8 schemas, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.schemas, args.repeats = 8, 1
    return args


def validator():
    """(answer text, schema) -> None or raises: jsonschema's when installed, else json.loads."""
    try:
        import jsonschema
    except ImportError:
        return lambda text, schema: json.loads(text), "parse"
    checker = jsonschema.FormatChecker()

    def check(text, schema):
        jsonschema.validate(json.loads(text), schema, format_checker=checker)

    return check, "validate"


def chat_ids(model, content):
    from localinfer.loading.chat_template import ChatTemplate

    template = model.chat_template or ChatTemplate.chatml()
    text = template.render([{"role": "user", "content": content}], add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special_tokens=False)


def ms(seconds):
    return seconds * 1e3


def constrained_answers(runner, tok, work, cases, max_tokens) -> tuple[dict, int, str]:
    """Each workload's constrained answer (the first run: also the warm-up), how many are valid
    and ended on a stop, and how validity was checked."""
    from bench.structured import constrained_request, run_batch

    check, how = validator()
    answers, valid = {}, 0
    for w in work:
        run = run_batch(runner, tok, [constrained_request(w, max_tokens)])
        answers[w.name] = run.token_ids[0]
        try:
            check(tok.decode(list(run.token_ids[0])), cases[w.name][1])
            valid += run.finish_reasons[0] == "stop"
        except Exception as exc:  # noqa: BLE001 - counted and shown
            print(f"   {w.name}: invalid answer ({type(exc).__name__})")
    return answers, valid, how


def main() -> None:
    args = parse_args()
    from bench import structured
    from localinfer.constraints import ConstraintCompiler, ConstraintSpec, vocabulary_from_tokenizer
    from localinfer.session import RunnerSettings, build_runner, open_model

    model = open_model(None).model
    built = build_runner(model, RunnerSettings(args.backend, 1024, 4, threads=args.threads))
    runner, tok = built.runner, model.tokenizer
    print(f"# structured output on the embedded SmolLM2-135M: {built.choice.notice}")
    threads = f"{args.threads} thread(s)" if args.threads else "default threads"
    cases = dict(list(CASES.items())[: args.schemas])
    print(f"# {threads}; {len(cases)} JSON schemas; greedy; median of {args.repeats} repeat(s)")

    started = time.perf_counter()
    compiler = ConstraintCompiler(vocabulary_from_tokenizer(tok, runner.info.vocab_size))
    index_s = time.perf_counter() - started
    specs = [ConstraintSpec("json_schema", schema) for _, schema in cases.values()]
    compiles = structured.compile_times(compiler.compile, specs, repeats=5)
    work = [
        structured.Workload(name, chat_ids(model, prompt_text(q, schema)), compiler.compile(spec))
        for (name, (q, schema)), spec in zip(cases.items(), specs, strict=True)
    ]

    # The constrained answers (first run: also the warm-up); their lengths set the free runs'.
    answers, valid, how = constrained_answers(runner, tok, work, cases, args.max_tokens)

    compared = structured.Comparison(runner, tok, work, answers, args.repeats, args.max_tokens)
    one, busy = structured.single_stream(compared), structured.busy_slots(compared)
    masks = structured.mask_times(work, answers, runner.info.vocab_size)
    runner.close()

    mask_us = {q: percentile(masks, q) * 1e6 for q in (50, 99)}
    print(f"\n   answers: {valid}/{len(work)} valid ({how}), "
          f"{statistics.mean(len(a) for a in answers.values()):.0f} tokens on average")  # fmt: skip
    print(f"   vocabulary index: {index_s:.2f} s once per model; schema compile p50 "
          f"{ms(statistics.median(compiles)):.2f} ms, max {ms(max(compiles)):.2f} ms")  # fmt: skip
    print(f"   mask per token: p50 {mask_us[50]:.0f} us, p99 {mask_us[99]:.0f} us, "
          f"max {max(masks) * 1e6:.0f} us over {len(masks)} tokens")  # fmt: skip
    print("\n   decode               free tok/s   constrained tok/s   ratio   target")
    rows = (("one stream", one), (f"{runner.info.slots} slots, 2 constrained", busy))
    for label, rates in rows:
        ok = "ok" if rates.ratio >= TARGET else "MISSED"
        print(f"   {label:<20} {rates.free_tps:>10.1f}   {rates.constrained_tps:>17.1f}   "
              f"{rates.ratio:>5.2f}x   >= {TARGET}x {ok}")  # fmt: skip
    record = {
        "bench": "structured",
        "backend": built.choice.name,
        "threads": args.threads,
        "schemas": len(work),
        "valid": valid,
        "index_s": index_s,
        "compile_ms": {"p50": ms(statistics.median(compiles)), "max": ms(max(compiles))},
        "mask_us": {
            "p50": mask_us[50],
            "p99": mask_us[99],
            "max": max(masks) * 1e6,
            "tokens": len(masks),
        },  # fmt: skip
        "single": {
            "free_tps": one.free_tps,
            "constrained_tps": one.constrained_tps,
            "ratio": one.ratio,
        },  # fmt: skip
        "busy": {
            "slots": runner.info.slots,
            "constrained": 2,
            "free_tps": busy.free_tps,
            "constrained_tps": busy.constrained_tps,
            "ratio": busy.ratio,
        },  # fmt: skip
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
