"""The budget against what the backends really allocate: llama.cpp's own buffer report, what
stays resident on the CPU, and `budget --verify` (a measurement in a fresh process)."""

from __future__ import annotations

import json

import pytest
from llama_reference import reference_llama

from localinfer.backend_budget import compute_budget
from localinfer.budget import BudgetRequest
from localinfer.cli import main
from localinfer.loading.embedded import embedded_model_path

# --- predicted vs what llama.cpp allocates -------------------------------------------------------


@pytest.mark.llamacpp
def test_prediction_matches_llama_cpp_for_the_embedded_model() -> None:
    import re

    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp import native

    # Read llama.cpp's own buffer report through the project's log hook: once any test has
    # initialised the backend, llama.cpp's log no longer reaches stderr. The weights load as the
    # runner loads them (no AMX copy; tests/llama_reference.py), which is what the budget plans.
    capture = native.LogCapture()
    with (
        native.listen(capture),
        reference_llama(
            embedded_model_path(), n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=1, verbose=True
        ),
    ):
        pass
    log = capture.text()
    mib: dict[str, float] = {}
    for match in re.finditer(r"\b(model|KV|compute) buffer size\s*=\s*([\d.]+) MiB", log):
        mib[match.group(1)] = mib.get(match.group(1), 0.0) + float(match.group(2))
    assert set(mib) == {"model", "KV", "compute"}, log[-2000:]
    report = compute_budget(
        BudgetRequest("smollm2-135m", ctx=4096, device="8GiB", backend="llamacpp")
    )
    # llama.cpp prints MiB with two decimals: weights and KV agree to that precision.
    assert abs(report.weights_bytes / 2**20 - mib["model"]) < 0.01
    assert abs(report.kv_cache_bytes / 2**20 - mib["KV"]) < 0.01
    # The compute buffers as the runner's context reserves them (its n_outputs_max logits rows,
    # flash attention as the budget assumes off the CPU), with the output buffer: the estimate
    # may be conservative, by at most 15%, and short by no more than llama.cpp's rounding.
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.loading.loader import load_model
    from tests.llamacpp_helpers import cfg

    runner = LlamaCppRunner(
        load_model(embedded_model_path()), cfg(max_ctx=4096, slots=1), flash_attn=True
    )
    try:
        reserved = runner.memory().overhead  # compute + output buffers, before any forward
    finally:
        runner.close()
    assert 0.995 * reserved <= report.compute_bytes <= 1.15 * reserved


def test_cpu_budget_counts_what_is_resident() -> None:
    # llama.cpp reserves n_outputs_max logits rows (4 slots + 32) after the last layer, in the
    # memory the layers freed; on the CPU only one row per sequence is ever written
    # (scripts/budget-accuracy measures RSS), on a GPU or an unknown machine the reservation
    # counts. At a 49,152 vocabulary the 36 rows fit in the layer's peak: the same graph.
    def llamacpp(device: str) -> int:
        request = BudgetRequest(
            "smollm2-135m", ctx=2048, concurrency=4, device=device, backend="llamacpp"
        )
        return compute_budget(request).compute_bytes

    # Without flash attention (measured slower on this CPU: attention_plan.py) the chunk's
    # scores sit beside the layer, f32 masks instead of f16, and the CPU's f16 copy of them.
    from localinfer.backends.llamacpp.attention_plan import scores_bytes
    from localinfer.backends.llamacpp.attention_probe import AttentionShape
    from localinfer.backends.llamacpp.profile import PROFILE

    flash = PROFILE.fused_attention("cpu", AttentionShape(9, 3, 64), 2048, 512)
    unfused = 0 if flash else scores_bytes(9, 2048) + 2048 * 512 * (4 - 2)
    assert llamacpp("cpu") - llamacpp("8GiB") == unfused
    # A layer's peak (backends/llamacpp/compute_model.py), the f16 mask, the output buffer.
    layer = 512 * (3 * 576 + 3 * 1536 + 576) * 4
    assert llamacpp("8GiB") == layer + 2048 * 512 * 2 + 4 * 49152 * 4

    # torch on the CPU: its native kernels keep the file's Q4_1/Q8_0 blocks as stored where this
    # machine's calibration found them faster (norms are F32 already); the file's pages are
    # dropped after the load. Elsewhere (the kernels off, or an unknown machine) the file is
    # held converted: Q4_1 as int4 groups of 32, the Q8_0 table (the tied head) int8 per row
    # (kquant_rules.holds_converted). Asked for float32 weights, float32 weights; where the
    # kernels do not run on float32 rows (switched off, no C compiler, or measured slower than
    # torch ops) the oneDNN-packed copy of the tied LM head is held beside the table as well.
    from localinfer.backends.torch.native_plan import keeps_blocks, native_f32_tokens

    def torch_cpu_weights(quant: str | None = None) -> int:
        request = BudgetRequest("smollm2-135m", device="cpu", backend="torch", quant=quant)
        return compute_budget(request).weights_bytes

    converted = 94_905_600
    f32 = 134_515_008 * 4 + (0 if native_f32_tokens() else 49152 * 576 * 4)
    assert torch_cpu_weights() == (96_576_768 if keeps_blocks() else converted)
    assert torch_cpu_weights("f32") == f32
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALINFER_NATIVE_KERNELS", "0")
        assert torch_cpu_weights() == converted
        assert torch_cpu_weights("f32") == 134_515_008 * 4 + 49152 * 576 * 4
    planned = compute_budget(BudgetRequest("smollm2-135m", device="8GiB", backend="torch"))
    assert planned.weights_bytes == converted


