"""Speculative decoding benchmark on the embedded SmolLM2-135M, in one run:
  1. the cost of verifying k extra tokens in one target forward (vs a one-token decode);
  2. decode tokens/s without speculation and with n-gram lookup, on an editing workload (the
     answer rewrites a given text with a small change) and on free chat, plus acceptance;
  3. the same at 1..N busy slots, to show where speculation stops paying (max_busy_slots);
  4. the draft-model path with a self-draft: the embedded model's Q4_1 blocks (torch's native
     kernels, then llama.cpp) drafting for the same model dequantized to fp32 (torch), reported
     as measured.
Targets: torch (the CPU default for this file: native kernels on its Q4_1 blocks), llamacpp,
torch-fp32 (the same model dequantized to float32).
Greedy throughout; every speculative answer is checked token-identical to the plain one.
Runners use all cores unless --threads says otherwise; run it on a quiet machine.
  scripts/bench-speculative                          torch (Q4_1 blocks) and llama.cpp targets
  scripts/bench-speculative --backends torch --repeats 5 --max-tokens 128
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench.spec_workloads import CHAT, EDITING
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.embedded import embedded_model_path

# The engine, the runners and the model loader are imported where they are used, after the
# arguments are parsed: `--help` imports none of them.

TARGET_EDIT, TARGET_CHAT = 1.5, 0.95


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-speculative", description="speculative decoding benchmark"
    )
    p.add_argument(
        "--backends", default="torch,llamacpp",
        help="targets, in order: torch (Q4_1 blocks), llamacpp, torch-fp32",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=None,
        help="runner threads (default: the backend's own, all cores; 1 is steadier on a busy box)",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="runs per prompt (median taken)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--busy", default="1,2,4", help="slot counts for the busy-batch table")
    p.add_argument("--skip-draft", action="store_true", help="skip the self-draft runs")
    p.add_argument("--draft-tokens", type=int, default=96, help="max tokens in the draft runs")
    return p.parse_args()


def chat_ids(model, text):
    template = model.chat_template or ChatTemplate.chatml()
    rendered = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return model.tokenizer.encode(rendered, add_special_tokens=False)


def run(runner, tok, prompts, max_tokens, speculator=None):
    """Greedy answers for prompts decoding together; (token ids, aggregate decode tok/s, metrics).

    Decode speed counts the tokens after each request's first one over the span from the
    first first-token to the last token (prefill is the same with and without speculation).
    """
    from bench.structured import decode_together
    from localinfer.engine import Engine, Request, SamplingParams

    engine = Engine(runner, tok, background=False, speculator=speculator)
    params = SamplingParams(max_tokens=max_tokens)
    done = decode_together(engine, [Request(p, params) for p in prompts])
    tps = done.decode_tokens / done.decode_s if done.decode_s > 0 else float("nan")
    return [list(ids) for ids in done.token_ids], tps, engine.metrics()


def compare(runner, tok, prompts, args, config, label, slots=1):
    """Plain vs n-gram, interleaved per repeat; medians of aggregate decode tok/s."""
    from localinfer.engine.speculative import Speculator

    plain_tps, spec_tps, metrics = [], [], []
    groups = (
        [prompts[i : i + slots] for i in range(0, len(prompts), slots)]
        if slots == 1
        else [(prompts * slots)[:slots]]
    )
    for _ in range(args.repeats):
        for group in groups:
            ids_a, a, _ = run(runner, tok, group, args.max_tokens)
            ids_b, b, m = run(runner, tok, group, args.max_tokens, Speculator(config))
            if ids_a != ids_b:
                raise SystemExit(f"{label}: speculative output differs from plain decoding")
            plain_tps.append(a)
            spec_tps.append(b)
            metrics.append(m)
    p, s = statistics.median(plain_tps), statistics.median(spec_tps)
    proposed = sum(m.spec_proposed for m in metrics)
    accepted = sum(m.spec_accepted for m in metrics)
    tpf = statistics.median(m.tokens_per_target_forward or 1.0 for m in metrics)
    rate = accepted / proposed if proposed else float("nan")
    return p, s, rate, tpf


def bench_backend(backend, model, edit, chat, args) -> None:
    from bench.spec_replay import fit_cost, verification_costs
    from localinfer.backends.base import RunnerConfig
    from localinfer.engine.speculative import SpecConfig

    tok = model.tokenizer
    busy = [int(x) for x in args.busy.split(",")]
    config = RunnerConfig(slots=max(busy), max_ctx=1024, threads=args.threads, dtype="float32")
    runner, notice = target_runner(model, config, backend)
    threads = f"{args.threads} thread(s)" if args.threads else "default threads (all cores)"
    print(f"\n## {notice}, {threads}")
    one, costs = verification_costs(runner, edit[0])
    per_token, fixed = fit_cost(costs)
    print(
        f"1. verification cost: a 1-token decode step takes {one * 1e3:.1f} ms; a forward of "
        "k+1 tokens costs (in steps): " + ", ".join(f"k={k}: {c:.2f}" for k, c in costs.items())
    )
    spec_config = SpecConfig(verify_cost=per_token, verify_fixed=fixed, max_busy_slots=config.slots)
    print(
        f"   -> fit 1 + {fixed:.2f} + {per_token:.3f} k: SpecConfig(verify_cost={per_token:.3f}, "
        f"verify_fixed={fixed:.2f}, k_max={spec_config.k_max}) used below"
    )

    print("2. one stream            plain tok/s   n-gram tok/s   ratio   accept   tok/fwd   target")
    workloads = (("editing", edit, TARGET_EDIT), ("free chat", chat, TARGET_CHAT))
    for label, prompts, target in workloads:
        p, s, rate, tpf = compare(runner, tok, prompts, args, spec_config, label)
        ok = "ok" if s / p >= target else "MISSED"
        print(
            f"   {label:<20} {p:>11.1f}   {s:>12.1f}   {s / p:>5.2f}x   {rate:>6.2f}   "
            f"{tpf:>7.2f}   >= {target}x {ok}"
        )

    print("3. busy batch (editing prompts on every slot; aggregate decode tok/s)")
    print("   slots   plain tok/s   n-gram tok/s   ratio")
    for n in busy:
        p, s, _, _ = compare(runner, tok, edit, args, spec_config, f"busy {n}", slots=n)
        print(f"   {n:>5}   {p:>11.1f}   {s:>12.1f}   {s / p:>5.2f}x")
    print(
        "   speculation pays while the ratio is above 1: SpecConfig.max_busy_slots should be "
        "the largest such slot count (default 2)"
    )
    runner.close()
    return spec_config


def target_runner(model, config, name):
    """torch-fp32: the torch runner on the model dequantized to float32 (float weights asked
    for by name); other names are backends as choose_backend takes them."""
    if name == "torch-fp32":
        runner, notice = runner_for(model, dataclasses.replace(config, quant="float32"), "torch")
        return runner, notice + "; weights dequantized to float32"
    return runner_for(model, config, name)


def runner_for(model, config, backend):
    """(runner, one-line notice) of ``backend`` (None: the default choice) at ``config``."""
    from localinfer.backends.select import choose_backend, create_runner

    choice = choose_backend(backend, model.format, model.file_quant, model.config.arch)
    return create_runner(model, config, choice), choice.notice


def bench_draft(model, edit, chat, args, draft_backend, fp32_config=None) -> None:
    from localinfer.backends.base import RunnerConfig
    from localinfer.engine.speculative import DraftProposer, SpecConfig, Speculator
    from localinfer.speculation import default_spec_config

    tok = model.tokenizer
    kind = "torch native kernels" if draft_backend == "torch" else "llama.cpp"
    print(f"\n## draft model: embedded Q4_1 ({kind}) drafting for the same model in fp32 (torch)")
    cfg = RunnerConfig(slots=1, max_ctx=1024, threads=args.threads, dtype="float32")
    target = target_runner(model, cfg, "torch-fp32")[0]
    draft_runner = runner_for(model, cfg, draft_backend)[0]
    # The fp32 target's verification costs as measured above (else the shipped defaults);
    # the draft's own cost starts at the default guess and is measured while it runs.
    base = fp32_config or default_spec_config("torch", "cpu", with_draft=True)
    draft_cfg = SpecConfig(
        verify_cost=base.verify_cost, verify_fixed=base.verify_fixed, draft_cost=0.3,
        max_busy_slots=1,
    )  # fmt: skip
    # One Speculator for the whole section, as a server keeps one: the draft's measured cost
    # carries over from request to request (the first request pays for measuring it).
    speculator = Speculator(draft_cfg, DraftProposer(draft_runner, tok.vocab_size))
    for label, prompts in (("editing", edit[:2]), ("free chat", chat[:2])):
        plain, spec, rates = [], [], []
        for _ in range(args.repeats):
            for pr in prompts:
                ids_a, a, _ = run(target, tok, [pr], args.draft_tokens)
                speculator.draft.reset()  # no prompt left cached from an earlier repeat
                ids_b, b, m = run(target, tok, [pr], args.draft_tokens, speculator)
                if ids_a != ids_b:
                    raise SystemExit(f"draft {label}: output differs from plain decoding")
                plain.append(a)
                spec.append(b)
                rates.append(m.spec_acceptance_rate or 0.0)
        p, s = statistics.median(plain), statistics.median(spec)
        print(
            f"   {label:<20} torch fp32 {p:>6.1f} tok/s   + draft {s:>6.1f} tok/s   "
            f"{s / p:>5.2f}x   acceptance {statistics.median(rates):.2f}"
        )
    print(
        f"   a draft token measured at {speculator.draft_cost:.2f} target steps; speculation "
        "pauses where it cannot pay"
    )
    target.close()
    draft_runner.close()


def main() -> None:
    args = parse_args()
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path(), name="smollm2-135m")
    edit = [chat_ids(model, t) for t in EDITING]
    chat = [chat_ids(model, t) for t in CHAT]
    print("# speculative decoding on the embedded SmolLM2-135M")
    print(
        f"# greedy, {args.max_tokens} new tokens, median of {args.repeats} repeat(s) per prompt;"
        " plain and speculative runs interleaved"
    )
    measured = {}
    for backend in args.backends.split(","):
        measured[backend] = bench_backend(backend, model, edit, chat, args)
    if not args.skip_draft:
        for draft_backend in ("torch", "llamacpp"):
            bench_draft(model, edit, chat, args, draft_backend, measured.get("torch-fp32"))


if __name__ == "__main__":
    main()
