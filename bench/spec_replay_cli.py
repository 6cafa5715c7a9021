"""Speculation policy replay on the embedded SmolLM2-135M, in one run:
  1. records plain greedy answers (editing and free-chat prompts of scripts/bench-speculative
     and the shipped bench prompts) and times verification forwards of k+1 tokens on the same
     runner;
  2. replays every answer through the real Speculator (n-gram lookup) under SpecConfig
     variants, charging each verification its measured cost (bench/spec_replay.py),
     and prints the modelled speed-up per workload: median and worst answer.
The model is not run again for the variants, so they are compared on identical answers and
costs; scripts/bench-speculative measures the real speed of the shipped settings.
  scripts/spec-replay                              llama.cpp, 96 and 256 new tokens
  scripts/spec-replay --backend torch --max-tokens 128
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench.spec_workloads import CHAT, EDITING
from localinfer.bench.prompts import load_prompts
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.embedded import embedded_model_path

# The engine, the runners, the model loader and the replay (bench/spec_replay.py) are imported
# where they are used, after the arguments are parsed: `--help` imports none of them.


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/spec-replay", description="replay greedy answers under speculation settings"
    )
    p.add_argument("--backend", default="llamacpp")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-tokens", default="96,256", help="answer lengths replayed")
    return p.parse_args()


def chat_ids(model, text):
    template = model.chat_template or ChatTemplate.chatml()
    rendered = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return tuple(model.tokenizer.encode(rendered, add_special_tokens=False))


def record(runner, model, prompts, max_tokens):
    from bench.spec_replay import Recorded
    from localinfer.engine import Engine, Request, SamplingParams

    engine = Engine(runner, model.tokenizer, background=False)
    out = []
    for label, ids in prompts:
        handle = engine.submit(Request(list(ids), SamplingParams(max_tokens=max_tokens)))
        while engine.has_work():
            engine.step()
        out.append(Recorded(label, ids, tuple(handle.result().token_ids)))
    return out


def main() -> None:
    args = parse_args()
    from bench.spec_replay import fit_cost, interpolated_cost, replay, verification_costs
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.select import choose_backend, create_runner
    from localinfer.loading.loader import load_model
    from localinfer.speculation import default_spec_config

    model = load_model(embedded_model_path(), name="smollm2-135m")
    prompts = [("editing", chat_ids(model, t)) for t in EDITING]
    prompts += [("free chat", chat_ids(model, t)) for t in CHAT]
    for p in load_prompts():
        prompts.append((f"bench {p.size}", chat_ids(model, p.messages[-1]["content"])))
    lengths = [int(x) for x in args.max_tokens.split(",")]
    config = RunnerConfig(slots=1, max_ctx=2048, threads=args.threads, dtype="float32")
    choice = choose_backend(args.backend, model.format, model.file_quant, model.config.arch)
    runner, notice = create_runner(model, config, choice), choice.notice
    one, costs = verification_costs(runner, prompts[0][1])
    per_token, fixed = fit_cost(costs)
    cost = interpolated_cost({0: 1.0, **costs})
    print(
        f"# {notice}; a 1-token step {one * 1e3:.1f} ms; verification of k proposals (steps): "
        + ", ".join(f"k={k}: {c:.2f}" for k, c in costs.items())
    )
    recordings = record(runner, model, prompts, max(lengths))
    runner.close()
    shipped = dataclasses.replace(
        default_spec_config(args.backend, "cpu"), verify_cost=per_token, verify_fixed=fixed
    )
    variants = {
        "shipped (fit costs)": shipped,
        "ngram_min 2": dataclasses.replace(shipped, ngram_min=2),
        "ngram_min 4": dataclasses.replace(shipped, ngram_min=4),
        "prior 0.8": dataclasses.replace(shipped, prior_acceptance=0.8),
        "prior 0.95": dataclasses.replace(shipped, prior_acceptance=0.95),
        "k_max 8": dataclasses.replace(shipped, k_max=8),
        "k_max 32": dataclasses.replace(shipped, k_max=32),
        "min_gain 1.0": dataclasses.replace(shipped, min_gain=1.0),
        "min_gain 1.15": dataclasses.replace(shipped, min_gain=1.15),
    }
    labels = list(dict.fromkeys(r.label for r in recordings))
    vocab = model.tokenizer.vocab_size
    for n in lengths:
        cut = [dataclasses.replace(r, answer=r.answer[:n]) for r in recordings]
        print(f"\n## answers up to {n} tokens: modelled speed-up, median (worst) per workload")
        print(f"   {'variant':<22}" + "".join(f"{lab:>20}" for lab in labels))
        for name, cfg in variants.items():
            cells = []
            for lab in labels:
                ups = [replay(r, cfg, cost, vocab).speedup for r in cut if r.label == lab]
                cells.append(f"{statistics.median(ups):.2f}x ({min(ups):.2f}x)")
            print(f"   {name:<22}" + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
