"""MLXRunner's weight forms: half dtypes, quantization on load, GGUF blocks run natively, an MLX
(quantized) repo run as stored, and the embedded SmolLM2-135M's Q4_1 blocks against torch fp32.

MLX on CPU is slow (its quantized matmul especially), so everything here uses tiny models except
the one module-scoped comparison on the embedded model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import gguf  # noqa: E402

from localinfer.backends.mlx.quant_affine import affine_quantize  # noqa: E402
from localinfer.facts.quant import mlx_recipe_layout  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from localinfer.loading.model import DictWeights, LoadedModel  # noqa: E402
from tests.mlx_helpers import feed, make_runner, torch_runner  # noqa: E402
from tests.model_files import TINY_VOCAB_SIZE, write_gguf, write_hf_dir  # noqa: E402
from tests.tiny import random_tokens, tiny_config, tiny_model, tiny_weights  # noqa: E402

pytestmark = pytest.mark.mlx

# -- numerics: dtypes and quantization ------------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [("bfloat16", 0.6), ("float16", 0.08)])
def test_half_dtypes_track_fp32(dtype, atol):
    model = tiny_model("qwen2")
    tokens = random_tokens(30)
    full = feed(make_runner(model), 0, tokens)
    half_runner = make_runner(model, dtype=dtype)
    half = feed(half_runner, 0, tokens, [20, 10])
    assert half.dtype == np.float32  # logits always come back as float32
    assert half_runner.info.quant == {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    assert np.abs(half - full).max() < atol
    assert (half.argmax(-1) == full.argmax(-1)).mean() >= 0.9


_ROLE_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "down_proj": "down"}


def _role(name: str, tied: bool) -> str:
    if "embed_tokens" in name:
        return "head" if tied else "embed"
    if "lm_head" in name:
        return "head"
    stem = name.split(".")[-2]
    return _ROLE_OF.get(stem, "gate_up")


def _affine_reference(model: LoadedModel, quant: str) -> LoadedModel:
    """The model with every matrix replaced by its own quantize -> dequantize round trip in its
    role's layout (scales and offsets in float16, as the runner stores them beside float32
    activations)."""
    layout = mlx_recipe_layout(quant, model.config.tied_embeddings)
    assert layout is not None
    tensors = {}
    for name in model.weights.names():
        w = model.weights.get(name)
        mq = layout[_role(name, model.config.tied_embeddings)] if w.ndim == 2 else None
        if mq is not None and w.shape[1] % mq.group == 0:
            q, s, b = affine_quantize(mx.array(w), mq.bits, mq.group, mx.float16)
            s, b = s.astype(mx.float32), b.astype(mx.float32)
            w = np.array(mx.dequantize(q, s, b, group_size=mq.group, bits=mq.bits))
        tensors[name] = w
    return LoadedModel(**{**_fields(model), "weights": DictWeights(tensors)})


def _fields(model: LoadedModel) -> dict[str, object]:
    return {f: getattr(model, f) for f in LoadedModel.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "quant, label, bits, group",
    [
        ("int4", "int4", 4, 32),  # the mixed recipe: the untied head at 8 bits
        ("int4-g64", "int4-g64", 4, 64),
        ("int8-g32", "int8-g32", 8, 32),
        ("int4-g128", "int4-g128", 4, 128),
    ],
)
def test_quantize_on_load_equals_dequantized_weights(quant, label, bits, group):
    """int4/int8 on load runs the quantized kernels on exactly the weights a float runner gets
    from the quantize -> dequantize round trip: same logits up to float32 rounding."""
    model = tiny_model("llama", hidden_size=128, head_dim=32, ffn_size=256, tied_embeddings=False)
    tokens = random_tokens(24)
    quantized = make_runner(model, quant=quant)
    assert quantized.info.quant == label
    ours = feed(quantized, 0, tokens, [20, 1, 3])
    expected = feed(make_runner(_affine_reference(model, quant)), 0, tokens, [20, 1, 3])
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=2e-4)
    if quant == "int4":  # mixed widths: its bytes are checked in test_mlx_quant_recipe.py
        return
    # And the quantized model is smaller than the float one by about the bit ratio.
    full = make_runner(model)
    ratio = quantized.memory().weights / full.memory().weights
    assert ratio < (bits + 2 * 16 / group) / 32 + 0.05


@pytest.mark.parametrize(
    "arch, qtype",
    [
        ("llama", "Q4_0"),
        ("llama", "Q8_0"),
        ("mistral", "Q4_1"),
        ("qwen2", "Q4_1"),
        ("qwen3", "Q8_0"),
    ],
)
def test_native_gguf_blocks_match_torch(tmp_path, arch, qtype):
    """GGUF Q4_0/Q4_1/Q8_0 kept as MLX affine blocks (llama Q/K rows un-permuted in place) give
    the torch runner's logits: torch dequantizes the same blocks, so the weights are identical
    and only float32 summation order differs."""
    config = tiny_config(arch, vocab_size=TINY_VOCAB_SIZE)
    weights = tiny_weights(config)
    path = write_gguf(
        tmp_path / "m.gguf",
        config,
        {n: weights.get(n) for n in weights.names()},
        qtype=gguf.GGMLQuantizationType[qtype],
    )
    model = load_model(path)
    runner = make_runner(model)
    assert runner.info.quant == model.file_quant
    assert runner._model.weights.layers[0].qkv.parts[0].quantized  # really kept native
    tokens = random_tokens(40, vocab=TINY_VOCAB_SIZE)
    ours = feed(runner, 0, tokens, [30, 1, 9])
    theirs = feed(torch_runner(model), 0, tokens, [30, 1, 9])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    dequantized = feed(make_runner(model, quant="none"), 0, tokens)
    np.testing.assert_allclose(ours, dequantized, rtol=1e-4, atol=1e-4)


def write_mlx_dir(root: Path, config, weights: dict[str, np.ndarray], overrides: dict) -> Path:
    """An mlx-community style repo: HF config + tokenizer, 2-D weights as MLX affine 4-bit g64
    (``overrides``: module path -> its own {group_size, bits}), scales/biases in float16."""
    write_hf_dir(root, config, weights)
    stored = {}
    for name, w in weights.items():
        stem = name.removesuffix(".weight")
        if w.ndim == 2:
            q = overrides.get(stem, {"group_size": 64, "bits": 4})
            packed, s, b = mx.quantize(mx.array(w), group_size=q["group_size"], bits=q["bits"])
            stored.update({name: packed, stem + ".scales": s.astype(mx.float16)})
            stored[stem + ".biases"] = b.astype(mx.float16)
        else:
            stored[name] = mx.array(w)
    mx.save_safetensors(str(root / "model.safetensors"), stored)
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization"] = {"group_size": 64, "bits": 4, **overrides}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def test_mlx_format_repo_runs_as_stored(tmp_path):
    """An MLX-quantized HF directory (uint32 + scales/biases, mixed 4/8-bit) runs natively and
    equals a float runner on the dequantized weights; quant="none" dequantizes it itself."""
    config = tiny_config("qwen2", vocab_size=TINY_VOCAB_SIZE)
    weights = {n: tiny_weights(config).get(n) for n in tiny_weights(config).names()}
    overrides = {"model.layers.1.mlp.down_proj": {"group_size": 32, "bits": 8}}
    model = load_model(write_mlx_dir(tmp_path / "m", config, weights, overrides))
    runner = make_runner(model)
    assert runner.info.quant in ("int4-g64", "int8-g32")
    assert runner._model.weights.layers[1].down.bits == 8
    assert runner._model.weights.embed.quantized
    reference = {}
    for name, w in weights.items():
        q = overrides.get(name.removesuffix(".weight"), {"group_size": 64, "bits": 4})
        if w.ndim == 2:
            packed, s, b = mx.quantize(mx.array(w), **q)
            s, b = s.astype(mx.float16).astype(mx.float32), b.astype(mx.float16).astype(mx.float32)
            w = np.array(mx.dequantize(packed, s, b, **q))
        reference[name] = w
    ref_model = LoadedModel(**{**_fields(model), "weights": DictWeights(reference)})
    tokens = random_tokens(30, vocab=TINY_VOCAB_SIZE)
    expected = feed(make_runner(ref_model), 0, tokens)
    np.testing.assert_allclose(feed(runner, 0, tokens, [25, 5]), expected, rtol=1e-4, atol=2e-4)
    floated = make_runner(model, quant="none")
    assert floated.info.quant == "fp32"
    np.testing.assert_allclose(feed(floated, 0, tokens), expected, rtol=1e-4, atol=2e-4)


# -- the embedded model ------------------------------------------------------------------------

EMBEDDED_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based inks and a wooden press adapted from wine making. "
    "Within fifty years printing shops had spread to more than two hundred cities across Europe."
)


@pytest.fixture(scope="module")
def embedded():
    from localinfer.loading.embedded import embedded_model_path

    try:
        path = embedded_model_path()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"embedded model not installed: {exc}")
    return load_model(path)


def test_embedded_native_q4_1_tracks_torch_fp32(embedded):
    """Native Q4_1 (MLX affine blocks, float16 scales exactly as in the file) vs the torch
    runner's fp32 dequantization of the same blocks, teacher-forced over ~50 tokens of text.

    Both hold the same weight values (a Q4_1 block is ``d * q + m`` with float16 d and m, which
    MLX's affine format stores unchanged), so only float32 summation order differs (blocked
    quantized kernels vs a dense GEMM) through 30 layers. Measured on mlx[cpu]: top-1 equal at
    every position, correlation 1 - 1e-11, max |diff| 1e-4 on logits of magnitude ~35. The
    bounds leave room for other kernels (Metal, other CPUs) yet catch the real failure modes: a
    wrong Q/K row order or a mis-scaled block gives fluent garbage, with correlation far below
    0.99 and top-1 agreement near chance."""
    tokens = embedded.tokenizer.encode(EMBEDDED_TEXT)
    assert 40 <= len(tokens) <= 64
    runner = make_runner(embedded, slots=2, max_ctx=64)
    assert runner.info.quant == "Q4_1"
    ours = feed(runner, 0, tokens, [32, len(tokens) - 32])
    theirs = feed(torch_runner(embedded, slots=1, max_ctx=64), 0, tokens)
    top1 = (ours.argmax(-1) == theirs.argmax(-1)).mean()
    corr = min(np.corrcoef(a, b)[0, 1] for a, b in zip(ours, theirs, strict=True))
    assert top1 >= 0.97, top1
    assert corr > 0.9999, corr
    assert np.abs(ours - theirs).max() < 0.05
    # Native storage: 4-bit blocks + float16 scale/offset per 32, Q8_0 embeddings: the file size.
    assert runner.memory().weights < 1.1 * embedded.weights.nbytes()
