"""Decode speed of the MLX runner beside mlx-lm's own generation, on the same weights, in one run.

For one model (default: the embedded SmolLM2-135M, its Q4_1 blocks kept native) this prints:

* single-stream greedy decode tok/s: MLXRunner vs mlx-lm's ``generate_step``;
* N-stream aggregate decode tok/s (default 8): MLXRunner with all slots in one forward vs mlx-lm's
  ``BatchGenerator`` (its continuous-batching generator);
* the ratios runner / mlx-lm, and how many greedy tokens the two single streams agree on.

mlx-lm runs on the very arrays the runner holds (its llama ``Model`` is filled from the runner's
weights, fused q|k|v and gate|up split back by rows), so the comparison is of the code, not of
the weights. Decode rates count the tokens after the first (prefill excluded) over the time they
took; every figure is the median of --repeats runs (the machine may be shared: rerun when quiet).
Without mlx-lm installed (``pip install mlx-lm``) the runner's figures are printed alone.

    scripts/bench-mlx [--model FILE] [--quant int4] [--dtype float32] [--tokens 32]
                      [--streams 8] [--repeats 3] [--device cpu|metal]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

PROMPT = (
    "You are a helpful assistant. Explain in a few sentences why the sky looks blue during the "
    "day and red at sunset, as you would to a curious twelve-year-old."
)


def median_of(repeats: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeats))


# -- the runner ----------------------------------------------------------------------------------


def runner_decode(runner, prompts: list[list[int]], tokens: int) -> tuple[float, list[int]]:
    """Greedy-decode ``tokens`` tokens in every slot at once; returns (aggregate tok/s after the
    first token, slot 0's tokens).

    Each slot's prompt minus its last token is prefilled once and kept (prefill on mlx[cpu] is
    slow and not what is measured): later calls truncate back to it, as prefix reuse would."""
    from localinfer.backends.base import SlotWork

    prefill = []
    for slot, prompt in enumerate(prompts):
        keep = len(prompt) - 1
        if runner.slot_length(slot) >= keep:
            runner.truncate(slot, keep)
        else:
            runner.release(slot)
            prefill.append(SlotWork(slot, tuple(prompt[:keep]), 0))
    if prefill:
        runner.forward(prefill)
    out = runner.forward([SlotWork(s, (p[-1],), len(p) - 1) for s, p in enumerate(prompts)])
    last = [int(o[-1].argmax()) for o in out]
    produced = [[t] for t in last]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        batch = [SlotWork(s, (last[s],), runner.slot_length(s)) for s in range(len(prompts))]
        out = runner.forward(batch)
        last = [int(o[-1].argmax()) for o in out]
        for s, t in enumerate(last):
            produced[s].append(t)
    elapsed = time.perf_counter() - start
    return (tokens - 1) * len(prompts) / elapsed, produced[0]


# -- mlx-lm on the same arrays -------------------------------------------------------------------


def mlx_lm_model(runner):
    """An mlx-lm llama Model whose parameters are the runner's own arrays."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama

    c, w = runner.model_config, runner._model.weights
    if c.arch not in ("llama", "mistral") or c.sliding_layers:
        raise SystemExit(f"bench-mlx compares with mlx-lm on llama models only, not {c.arch}")
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=c.hidden_size,
        num_hidden_layers=c.n_layers,
        intermediate_size=c.ffn_size,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_eps,
        vocab_size=c.vocab_size,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_ctx,
        tie_word_embeddings=w.lm_head is w.embed,
    )
    flat: dict[str, mx.array] = {}
    quantized: dict[str, dict[str, int]] = {}

    def put(prefix: str, m) -> None:
        flat[prefix + ".weight"] = m.weight
        if m.quantized:
            flat[prefix + ".scales"], flat[prefix + ".biases"] = m.scales, m.biases
            quantized[prefix] = {"group_size": m.group_size, "bits": m.bits}
        if m.bias is not None:
            flat[prefix + ".bias"] = m.bias

    put("model.embed_tokens", w.embed)
    if w.lm_head is not w.embed:
        put("lm_head", w.lm_head)
    flat["model.norm.weight"] = w.norm
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        for name, m in zip(("q", "k", "v"), layer.qkv.matrices(), strict=True):
            put(p + f"self_attn.{name}_proj", m)
        put(p + "self_attn.o_proj", layer.o)
        gate, up = layer.gate_up.matrices()
        put(p + "mlp.gate_proj", gate)
        put(p + "mlp.up_proj", up)
        put(p + "mlp.down_proj", layer.down)
        flat[p + "input_layernorm.weight"] = layer.input_norm
        flat[p + "post_attention_layernorm.weight"] = layer.post_norm
    model = llama.Model(args)
    nn.quantize(model, class_predicate=lambda path, _module: quantized.get(path, False))
    model.load_weights(list(flat.items()), strict=True)
    mx.eval(model.parameters())
    return model


