"""bench/random_gguf.py writes real-shape random Q4_K_M GGUFs (scripts/gpu-check's 8B models
directly; the 1B-class shapes as F16 quantized by `localinfer quantize`): scaled down here, they
load and decode on llama.cpp, carry Q4_K_M's block types where llama.cpp's recipe puts them, and
the budget reads them like any download."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.random_gguf import (
    Q4_K,
    Q6_K,
    SHAPES,
    SMALL_SHAPES,
    cached_q4_k_m,
    more_bits,
    tensor_types,
    write_random_gguf,
)
from localinfer.budget.file_headers import read_gguf_header


@pytest.fixture(scope="module", params=sorted(SHAPES))
def scaled_file(request, tmp_path_factory) -> tuple[str, Path]:
    shape = SHAPES[request.param].scaled(layers=4, hidden=256, ffn=512, vocab=32000)
    path = tmp_path_factory.mktemp("random") / f"{shape.name}.gguf"
    return request.param, write_random_gguf(path, shape)


def test_the_8b_shapes_have_the_real_sizes() -> None:
    import gguf

    for name, gib in (("llama3.1-8b", 4.58), ("qwen3-8b", 4.68)):
        shape = SHAPES[name]
        total = 0
        for _, (rows, cols), qtype in tensor_types(shape):
            if qtype is None:
                total += rows * cols * 4
            else:
                weights, size = gguf.GGML_QUANT_SIZES[qtype]
                total += rows * cols // weights * size
        assert total / 2**30 == pytest.approx(gib, rel=0.03), name  # the real files' tensors


def test_the_recipe_puts_q6_k_where_llama_cpp_does() -> None:
    wide = [i for i in range(32) if more_bits(i, 32)]
    assert wide[:4] == [0, 1, 2, 3] and wide[-4:] == [28, 29, 30, 31] and 6 in wide


def test_a_scaled_file_is_q4_k_m_to_the_budget(scaled_file) -> None:
    _, path = scaled_file
    header = read_gguf_header(path)
    assert header.quant == "Q4_K_M"
    types = {t.name: t.type_name for t in header.tensors}
    assert types["output.weight"] == Q6_K.name and types["blk.1.ffn_gate.weight"] == Q4_K.name
    assert types["blk.3.ffn_down.weight"] == Q6_K.name  # the last eighth


def test_a_scaled_file_decodes_on_llamacpp(scaled_file) -> None:
    _, path = scaled_file
    decode_eight(path)


def decode_eight(path: Path) -> None:
    """Eight tokens of ``path`` on localinfer's llama.cpp runner."""
    pytest.importorskip("llama_cpp")
    from localinfer.engine.types import Request, SamplingParams
    from localinfer.session import open_session

    session = open_session(str(path), backend="llamacpp", slots=1, ctx=256)
    try:
        ids = session.raw_prompt_ids("hello there")
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        result = session.engine.submit(Request(ids, params)).result()
        assert len(result.token_ids) == 8 and result.metrics.decode_tps > 0
    finally:
        session.close()


# -- the small shapes: F16 random weights quantized by `localinfer quantize` ---------------------


def stored_params(shape) -> int:  # noqa: ANN001
    return sum(rows * cols for _, (rows, cols), _ in tensor_types(shape))


def test_the_small_shapes_have_the_published_sizes() -> None:
    for name, billions in (("llama3.2-1b", 1.236), ("qwen3-1.7b", 1.72), ("gemma3-1b", 1.0)):
        assert stored_params(SMALL_SHAPES[name]) / 1e9 == pytest.approx(billions, rel=0.02), name


def test_tied_shapes_have_no_lm_head_and_gemma3_its_extra_norms() -> None:
    for shape in SMALL_SHAPES.values():
        names = {name for name, _, _ in tensor_types(shape)}
        assert shape.tied and "output.weight" not in names and "token_embd.weight" in names
    gemma = {name for name, _, _ in tensor_types(SMALL_SHAPES["gemma3-1b"])}
    for part in ("post_attention_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"):
        assert f"blk.25.{part}.weight" in gemma, part


# Two layers at a quarter of the real width; a 4,096-token vocabulary (the tokenizer's 276 tokens
# padded) instead of 32,000: the embedding table was 6/7 of what `localinfer quantize` wrote and
# the recipe picks its type by its role (the tied head), not by its rows.
SMALL_SCALE = {"layers": 2, "hidden": 256, "ffn": 512, "vocab": 4096}


@pytest.fixture(scope="module", params=sorted(SMALL_SHAPES))
def quantized_file(request, tmp_path_factory) -> tuple[str, Path]:
    """A scaled small shape through cached_q4_k_m: written as F16, quantized, kept."""
    pytest.importorskip("llama_cpp")
    shape = SMALL_SHAPES[request.param].scaled(**SMALL_SCALE)
    return request.param, cached_q4_k_m(shape, folder=tmp_path_factory.mktemp("quantized"))


def test_a_quantized_small_shape_is_q4_k_m_to_the_budget(quantized_file) -> None:
    name, path = quantized_file
    header = read_gguf_header(path)
    assert header.quant == "Q4_K_M", name
    types = {t.name: t.type_name for t in header.tensors}
    assert "output.weight" not in types  # tied
    assert types["token_embd.weight"] == Q6_K.name  # llama.cpp's recipe: the head's type
    assert types["blk.0.ffn_gate.weight"] == Q4_K.name
    assert not list(path.parent.glob("*F16*"))  # the F16 source is gone
    if name == "gemma3-1b":
        from localinfer.loading.gguf_file import GGUFFile

        assert GGUFFile(path).get("gemma3.attention.sliding_window") == 512


def test_the_quantized_file_is_cached(quantized_file, monkeypatch) -> None:
    import bench.random_gguf as random_gguf

    name, path = quantized_file
    monkeypatch.setattr(random_gguf, "write_f16_gguf", pytest.fail)  # found: nothing written
    shape = SMALL_SHAPES[name].scaled(**SMALL_SCALE)
    assert cached_q4_k_m(shape, folder=path.parent) == path


def test_a_quantized_small_shape_decodes_on_llamacpp(quantized_file) -> None:
    _, path = quantized_file
    decode_eight(path)