def test_total_error_only_from_a_fresh_process() -> None:
    from localinfer.budget.report import MemoryCheck

    sizes = dict.fromkeys(
        ["predicted_weights", "measured_weights", "predicted_kv_cache", "measured_kv_cache"], 1
    )
    check = MemoryCheck(
        backend="torch",
        device="cpu",
        **sizes,
        predicted_compute=1,
        measured_overhead=1,
        predicted_total=110,
        rss_growth=100,
    )
    assert check.total_error == pytest.approx(0.10)
    assert check.model_copy(update={"predicted_total": 95}).total_error == pytest.approx(-0.05)
    # RSS growth without the library import, or no RSS at all: no comparable figure.
    assert check.model_copy(update={"library_preloaded": True}).total_error is None
    assert check.model_copy(update={"rss_growth": None}).total_error is None


@pytest.mark.slow  # ~10-20 s: loads the tokenizer and model; the numbers are checked fast above
@pytest.mark.llamacpp
def test_verify_with_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp")
    argv = ["budget", "smollm2-135m", "--ctx", "1024", "--concurrency", "2"]
    assert main([*argv, "--backend", "llamacpp", "--device", "cpu", "--verify", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["verify"]
    assert check["backend"] == "llamacpp"
    assert check["measured_weights"] == check["predicted_weights"] == 96_576_768
    assert check["measured_kv_cache"] == check["predicted_kv_cache"] == 30 * 2 * 192 * 2 * 1024 * 2
    # On the CPU the prediction counts the resident part of llama.cpp's reserved compute
    # buffer (a layer's peak, the masks, one logits row per sequence): at this vocabulary the
    # reserved logits rows fit in the layer's memory, so that is the reservation it reports.
    assert check["predicted_compute"] > 512 * 576 * 4
    assert abs(check["predicted_compute"] / check["measured_overhead"] - 1) <= 0.02
    if check["total_error"] is not None:  # llama_cpp not imported earlier in this process
        assert abs(check["total_error"]) <= 0.10


@pytest.mark.slow
def test_verify_with_torch(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    argv = ["budget", "smollm2-135m", "--ctx", "1024", "--concurrency", "2"]
    assert main([*argv, "--backend", "torch", "--device", "cpu", "--verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check = data["verify"]
    # torch's native kernels keep the file's Q4_1/Q8_0 blocks as stored (the tied LM head is the
    # embedding table's blocks) and cache K/V in float32.
    assert check["measured_weights"] == check["predicted_weights"] == 96_576_768
    assert check["measured_kv_cache"] == check["predicted_kv_cache"] == 30 * 2 * 192 * 4 * 1024 * 2
    # Everything the process gained (library, tokenizer, weights, cache, activations) lands
    # within 10% of the predicted total when torch was first imported by the measurement.
    if check["total_error"] is not None:
        assert abs(check["total_error"]) <= 0.10


def test_verify_needs_the_model_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "qwen3-8b", "--device", "cpu", "--verify"]) == 1
    assert "localinfer pull qwen3-8b" in capsys.readouterr().err
    assert main(["budget", "smollm2-135m", "--device", "8GiB", "--verify"]) == 1
    assert "drop --device SIZE" in capsys.readouterr().err
