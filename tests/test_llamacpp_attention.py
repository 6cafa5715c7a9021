"""Flash attention on or off for llama.cpp on the CPU, chosen by a measurement on this machine for
the model's attention heads, on a probe model with those heads (backends/llamacpp/attention_plan.py,
attention_probe.py); the budget follows the same choice."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import threading
from pathlib import Path

import pytest

from localinfer.backend_budget import compute_budget
from localinfer.backend_profile import stored_measurements_only
from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.llamacpp import attention_plan as plan
from localinfer.backends.llamacpp.attention_plan import (
    AttentionCalibration,
    AttentionTimes,
    flash_attention,
    scores_bytes,
)
from localinfer.backends.llamacpp.attention_probe import (
    PROBE_EMBD,
    PROBE_LAYERS,
    PROBE_VOCAB,
    AttentionShape,
    probe_path,
)
from localinfer.backends.llamacpp.profile import PROFILE
from localinfer.budget.report import BudgetRequest
from localinfer.errors import BackendUnavailableError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.model_listing import BudgetAsk, list_models

pytest.importorskip("llama_cpp")

from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402

SMOLLM2 = AttentionShape(9, 3, 64)  # the embedded model's heads


@pytest.fixture(scope="module")
def embedded():
    return load_model(embedded_model_path())


def _calibration(on: tuple[float, float], off: tuple[float, float]) -> AttentionCalibration:
    rows = (AttentionTimes(True, *on), AttentionTimes(False, *off))
    return AttentionCalibration(threads=2, depths=(256, 1024), rows=rows)


def test_off_is_chosen_only_when_it_saves_the_margin() -> None:
    assert not _calibration((0.050, 0.025), (0.030, 0.009)).flash_faster()
    assert _calibration((0.040, 0.009), (0.050, 0.025)).flash_faster()
    # 2%, 10% or 30% faster off is within the margin: llama.cpp's own default stays.
    assert _calibration((0.050, 0.010), (0.049, 0.0098)).flash_faster()
    assert _calibration((0.050, 0.010), (0.045, 0.009)).flash_faster()
    assert _calibration((0.050, 0.010), (0.035, 0.007)).flash_faster()
    # Just past the margin, off.
    saved = 1 - plan.MARGIN - 0.01
    assert not _calibration((0.050, 0.010), (0.050 * saved, 0.010 * saved)).flash_faster()
    assert 0.30 < plan.MARGIN < 0.70


def test_off_needs_the_margin_in_every_round_not_only_in_the_medians() -> None:
    """A noisy machine: the medians say off saves 44%, but one round saw it save 5%."""
    medians = _calibration((0.050, 0.025), (0.028, 0.014))
    assert not medians.flash_faster()
    held = dataclasses.replace(medians, round_savings=(0.46, 0.42, 0.45, 0.44))
    assert not held.flash_faster()
    one_off = dataclasses.replace(medians, round_savings=(0.46, 0.05, 0.45, 0.44))
    assert one_off.flash_faster()
    assert AttentionCalibration.from_json(json.loads(json.dumps(one_off.to_json()))) == one_off


def test_calibration_round_trips_through_json() -> None:
    c = _calibration((0.05, 0.02), (0.04, 0.01))
    assert AttentionCalibration.from_json(json.loads(json.dumps(c.to_json()))) == c


@pytest.fixture
def fresh_measurement(private_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plan.ENV, raising=False)  # the suite pins the choice (conftest)
    plan.forget()
    yield
    plan.forget()


def counting_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that logs each start, then is this one: counts child processes."""
    log, exe = tmp_path / "starts.log", tmp_path / "python"
    exe.write_text(f'#!/bin/sh\necho start >> "{log}"\nexec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return exe, log


def test_environment_overrides_and_the_scores_cap(
    monkeypatch: pytest.MonkeyPatch, fresh_measurement: None
) -> None:
    monkeypatch.setenv(plan.ENV, "off")
    assert flash_attention(SMOLLM2, 2048) is False
    monkeypatch.setenv(plan.ENV, "on")
    assert flash_attention(SMOLLM2, 2048) is True
    monkeypatch.delenv(plan.ENV)
    # Beyond the cap of materialized scores, flash attention stays on without measuring.
    ctx = plan.SCORES_CAP // (plan.PREFILL_UBATCH * 32 * 4) + 1
    assert scores_bytes(32, ctx) > plan.SCORES_CAP
    assert flash_attention(AttentionShape(32, 8, 128), ctx) is True
    assert not list(Path(plan.cache_dir()).glob("llamacpp/attention-*.json"))


def test_measured_once_stored_and_reused(
    fresh_measurement: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real measurement in a child process: two settings with positive times, stored. Two
    threads asking at once start one child (the other waits for its file); later calls read it."""
    exe, starts = counting_python(tmp_path)
    monkeypatch.setattr(sys, "executable", str(exe))
    results: list[AttentionCalibration | None] = []

    def ask() -> None:
        results.append(plan.calibration(2, SMOLLM2))

    threads = [threading.Thread(target=ask) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert starts.read_text().count("start") == 1
    result = results[0]
    assert result is not None and results[1] == result
    assert {r.flash for r in result.rows} == {True, False}
    assert all(r.decode > 0 and r.prefill > 0 and r.batched > 0 for r in result.rows)
    assert result.heads == SMOLLM2.key
    path = plan.calibration_path(2, SMOLLM2)
    assert path is not None and path.is_file()
    assert plan.calibration(2, SMOLLM2) == result and starts.read_text().count("start") == 1
    path.write_text("{not json")  # a damaged file is measured again, not a crash
    assert plan.calibration(2, SMOLLM2) is not None and starts.read_text().count("start") == 2
    # Other heads are another measurement, in another file
    other = AttentionShape(4, 1, 256)
    assert plan.calibration_path(2, other) != path
    assert plan.calibration(2, other).heads == other.key  # type: ignore[union-attr]
    assert starts.read_text().count("start") == 3


def test_a_listing_reads_stored_measurements_and_starts_none(
    fresh_measurement: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`localinfer models` budgets every catalog model inside stored_measurements_only: a head
    shape never measured here counts llama.cpp's default (flash on) and starts no child; one
    measured before gives its stored answer; outside, a budget measures as before."""
    exe, starts = counting_python(tmp_path)
    monkeypatch.setattr(sys, "executable", str(exe))
    with stored_measurements_only():
        assert flash_attention(SMOLLM2, 2048) is True
        assert flash_attention(AttentionShape(4, 1, 256), 2048) is True
    assert not starts.exists()  # no measuring child started
    off_is_faster = _calibration((0.050, 0.025), (0.030, 0.009))
    threads = plan._default_threads()
    plan.store_calibration(
        dataclasses.replace(off_is_faster, threads=threads, depths=plan.DEPTHS, heads=SMOLLM2.key)
    )
    with stored_measurements_only():
        assert flash_attention(SMOLLM2, 2048) is False
        assert flash_attention(AttentionShape(4, 1, 256), 2048) is True
    assert not starts.exists()
    flash_attention(AttentionShape(4, 1, 256), 2048)  # outside a listing: measured now
    assert starts.read_text().count("start") == 1


def test_listing_every_model_measures_nothing(
    fresh_measurement: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first `localinfer models` on a machine: every catalog model budgeted, no attention
    measured (one per head shape took ~100 s on a 2-core machine)."""

    def refuse(*_: object) -> None:
        raise AssertionError("a listing measured llama.cpp's attention")

    monkeypatch.setattr(plan, "_measure", refuse)
    listed = list_models(BudgetAsk())
    assert len(listed) >= 10 and all(m.report is not None for m in listed if m.source != "hub")


def test_the_probe_runs_once_per_machine(
    fresh_measurement: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    exe, starts = counting_python(tmp_path)
    monkeypatch.setattr(sys, "executable", str(exe))
    plan.check_runs_here()
    plan.check_runs_here()
    assert starts.read_text().count("start") == 1


def test_a_failed_measurement_keeps_llama_cpp_default(
    monkeypatch: pytest.MonkeyPatch, fresh_measurement: None, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits 1 without output
    with caplog.at_level(logging.WARNING):
        assert plan.calibration(2, SMOLLM2) is None
        assert flash_attention(SMOLLM2, 2048) is True
    assert "flash attention stays on" in caplog.text


def test_runner_follows_the_decision(embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    config = RunnerConfig(slots=1, max_ctx=512, threads=2)
    for asked in ("on", "off"):
        monkeypatch.setenv(plan.ENV, asked)
        runner = LlamaCppRunner(embedded, config)
        assert runner.flash_attention is (asked == "on")
        runner.close()
    monkeypatch.delenv(plan.ENV)
    runner = LlamaCppRunner(embedded, config)
    assert runner.flash_attention is flash_attention(embedded.config, 512)
    runner.close()
    explicit = LlamaCppRunner(embedded, config, flash_attn=True)  # an explicit choice wins
    assert explicit.flash_attention is True
    explicit.close()


def test_synthetic_fill_gives_a_cache_of_that_depth(embedded) -> None:
    runner = LlamaCppRunner(
        embedded, RunnerConfig(slots=1, max_ctx=700, threads=2), flash_attn=False
    )
    runner.fill_synthetic(0, 600)
    assert runner.slot_length(0) == 600
    (logits,) = runner.forward([SlotWork(0, (300,), 600)])
    assert logits.shape[-1] > 0 and runner.slot_length(0) == 601
    runner.close()


def test_budget_counts_scores_exactly_when_the_runner_goes_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On this CPU the budget asks the runner's question: without flash attention it adds the
    chunk's scores (512 x 9 heads x 4096 x 4 bytes) beside the layer, their f16 copy (x 2
    bytes), and holds the attention mask (4096 cells x 512 tokens) in f32 rather than f16;
    another machine gets llama.cpp's default."""
    path = str(embedded_model_path())
    budgets = {}
    for asked in ("on", "off"):
        monkeypatch.setenv(plan.ENV, asked)
        request = BudgetRequest(path, ctx=4096, backend="llamacpp", device="cpu")
        budgets[asked] = compute_budget(request)
    mask = 4096 * 512 * (4 - 2)
    extra = budgets["off"].compute_bytes - budgets["on"].compute_bytes
    assert extra == 512 * 9 * 4096 * (4 + 2) + mask == scores_bytes(9, 4096) + mask
    assert PROFILE.fused_attention("cpu", SMOLLM2, 4096, 512) is False  # still "off"
    assert PROFILE.fused_attention("planned", SMOLLM2, 4096, 512) is True


def test_a_llama_cpp_built_for_another_cpu_is_an_error_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, fresh_measurement: None, tmp_path: Path, embedded
) -> None:
    """The child that measures dies with an illegal instruction, as a llama-cpp-python built
    on a machine with AVX-512 does on a laptop: the runner refuses with the fix, before this
    process loads the library."""
    crash = tmp_path / "python"
    crash.write_text("#!/bin/sh\nkill -ILL $$\n")
    crash.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(crash))
    with pytest.raises(BackendUnavailableError, match="illegal instruction.*--force-reinstall"):
        LlamaCppRunner(embedded, RunnerConfig(slots=1, max_ctx=256, threads=2))


def test_verify_measures_the_last_chunk_and_falls_back_cleanly(embedded) -> None:
    """budget --verify fills the slot to the context's last chunk (so the scores it measures
    span every cell); a fill the runner refuses measures at the start instead of failing."""
    from localinfer.budget_verify import _deep_start

    report = compute_budget(BudgetRequest(str(embedded_model_path()), ctx=1024, backend="llamacpp"))
    runner = LlamaCppRunner(embedded, RunnerConfig(slots=1, max_ctx=1024, threads=2))
    assert _deep_start(runner, report, 256) == 768 and runner.slot_length(0) == 768
    runner.close()

    class Refuses(LlamaCppRunner):
        def fill_synthetic(self, slot: int, n_tokens: int) -> None:
            self.forward([SlotWork(slot, (1, 2, 3), 0)])
            raise RuntimeError("llama.cpp refused to restore slot 0's state")

    refusing = Refuses(embedded, RunnerConfig(slots=1, max_ctx=1024, threads=2))
    assert _deep_start(refusing, report, 256) == 0 and refusing.slot_length(0) == 0
    refusing.close()


def test_each_head_shape_is_decided_by_its_own_measurement(
    fresh_measurement: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many narrow heads (the embedded model's) measured faster without flash attention, few
    wide ones (Gemma 3 270M's) with it: each shape gets its own answer, asked once."""
    wide = AttentionShape(4, 1, 256)
    timings = {
        SMOLLM2.key: ((0.050, 0.025), (0.030, 0.009)),
        wide.key: ((0.040, 0.009), (0.045, 0.01)),
    }
    asked: list[str] = []

    def measured(threads: int, shape: AttentionShape) -> AttentionCalibration:
        asked.append(shape.key)
        return _calibration(*timings[shape.key])

    monkeypatch.setattr(plan, "calibration", measured)
    assert flash_attention(SMOLLM2, 2048) is False
    assert flash_attention(wide, 2048) is True
    assert flash_attention(SMOLLM2, 4096) is False
    assert asked == [SMOLLM2.key, wide.key]


def test_the_probe_model_has_the_heads_and_little_else(tmp_path: Path) -> None:
    """The probe llama.cpp loads: the asked heads over a small residual stream, no tokenizer."""
    import gguf

    shape = AttentionShape(8, 2, 32)
    path = probe_path(tmp_path, shape)
    assert probe_path(tmp_path, shape) == path  # written once
    fields = gguf.GGUFReader(path).fields

    def value(key: str) -> object:
        field = fields[key]
        return field.contents()

    assert value("llama.attention.head_count") == 8
    assert value("llama.attention.head_count_kv") == 2
    assert value("llama.attention.key_length") == 32
    assert value("llama.embedding_length") == PROBE_EMBD
    assert value("llama.block_count") == PROBE_LAYERS
    assert value("tokenizer.ggml.model") == "none"
    assert value("llama.vocab_size") == PROBE_VOCAB
    with pytest.raises(ValueError, match="do not share"):
        AttentionShape(9, 2, 64)


def test_the_two_settings_alternate_so_a_drifting_machine_slows_both_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Equal kernels on a machine that slows down through the measurement: timed one setting
    after the other, the later one would look slower by the drift; in alternating rounds with
    medians, the two come out equal. The order of the timings shows the alternation."""
    from localinfer.backends.llamacpp import attention_calibrate as calibrate

    order: list[tuple[bool, int]] = []

    class FakeProbe:
        def __init__(self, model_ptr: object, flash: bool, threads: int) -> None:
            self.flash = flash

        def fill_to(self, depth: int) -> None:
            pass

        def times_at(self, depth: int) -> tuple[float, ...]:
            order.append((self.flash, depth))
            slow = 1.0 + 0.1 * len(order)  # the machine drifts: each timing 10% slower
            return (0.001 * slow, 0.0005 * slow, 0.0007 * slow)

        def close(self) -> None:
            pass

    monkeypatch.setattr(calibrate, "_ProbeContext", FakeProbe)
    on, off, savings = calibrate.time_settings(object(), 2)
    rounds = calibrate.ROUNDS
    assert len(order) == 2 * rounds * len(plan.DEPTHS)
    first_depth = order[: 2 * rounds]
    assert [flash for flash, _ in first_depth[:4]] == [True, False, False, True]
    assert on.flash and not off.flash
    assert abs(off.chat_turn() / on.chat_turn() - 1) < 0.05
    assert len(savings) == rounds and all(abs(s) < 0.2 for s in savings)
    assert AttentionCalibration(2, plan.DEPTHS, (on, off), round_savings=savings).flash_faster()