def mlx_lm_single(model, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    produced: list[int] = []
    start = 0.0
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens):
        produced.append(int(token))
        if len(produced) == 1:
            start = time.perf_counter()
    return (tokens - 1) / (time.perf_counter() - start), produced


def mlx_lm_batch(model, prompts: list[list[int]], tokens: int) -> float:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=tokens, completion_batch_size=len(prompts))
    gen.insert(prompts, [tokens] * len(prompts))
    counted, start = 0, 0.0
    # Time from the step that produced every stream's first token to the last one.
    while responses := gen.next_generated():
        if start == 0.0:
            if len(responses) < len(prompts):
                continue  # still admitting prompts
            start = time.perf_counter()
            continue
        counted += len(responses)
    elapsed = time.perf_counter() - start
    gen.close()
    return counted / elapsed


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/bench-mlx", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=None, help="GGUF or HF dir (default: embedded)")
    ap.add_argument("--quant", default=None, help="RunnerConfig.quant (default: the file's own)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "metal"))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.mlx.runner import create_runner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(args.model or embedded_model_path())
    base = model.tokenizer.encode(PROMPT)
    # Distinct prompts per stream (a different last word), same length give or take a token.
    prompts = [base] + [
        base[:-1] + model.tokenizer.encode(f" #{i}") for i in range(1, args.streams)
    ]
    ctx = max(map(len, prompts)) + args.tokens + 8
    runner = create_runner(
        model,
        RunnerConfig(
            slots=args.streams, max_ctx=ctx, dtype=args.dtype, device=args.device, quant=args.quant
        ),
    )
    info = runner.info
    print(
        f"model {model.name} ({info.quant}, {info.dtype}) on mlx {info.device}; prompt "
        f"{len(base)} tokens, {args.tokens} decoded, median of {args.repeats}",
        flush=True,
    )
    runner_decode(runner, prompts[:1], 4)  # warm-up
    single, ours = 0.0, []

    def run_single() -> float:
        nonlocal ours
        rate, ours = runner_decode(runner, prompts[:1], args.tokens)
        return rate

    single = median_of(args.repeats, run_single)
    multi = median_of(args.repeats, lambda: runner_decode(runner, prompts, args.tokens)[0])
    print(f"  runner   single {single:8.1f} tok/s   {args.streams}-stream {multi:8.1f} tok/s")

    if importlib.util.find_spec("mlx_lm") is None:
        print("  mlx-lm is not installed (pip install mlx-lm): no peer figures")
        return 0
    import mlx.core as mx

    device = mx.gpu if info.device == "metal" else mx.cpu
    mx.set_default_device(device)  # mlx-lm runs on the default device
    lm = mlx_lm_model(runner)
    mlx_lm_single(lm, prompts[0], 4)  # warm-up
    theirs: list[int] = []

    def run_lm_single() -> float:
        nonlocal theirs
        rate, theirs = mlx_lm_single(lm, prompts[0], args.tokens)
        return rate

    lm_single = median_of(args.repeats, run_lm_single)
    lm_multi = median_of(args.repeats, lambda: mlx_lm_batch(lm, prompts, args.tokens))
    print(f"  mlx-lm   single {lm_single:8.1f} tok/s   {args.streams}-stream {lm_multi:8.1f} tok/s")
    print(
        f"  ratio runner/mlx-lm: single {single / lm_single:.2f}x   "
        f"{args.streams}-stream {multi / lm_multi:.2f}x"
    )
    pairs = zip(ours, theirs, strict=False)
    same = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(theirs)))
    print(f"  greedy tokens identical for the first {same} of {len(ours)} (single stream)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
