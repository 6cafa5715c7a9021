"""`localinfer quantize`: llama.cpp writes a smaller GGUF that still computes the same model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.llamacpp.quantize import (  # noqa: E402
    QuantizeProgress,
    default_output,
    quantize_gguf,
)
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from localinfer.cli import main  # noqa: E402
from localinfer.errors import (  # noqa: E402
    InvalidParameterError,
    ModelFileError,
    UnsupportedModelError,
)
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from tests.gguf_writer import finish_gguf, write_tiny_gguf  # noqa: E402
from tests.model_files import file_model  # noqa: E402
from tests.tiny import tiny_config, tiny_weights  # noqa: E402

pytestmark = pytest.mark.llamacpp

# Rows of 256 and 512 so K-quants (256-wide super-blocks) apply as they do on real models.
CONFIG = tiny_config(
    "llama", hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512, vocab_size=512
)
TOKENS = tuple(int(t) for t in np.random.default_rng(0).integers(0, 512, 32))

# Target -> (types allowed for 2-D tensors, the type most of them must have).
EXPECTED = {
    "q8_0": ({"Q8_0"}, "Q8_0"),
    "int8": ({"Q8_0"}, "Q8_0"),
    # llama.cpp keeps the (tied) embedding/output matrix at Q6_K in its 4-bit mixes.
    "q4_0": ({"Q4_0", "Q6_K"}, "Q4_0"),
    "q4_k_m": ({"Q4_K", "Q5_K", "Q6_K"}, "Q4_K"),
    "int4": ({"Q4_K", "Q5_K", "Q6_K"}, "Q4_K"),
}
# Logit correlation with the F16 source (random weights; measured 0.9998 / 0.979 / 0.986).
MIN_CORR = {"Q8_0": 0.999, "Q4_0": 0.95, "Q4_K": 0.95}


def logits(path: Path, quant: str) -> np.ndarray:
    runner = LlamaCppRunner(
        file_model(path, quant, CONFIG), RunnerConfig(slots=1, max_ctx=64, threads=1)
    )
    out = runner.forward([SlotWork(0, TOKENS, 0, "all")])[0]
    runner.close()
    return out


@pytest.fixture(scope="module")
def f16_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("quant")
    return write_tiny_gguf(folder / "tiny-F16.gguf", CONFIG, tiny_weights(CONFIG, 0), storage="f16")


@pytest.mark.parametrize("target", list(EXPECTED))
def test_quantize_writes_the_target_types_and_keeps_the_model(
    f16_source: Path, tmp_path: Path, target: str
) -> None:
    events: list[QuantizeProgress] = []
    out = tmp_path / f"out-{target}.gguf"
    result = quantize_gguf(f16_source, out, target, threads=1, on_progress=events.append)
    assert result.output == out and out.is_file()
    assert not list(tmp_path.glob(".*partial"))
    assert result.output_bytes == out.stat().st_size < result.source_bytes

    reader = gguf.GGUFReader(out)
    matrix_types = [t.tensor_type.name for t in reader.tensors if len(t.shape) == 2]
    allowed, main_type = EXPECTED[target]
    assert set(matrix_types) <= allowed, matrix_types
    assert matrix_types.count(main_type) > len(matrix_types) / 2
    norms = [t.tensor_type.name for t in reader.tensors if len(t.shape) == 1]
    assert set(norms) == {"F32"}

    # One progress event per tensor, in order, from llama.cpp's own log.
    assert [e.done for e in events] == list(range(1, len(reader.tensors) + 1))
    assert {e.total for e in events} == {len(reader.tensors)}

    base = logits(f16_source, "F16")
    got = logits(out, result.quant)
    corr = np.corrcoef(got.ravel(), base.ravel())[0, 1]
    assert corr > MIN_CORR[main_type], corr


def test_cli_quantize_default_output_name(
    f16_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / f16_source.name
    src.write_bytes(f16_source.read_bytes())
    assert main(["quantize", str(src), "--to", "INT8", "--threads", "1"]) == 0
    out = tmp_path / "tiny-Q8_0.gguf"
    assert out.is_file()
    assert default_output(src, "int8") == out
    assert str(out) in capsys.readouterr().out
    a, b = logits(out, "Q8_0"), logits(src, "F16")
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > MIN_CORR["Q8_0"]


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.gguf"
    assert main(["quantize", str(missing), "--to", "q8_0"]) == 1
    err = capsys.readouterr().err
    assert "file not found" in err and err.count("\n") == 1

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model" * 50)
    assert main(["quantize", str(garbage), "--to", "q4_0"]) == 1
    assert "not a GGUF file" in capsys.readouterr().err

    assert main(["quantize", str(tmp_path), "--to", "q4_0"]) == 1  # said "file not found"
    assert "is a directory" in capsys.readouterr().err

    with pytest.raises(SystemExit):  # argparse rejects an unknown target
        main(["quantize", str(garbage), "--to", "q3_x"])
    with pytest.raises(InvalidParameterError):
        quantize_gguf(garbage, None, "q3_x")


@pytest.mark.parametrize(
    ("quant", "advice"),
    [
        ("q8_0", "--to q8_0 --allow-requantize"),  # the embedded file is Q4_1: a requantize
        ("mlx-4bit", "llama.cpp writes only q8_0, q4_0"),  # it suggested --to mlx-4bit
        ("mlx-4bit", "mlx-4bit is the MLX backend's (--backend mlx)"),  # torch refuses it too
        ("Q5_K_M", "localinfer pull ORG/REPO:Q5_K_M"),  # it said "another backend"
    ],
)
def test_another_quantization_says_what_writes_it(quant: str, advice: str) -> None:
    config = RunnerConfig(slots=1, max_ctx=64, threads=1, quant=quant)
    with pytest.raises(UnsupportedModelError, match="runs a GGUF as stored") as caught:
        LlamaCppRunner(file_model(embedded_model_path(), "Q4_1"), config)
    assert advice in str(caught.value)


def test_truncated_source_is_a_model_file_error(f16_source: Path, tmp_path: Path) -> None:
    bad = tmp_path / "truncated-F16.gguf"
    bad.write_bytes(f16_source.read_bytes()[: f16_source.stat().st_size // 2])
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelFileError, match="could not quantize"):
        quantize_gguf(bad, out, "q8_0", threads=1)
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_already_quantized_source_needs_allow_requantize(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="requantizing from type q4_1 is disabled.*F16"):
        quantize_gguf(embedded_model_path(), tmp_path / "x.gguf", "q4_0", threads=1)


@pytest.mark.slow
def test_embedded_model_dequantized_to_f16_then_q8_0(tmp_path: Path) -> None:
    """The real model: dequantize the embedded Q4_1 GGUF to F16 (~270 MB), quantize it to Q8_0
    with the CLI, and check the result computes the same model (teacher-forced top-1 agreement
    with the Q4_1 original; Q8_0 of a dequantized Q4_1 loses almost nothing)."""
    from gguf.quants import dequantize

    src = embedded_model_path()
    reader = gguf.GGUFReader(src)
    f16 = tmp_path / "smollm2-F16.gguf"
    writer = gguf.GGUFWriter(str(f16), arch="llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for tensor in reader.tensors:
        data = dequantize(tensor.data, tensor.tensor_type)
        shape = [int(d) for d in reversed(tensor.shape)]
        data = data.reshape(shape)
        writer.add_tensor(tensor.name, data.astype(np.float16 if data.ndim == 2 else np.float32))
    finish_gguf(writer)

    out = tmp_path / "smollm2-Q8_0.gguf"
    assert main(["quantize", str(f16), "--to", "q8_0", "-o", str(out)]) == 0
    tokens = tuple(int(t) for t in np.random.default_rng(1).integers(100, 20000, 24))

    def run(path: Path, quant: str) -> np.ndarray:
        runner = LlamaCppRunner(file_model(path, quant), RunnerConfig(slots=1, max_ctx=64))
        result = runner.forward([SlotWork(0, tokens, 0, "all")])[0]
        runner.close()
        return result

    a, b = run(src, "Q4_1"), run(out, "Q8_0")
    assert out.stat().st_size > src.stat().st_size  # 8.5 bits/weight vs 5
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.8
