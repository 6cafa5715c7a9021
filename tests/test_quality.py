"""localinfer/quality: metrics on known distributions, windows, lockstep comparison of tiny
runners, the report's warnings, and the command."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localinfer.backends.base import RunnerConfig
from localinfer.backends.torch.runner import TorchRunner
from localinfer.quality.evaluate import compare, decode_speed, eval_text, eval_windows
from localinfer.quality.metrics import MetricSums, log_softmax
from localinfer.quality.report import QualityReport, QualityRow
from tests.tiny import tiny_model

pytestmark = pytest.mark.usefixtures("private_cache", "one_torch_thread")


def test_log_softmax_normalises() -> None:
    lp = log_softmax(np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, -1000.0]], dtype=np.float32))
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0)
    np.testing.assert_allclose(lp[1, :2], math.log(0.5))


def test_metric_sums_on_known_distributions() -> None:
    vocab = 8
    uniform = log_softmax(np.zeros((4, vocab)))
    targets = np.array([0, 3, 5, 7])
    s = MetricSums()
    s.add(uniform, targets, uniform)
    assert s.perplexity == pytest.approx(vocab)
    assert s.mean_kl == pytest.approx(0.0, abs=1e-12)
    # a sharper candidate: KL(uniform || q) = log(vocab) + mean(-log q) over the vocab
    logits = np.zeros((4, vocab))
    logits[np.arange(4), targets] = 3.0
    sharp = log_softmax(logits)
    t = MetricSums()
    t.add(sharp, targets, uniform)
    expect_kl = float((np.exp(uniform) * (uniform - sharp)).sum(-1).mean())
    assert t.mean_kl == pytest.approx(expect_kl) and t.mean_kl > 0
    assert t.perplexity < vocab
    # top-1: uniform's argmax is column 0, the sharp one's is the target
    assert t.top1_agreement == pytest.approx(0.25)
    assert math.isnan(MetricSums().perplexity)


def test_eval_text_is_shipped_and_long_enough() -> None:
    text = eval_text()
    assert len(text) > 8000
    assert "def " in text and "Call me Ishmael" in text


def test_eval_windows() -> None:
    ids = list(range(10))
    assert eval_windows(ids, 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert eval_windows(ids, 4, 9) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a lone token scores nothing


def make(quant: str | None = None, slots: int = 1) -> TorchRunner:
    model = tiny_model(name="tiny", format="gguf")
    return TorchRunner(model, RunnerConfig(slots=slots, max_ctx=80, quant=quant))


def test_compare_identical_runner_has_zero_loss() -> None:
    ids = np.random.default_rng(0).integers(0, 256, size=70).tolist()
    windows = eval_windows(ids, 40, None)
    ref_sums, (same, q8, q4) = compare(
        make(), [make(), make("int8"), make("int4")], windows, chunk=16
    )
    assert ref_sums.tokens == same.tokens == 68  # 39 + 29 scored positions
    assert same.perplexity == pytest.approx(ref_sums.perplexity, rel=1e-6)
    assert same.mean_kl == pytest.approx(0.0, abs=1e-6) and same.top1_agreement == 1.0
    # int4 loses more than int8, both lose something
    assert 0 < q8.mean_kl < q4.mean_kl
    assert q8.top1_agreement >= q4.top1_agreement


def test_compare_chunking_does_not_change_results() -> None:
    ids = np.random.default_rng(1).integers(0, 256, size=50).tolist()
    windows = eval_windows(ids, 50, None)
    a = compare(make(), [make("int8")], windows, chunk=7)
    b = compare(make(), [make("int8")], windows, chunk=64)
    assert a[0].perplexity == pytest.approx(b[0].perplexity, rel=1e-5)
    assert a[1][0].mean_kl == pytest.approx(b[1][0].mean_kl, rel=1e-3, abs=1e-7)


def test_decode_speed_runs_streams() -> None:
    r = make("int8", slots=2)
    speed = decode_speed(r, [1, 2, 3], steps=3, streams=2, repeats=2)  # one prefill, two runs
    assert speed.streams == 2 and speed.tokens_per_s > 0
    assert r.slot_length(0) == r.slot_length(1) == 0


def row(quant: str, ppl: float, kl: float, top1: float, ref: bool = False) -> QualityRow:
    return QualityRow("torch", quant, ppl, kl, top1, 100, 100, None, reference=ref)


def test_report_warns_only_past_thresholds() -> None:
    report = QualityReport(
        "m", 100,
        [row("fp32", 10.0, 0, 1, ref=True), row("int8", 10.1, 0.01, 0.98),
         row("int4", 11.0, 0.2, 0.8)],
    )  # fmt: skip
    warnings = report.warnings()
    assert len(warnings) == 1 and "int4" in warnings[0] and "+10.0%" in warnings[0]
    text = report.render()
    assert "int8" in text and "fp32 (ref)" in text and "WARNING" in text


@pytest.mark.slow
def test_quality_command_on_embedded_model(capsys: pytest.CaptureFixture[str]) -> None:
    from localinfer.cli import main

    assert main(["quality", "--quant", "int8", "--tokens", "64", "--speed-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "int8" in out and "fp32 (ref)" in out


def test_quality_command_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from localinfer.cli import main

    assert main(["quality", "--quant", ",", "--tokens", "64"]) == 1
    assert main(["quality", "--tokens", "1"]) == 1


def test_slow_rows_score_fewer_tokens_against_the_same_reference_tokens() -> None:
    """mlx[cpu] rows score the first SLOW_TOKENS by default, beside the reference on those same
    tokens; every other row scores the whole text; --tokens puts every row on the same N."""
    pytest.importorskip("mlx.core")
    from localinfer.backends.mlx.runner import MLXRunner
    from localinfer.quality.run import SLOW_TOKENS, QualityOptions, score

    model = tiny_model(name="tiny", format="gguf")
    mlx = MLXRunner(model, RunnerConfig(slots=1, max_ctx=80, dtype="float32", device="cpu"))
    ids = np.random.default_rng(2).integers(0, 256, size=SLOW_TOKENS + 40).tolist()
    opts = QualityOptions(window=64, chunk=32)
    ref, (torch_row, mlx_row), note = score(make(), [make("int8"), mlx], ids, opts)
    assert ref.tokens == torch_row.sums.tokens == torch_row.reference.tokens
    assert mlx_row.sums.tokens == mlx_row.reference.tokens < SLOW_TOKENS < ref.tokens
    assert note is not None and f"first {mlx_row.sums.tokens} tokens" in note
    # the same model on another backend: no loss against the reference on its own tokens
    assert mlx_row.sums.perplexity == pytest.approx(mlx_row.reference.perplexity, rel=1e-3)
    assert mlx_row.sums.top1_agreement == 1.0
    every = QualityOptions(window=64, chunk=32, max_tokens=SLOW_TOKENS + 20)
    ref, rows, note = score(make(), [make("int8"), mlx], ids, every)
    assert note is None and {r.sums.tokens for r in rows} == {ref.tokens}


def test_report_compares_a_row_with_the_reference_on_its_own_tokens() -> None:
    short = QualityRow("mlx", "int4", 12.0, 0.01, 0.99, 100, 100, None, reference_perplexity=12.0)
    report = QualityReport("m", 100, [row("fp32", 10.0, 0, 1, ref=True), short])
    assert short.perplexity_rise(report.reference) == 0.0
    assert report.warnings() == [] and "+0.0%" in report.render()


def test_the_files_own_quant_is_named_in_any_case() -> None:
    """`quality --quant q4_1` on the Q4_1 embedded model: torch holds the file's own numbers, as
    with Q4_1, instead of refusing 'q4_1' as a quantization it cannot make (which dropped the
    torch row of `--backend all --quant q4_k_m`). runner_setup.runner_quant matches the name."""
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model
    from localinfer.quality.run import QualityOptions, build_candidates
    from localinfer.runner_setup import runner_quant

    assert runner_quant("q4_k_m", "Q4_K_M") == runner_quant(" Q4_K_M", "Q4_K_M") == "Q4_K_M"
    assert runner_quant("int4", "Q4_K_M") == "int4" and runner_quant(None, "Q4_1") is None
    model = load_model(embedded_model_path())
    notes: list[str] = []
    options = QualityOptions(quants=("q4_1",), backend="torch", window=64, speed_steps=0)
    (candidate,) = build_candidates(model, options, notes)
    try:
        assert candidate.runner.info.quant == "Q4_1" and not notes
    finally:
        candidate.runner.close()
