"""The torch runner with --quant int8 / int4: exact parity with a float runner on the same
(de)quantized weights, batching, memory, the on-disk cache, and (slow) the embedded model's
quality and the budget's bits per weight."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.torch.quant_layout import quantize
from localinfer.backends.torch.quant_recipe import QuantRecipe, parse_recipe
from localinfer.backends.torch.runner import TorchRunner
from localinfer.errors import UnsupportedModelError
from localinfer.loading.model import DictWeights, LoadedModel
from tests import tiny
from tests.tiny import tiny_config, tiny_weights

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
QUANTS = ["int8", "int8-g32", "int4", "int4-g32"]


pytestmark = pytest.mark.usefixtures("private_cache", "one_torch_thread")


def tiny_model(
    arch: str, path: Path = Path("tiny"), weights: DictWeights | None = None
) -> LoadedModel:
    return tiny.tiny_model(arch, format="gguf", path=path, weights=weights)


# A stored tensor's name -> the role of the (fused) matrix it goes into.
SOURCE_ROLES = {
    "embed_tokens": "embed", "lm_head": "head", "q_proj": "qkv", "k_proj": "qkv",
    "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up", "up_proj": "gate_up",
    "down_proj": "down",
}  # fmt: skip


def source_role(name: str) -> str:
    return next(role for part, role in SOURCE_ROLES.items() if part in name)


def dequantized_weights(source: DictWeights, recipe: QuantRecipe) -> DictWeights:
    """Every matrix replaced by quantize -> dequantize as the recipe says for its role: what
    the quantized runner multiplies by (row-wise groups commute with fusing rows)."""
    out = {}
    for name in source.names():
        a = source.get(name)
        if a.ndim == 2:
            spec = recipe.spec_for(source_role(name))
            a = quantize(torch.from_numpy(a), spec).dequantize().numpy()
        out[name] = a
    return DictWeights(out)


def runner(model: LoadedModel, quant: str | None = None, slots: int = 3) -> TorchRunner:
    return TorchRunner(model, RunnerConfig(slots=slots, max_ctx=64, quant=quant))


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    return tuple(np.random.default_rng(seed).integers(0, 256, size=n).tolist())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", QUANTS)
def test_quantized_runner_equals_float_runner_on_dequantized_weights(arch: str, quant: str):
    model = tiny_model(arch)
    recipe = parse_recipe(quant, model.config.tied_embeddings)
    assert recipe is not None
    reference = runner(tiny_model(arch, weights=dequantized_weights(model.weights, recipe)))
    q = runner(model, quant)
    assert q.info.quant == recipe.label
    work = [SlotWork(0, tokens(20), 0, "all")]
    got, want = q.forward(work)[0], reference.forward(work)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # and it is not the float model itself: quantization changed the numbers
    plain = runner(model).forward(work)[0]
    assert not np.allclose(got, plain, atol=1e-6)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_batched_equals_single(quant: str) -> None:
    model = tiny_model("qwen2")
    single = runner(model, quant)
    batched = runner(model, quant)
    a, b = tokens(9, 1), tokens(4, 2)
    ref_a = single.forward([SlotWork(0, a, 0, "all")])[0]
    single.release(0)
    ref_b = single.forward([SlotWork(0, b, 0)])[0]
    out = batched.forward([SlotWork(1, a, 0, "all"), SlotWork(2, b, 0)])
    np.testing.assert_allclose(out[0], ref_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], ref_b, rtol=1e-5, atol=1e-5)
    # decode step after the ragged prefill
    nxt = batched.forward([SlotWork(1, (5,), 9), SlotWork(2, (6,), 4)])
    single.release(0)
    single.forward([SlotWork(0, a, 0)])
    np.testing.assert_allclose(
        nxt[0], single.forward([SlotWork(0, (5,), 9)])[0], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "quant, bits, embed_bits",
    [("int8", 8.0, 8.5), ("int8-g64", 8.25, 8.25), ("int4-g64", 4.5, 4.5), ("int4-g32", 5.0, 5.0)],
)
def test_weights_memory_is_quantized_size(quant: str, bits: float, embed_bits: float) -> None:
    model = tiny_model("mistral")  # untied LM head: every matrix quantized once
    r = runner(model, quant)
    w = model.weights
    embed = w.get("model.embed_tokens.weight").size
    matrices = sum(w.get(n).size for n in w.names() if w.get(n).ndim == 2) - embed
    vectors = sum(w.get(n).size for n in w.names() if w.get(n).ndim == 1)
    rows = sum(w.get(n).shape[0] for n in w.names() if w.get(n).ndim == 2) - 256
    per_row = rows * 4 if quant == "int8" else 0  # one float32 scale per row
    expect = matrices * bits / 8 + embed * embed_bits / 8 + vectors * 4 + per_row
    assert r.memory().weights == pytest.approx(expect, rel=1e-6)
    assert r.memory().weights < runner(model).memory().weights / 3


def test_tied_embedding_is_one_quantized_table() -> None:
    r = runner(tiny_model("llama"), "int8")
    w = r._model.weights
    assert w.lm_head is w.embed and w.lm_head_shares_embed()


class CountingWeights(DictWeights):
    def __init__(self, source: DictWeights) -> None:
        super().__init__({n: source.get(n) for n in source.names()})
        self.matrix_reads = 0

    def get(self, name: str) -> np.ndarray:
        a = super().get(name)
        self.matrix_reads += a.ndim == 2
        return a


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_second_load_comes_from_the_disk_cache(quant: str, tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"stand-in for the model file")
    config = tiny_config("qwen3")
    first_src = CountingWeights(tiny_weights(config))
    first = runner(tiny_model("qwen3", path, first_src), quant)
    assert not first.quant_cache_hit and first_src.matrix_reads > 0
    second_src = CountingWeights(tiny_weights(config))
    second = runner(tiny_model("qwen3", path, second_src), quant)
    assert second.quant_cache_hit
    assert second_src.matrix_reads == 0  # nothing dequantized from the source
    work = [SlotWork(0, tokens(12), 0, "all")]
    np.testing.assert_array_equal(first.forward(work)[0], second.forward(work)[0])
    assert list((tmp_path / "cache" / "quant").iterdir())


def test_cache_off_and_missing_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCALINFER_QUANT_CACHE", "0")
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"x")
    runner(tiny_model("llama", path), "int8")
    runner(tiny_model("llama"), "int8")  # Path("tiny") does not exist: nothing cached
    assert not (tmp_path / "cache" / "quant").exists()


def test_quant_names() -> None:
    model = tiny_model("llama")
    for keep in ("none", "F32", "fp32", None):
        assert runner(model, keep).info.quant == "fp32"
    with pytest.raises(UnsupportedModelError):
        runner(model, "Q4_K_M")


# -- the embedded model -----------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_model_quality_and_budget() -> None:
    """int8 within 2% perplexity and >= 97% top-1 of the float32 reference on the evaluation
    text's first few hundred tokens; every runner's weights within 5% of the budget."""
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model
    from localinfer.quality.run import QualityOptions, measure_quality

    torch.set_num_threads(2)
    model = load_model(embedded_model_path())
    opts = QualityOptions(quants=("int8", "int4"), max_tokens=384, window=384, speed_steps=0)
    report = measure_quality(model, opts)
    ref, int8, int4 = report.rows
    assert int8.perplexity <= ref.perplexity * 1.02
    assert int8.top1 >= 0.97
    # int4 (group 64, the embedding table included) is reported, not held to int8's bar: on this
    # Q4_1 source it loses clearly (measured: perplexity +42%, top-1 59%), and the report says so.
    assert int4.kl > int8.kl and math.isfinite(int4.perplexity)
    flagged = any("int4" in w for w in report.warnings())
    assert flagged == (int4.perplexity > ref.perplexity * 1.05 or int4.top1 < 0.9 or int4.kl > 0.05)
    for row in (int8, int4):
        assert abs(row.budget_error) <= 0.05, row
