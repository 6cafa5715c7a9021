"""`localinfer quality --backend llamacpp`: the candidate GGUF is written into the quant cache
through `localinfer quantize`, reused on the next run, and scored against the fp32 reference;
``--backend all`` puts every backend's rows in one table."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.errors import InvalidParameterError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.quality.gguf_files import cached_gguf_path, gguf_type, quantized_model
from localinfer.quality.run import QualityOptions, measure_quality
from localinfer.quant_cache import QuantCache

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.usefixtures("private_cache", "one_torch_thread")

FEW = dict(max_tokens=48, window=48, chunk=48, speed_steps=0, threads=1)


def test_gguf_type_names() -> None:
    assert gguf_type("int8") == gguf_type("Q8_0") == "Q8_0"
    assert gguf_type("int4") == gguf_type("q4_k_m") == "Q4_K_M"
    with pytest.raises(InvalidParameterError, match="^--quant"):
        gguf_type("int4-g64")


def test_quantized_file_goes_to_the_cache_once(tmp_path: Path) -> None:
    model = load_model(embedded_model_path())
    cache = QuantCache(tmp_path / "quant")
    made = quantized_model(model, "Q8_0", threads=1, cache=cache)
    path = cached_gguf_path(Path(model.path), "Q8_0", cache)
    assert Path(made.path) == path and path.is_file()
    assert path.is_relative_to(tmp_path / "quant")
    assert made.file_quant == "Q8_0"
    stamp = path.stat().st_mtime_ns
    again = quantized_model(model, "int8", threads=1, cache=cache)
    assert Path(again.path) == path and path.stat().st_mtime_ns == stamp  # not written again
    assert not list((tmp_path / "quant").rglob("*.partial"))


def test_quality_of_llamacpp_rows_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flash attention on: without it llama.cpp multiplies V by an f16 copy of the probabilities,
    # which moves this 48-token sample by a token or two (Q8_0 KL 0.0099 vs 0.0063, top-1 42/47
    # vs 44/47); over 256 tokens the two agree (KL 0.0045 vs 0.0041, top-1 95.3% vs 94.9%).
    monkeypatch.setenv("LOCALINFER_FLASH_ATTN", "on")
    model = load_model(embedded_model_path())
    report = measure_quality(model, QualityOptions(quants=("Q8_0",), backend="llamacpp", **FEW))
    ref, q8 = report.rows
    assert ref.reference and ref.backend == "torch"
    assert (q8.backend, q8.quant) == ("llamacpp", "Q8_0")
    # Q8_0 of a Q4_1 file: near-lossless against the same reference, and measured not copied
    assert 0 < q8.kl < 0.05 and q8.top1 >= 0.9
    assert q8.budget_error is not None and abs(q8.budget_error) < 0.05
    assert cached_gguf_path(Path(model.path), "Q8_0").is_file()
