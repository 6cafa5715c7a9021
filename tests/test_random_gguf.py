"""bench/random_gguf.py writes real-shape random Q4_K_M GGUFs (scripts/gpu-check's 8B models):
scaled down here, they load and decode on llama.cpp, carry Q4_K_M's block types where llama.cpp's
recipe puts them, and the budget reads them like any download."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.random_gguf import Q4_K, Q6_K, SHAPES, more_bits, tensor_types, write_random_gguf
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
    pytest.importorskip("llama_cpp")
    from localinfer.engine.types import Request, SamplingParams
    from localinfer.session import open_session

    name, path = scaled_file
    session = open_session(str(path), backend="llamacpp", slots=1, ctx=256)
    try:
        ids = session.raw_prompt_ids("hello there")
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        result = session.engine.submit(Request(ids, params)).result()
        assert len(result.token_ids) == 8 and result.metrics.decode_tps > 0
    finally:
        session.close()
