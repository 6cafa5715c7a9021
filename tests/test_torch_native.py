"""The torch runner's native CPU kernels (backends/torch/cpu_kernels.c): the matrix product on its
own, the whole forward with several threads, and what happens when they cannot be built."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch import cpu_kernels, native_build  # noqa: E402
from localinfer.backends.torch.block_weights import BlockMatrix  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from tests.reference_numpy import reference_logits  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.NativeKernels:
    return cpu_kernels.load_kernels() or pytest.fail(
        "native kernels did not build on this machine (see the logged reason)"
    )


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("tokens", [1, 2, 7, 8, 9, 17])
def test_linear_matches_torch_with_tails_and_bias(
    kernels: cpu_kernels.NativeKernels, tokens: int, threads: int
) -> None:
    # in = 100: six 16-wide blocks and a 4-element tail; out = 37 rows split unevenly.
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 100, generator=g)
    w = torch.randn(37, 100, generator=g)
    b = torch.randn(37, generator=g)
    got = kernels.linear(x, w, b, threads)
    want = (x.double() @ w.double().T + b.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # Each token's row is the same computed alone: the result does not depend on the batch.
    for t in range(tokens):
        assert torch.equal(kernels.linear(x[t : t + 1].contiguous(), w, b, threads)[0], got[t])


def test_the_expected_isa_is_the_built_librarys(kernels: cpu_kernels.NativeKernels) -> None:
    """What a given plan (and so the backend choice) assumes without compiling is what the
    library this machine built reports."""
    here = native_build.Platform.here()
    assert native_build.kernel_isa(here, native_build.cpu_flags()) == kernels.isa()


def test_linear_rejects_other_dtypes(kernels: cpu_kernels.NativeKernels) -> None:
    with pytest.raises(ValueError, match="float32"):
        kernels.linear(torch.ones(1, 4, dtype=torch.float64), torch.ones(2, 4), None, 1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_forward_with_two_threads_matches_reference(arch: str) -> None:
    """The torch runner tests hold torch at one thread (conftest's one_torch_thread); the kernels
    split every phase over threads, so check a ragged batch with two."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = tiny_model(arch)
        runner = TorchRunner(model, RunnerConfig(slots=3, max_ctx=64, dtype="float32"))
        assert runner.native_max_tokens > 0
        seqs = {
            0: random_tokens(9, seed=1),
            1: random_tokens(3, seed=2),
            2: random_tokens(14, seed=3),
        }
        runner.forward([SlotWork(s, tuple(t[:-2]), 0) for s, t in seqs.items()])
        outs = runner.forward(
            [SlotWork(s, tuple(t[-2:]), len(t) - 2, logits="all") for s, t in seqs.items()]
        )
        for (slot, toks), got in zip(seqs.items(), outs, strict=True):
            want = reference_logits(model.config, model.weights, toks)[-2:]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"slot {slot}")
    finally:
        torch.set_num_threads(before)


def assert_torch_ops_fallback(native_max_tokens: int | None = None) -> None:
    """With no kernels to load, a float32 runner (even one asking for them) runs torch ops and
    matches the numpy reference."""
    config = RunnerConfig(slots=1, max_ctx=32, dtype="float32")
    runner = TorchRunner(tiny_model(), config, native_max_tokens=native_max_tokens)
    assert runner.native_max_tokens == 0
    tokens = random_tokens(5)
    (got,) = runner.forward([SlotWork(0, tuple(tokens), 0, logits="all")])
    want = reference_logits(runner.model_config, tiny_model().weights, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_without_a_compiler_the_runner_keeps_torch_ops(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))  # nothing built yet there
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    cpu_kernels._load.cache_clear()
    try:
        assert not native_build.native_kernels_expected()  # what the budget asks
        with caplog.at_level(logging.WARNING):
            assert cpu_kernels.load_kernels() is None
        assert "no C compiler found" in caplog.text
        assert_torch_ops_fallback()
    finally:
        cpu_kernels._load.cache_clear()


def test_build_is_cached_and_a_failed_compile_is_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    first = native_build.build()
    assert first.parent == tmp_path / "kernels"
    stamp = first.stat().st_mtime_ns
    assert native_build.build() == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary left

    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(native_build, "SOURCE", broken)
    with pytest.raises(native_build.BuildError, match="failed"):
        native_build.build()
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]


def test_kernels_that_crash_this_cpu_leave_torch_ops_in_charge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The calibration child dies of SIGILL (a library with instructions this CPU does not run,
    as on a VM that advertises AVX-512 it cannot execute): this process never calls the kernels,
    every decision is torch ops, and the next process reads that from the cache."""
    from localinfer.backends.torch import native_plan, profile

    built = native_build.build()
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    here = native_build.Platform.here()
    library = native_build.library_path(native_build.build_flags(here)[0], native_build.compiler())
    library.parent.mkdir(parents=True)
    shutil.copy(built, library)
    crash = tmp_path / "python"
    crash.write_text("#!/bin/sh\nkill -ILL $$\n")
    crash.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(crash))
    monkeypatch.delenv(native_plan.PLAN_ENV)  # measured here, not the suite's pinned plan
    native_plan._measure_once.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert native_plan.native_f32_tokens() == 0
        assert "illegal instruction" in caplog.text and str(library) in caplog.text
        assert not native_plan.keeps_blocks()
        assert not profile.native_blocks_preferred("Q4_1", "llama")
        assert_torch_ops_fallback()
        native_plan._measure_once.cache_clear()  # a later process: no child to ask
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
        assert native_plan.native_plan() == native_plan.Calibration.crashed()
    finally:
        native_plan._measure_once.cache_clear()


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_build.DISABLE_ENV, "0")
    runner = TorchRunner(tiny_model(), RunnerConfig(slots=1, max_ctx=16, dtype="float32"))
    assert runner.native_max_tokens == 0
    assert not native_build.native_kernels_expected()


def _vma_flags(address: int) -> list[str]:
    """VmFlags of the mapping holding ``address`` (Linux /proc/self/smaps)."""
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = lo <= address < hi
        elif current and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


# QEMU's user mode (scripts/test-emulated-cpu) drops madvise hints: no huge pages to see there.
HUGE_PAGES_SEEN = Path("/proc/self/smaps").exists() and not os.environ.get(
    "LOCALINFER_TEST_EMULATED_CPU"
)


@pytest.mark.skipif(not HUGE_PAGES_SEEN, reason="Linux /proc, not emulated")
def test_dense_fp32_weights_sit_on_huge_pages_with_their_own_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big_vocab = tiny_model(vocab_size=16384)  # 4 MiB of embeddings: worth an arena
    runner = TorchRunner(big_vocab, RunnerConfig(slots=1, max_ctx=16, dtype="float32"))
    weights = runner._model.weights
    matrices = [weights.embed] + [m for layer in weights.layers for m in (layer.qkv, layer.down)]
    for m in matrices:
        assert "hg" in _vma_flags(m.data_ptr())  # advised MADV_HUGEPAGE
        assert m.untyped_storage().nbytes() == m.nbytes  # accounting sees the tensor alone
    assert runner.memory().weights == weights.nbytes()
    # The arena is only for the dense fp32 CPU path: bf16 (oneDNN-packed) never asks for one.
    from localinfer.backends.torch import huge_pages

    asked: list[int] = []
    real = huge_pages.HugePageArena.create.__func__
    spy = classmethod(lambda cls, n: asked.append(n) or real(cls, n))
    monkeypatch.setattr(huge_pages.HugePageArena, "create", spy)
    TorchRunner(big_vocab, RunnerConfig(slots=1, max_ctx=16, dtype="bfloat16"))
    assert asked == []
    TorchRunner(big_vocab, RunnerConfig(slots=1, max_ctx=16, dtype="float32"))
    assert len(asked) == 1


def test_arena_hands_out_aligned_separate_tensors() -> None:
    from localinfer.backends.torch.huge_pages import HUGE_PAGE, HugePageArena

    shapes = [(3, 5), (1000, 700), (7,)]
    arena = HugePageArena.create(max(HUGE_PAGE, HugePageArena.padded_bytes(shapes, 4)))
    if arena is None:
        pytest.skip("no huge-page arena on this platform")
    tensors = [arena.empty(s, torch.float32) for s in shapes]
    for t, s in zip(tensors, shapes, strict=True):
        assert t.shape == s and t.data_ptr() % 64 == 0
        t.fill_(float(len(s)))
    assert [float(t.sum()) for t in tensors] == [15 * 2.0, 700_000 * 2.0, 7 * 1.0]
    with pytest.raises(MemoryError):
        arena.empty((HUGE_PAGE,), torch.float32)


# -- builds for other machines: flag sets, ISA levels, the fallback ----------------------------


def test_flag_sets_follow_the_platform() -> None:
    Platform = native_build.Platform
    linux = native_build.build_flags(Platform("Linux", "x86_64"))
    assert "-march=native" in linux[0] and "-fopenmp" in linux[0] and "-fopenmp" not in linux[1]
    avx2 = native_build.build_flags(Platform("Linux", "x86_64", "avx2"))[0]
    assert "-mno-avx512f" in avx2
    assert "-march=x86-64" in native_build.build_flags(Platform("Linux", "x86_64", "generic"))[0]
    arm = native_build.build_flags(Platform("Linux", "aarch64"))
    assert "-mcpu=native" in arm[0] and not any("-march" in f for f in arm[0])
    mac = native_build.build_flags(Platform("Darwin", "arm64"))
    assert len(mac) == 1 and "-fopenmp" not in mac[0] and "-mcpu=apple-m1" in mac[0]


def test_unknown_isa_level_is_a_build_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_build.ISA_ENV, "avx9000")
    with pytest.raises(native_build.BuildError, match="avx9000"):
        native_build.Platform.here()


@pytest.mark.skipif(
    not native_build.Platform.here().machine.startswith(("x86", "amd")), reason="x86-64 ISA levels"
)
@pytest.mark.parametrize(
    "where",
    [
        native_build.Platform("Linux", "x86_64", "avx2"),
        native_build.Platform("Linux", "x86_64", "generic"),
        native_build.Platform("Darwin", "x86_64"),  # as macOS builds it: no OpenMP
    ],
    ids=["avx2", "generic", "no-openmp"],
)
def test_other_builds_give_the_same_products_bit_for_bit(
    kernels: cpu_kernels.NativeKernels, where: native_build.Platform
) -> None:
    """The AVX2 lanes and a single-threaded build compute every product (float32 rows and each
    block type) and embedding row exactly as this machine's build does; baseline x86-64 has no
    FMA (each multiply-add rounds twice), so its products agree to float32 rounding and its
    decoded block rows exactly."""
    other = cpu_kernels.open_library(native_build.build(where))
    expected_isa = {"avx2": 256, "generic": 0}.get(where.isa)
    if expected_isa is not None:
        assert other.isa() == expected_isa
    fma = where.isa != "generic"

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if fma else torch.allclose(a, b, rtol=1e-5, atol=1e-4)

    g = torch.Generator().manual_seed(7)
    w = torch.randn(67, 256, generator=g)
    for tokens in (1, 3, 4, 5, 9):
        x = torch.randn(tokens, 256, generator=g)
        assert same(other.linear(x, w, None, 2), kernels.linear(x, w, None, 2))
        for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
            rows = np.random.default_rng(tokens).normal(size=(67, 256)).astype(np.float32)
            stored = np.asarray(gguf_quants.quantize(rows, qtype))
            m = BlockMatrix(qtype.name, torch.from_numpy(stored.copy()), 256)
            assert same(other.linear(x, m, None, 2), kernels.linear(x, m, None, 2)), qtype
            ids = torch.tensor([0, 5, 66])
            assert torch.equal(other.dequant_rows(m, ids), kernels.dequant_rows(m, ids))


def test_a_build_for_another_platform_that_fails_falls_back_to_torch_ops(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """Apple Silicon's flags on this machine's compiler do not compile: the runner says so in
    one log line and runs torch ops, with the same results."""
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    here = native_build.Platform.here()
    if here.machine in ("arm64", "aarch64"):
        pytest.skip("on ARM these flags may compile")
    monkeypatch.setattr(
        native_build.Platform, "here", classmethod(lambda cls: cls("Darwin", "arm64"))
    )
    cpu_kernels._load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert cpu_kernels.load_kernels() is None
        assert len(caplog.records) == 1 and "using torch ops" in caplog.text
        assert_torch_ops_fallback(native_max_tokens=32)
    finally:
        cpu_kernels._load.cache_clear()


def test_a_given_plan_replaces_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    from localinfer.backends.torch import native_plan
    from localinfer.errors import BackendUnavailableError

    monkeypatch.setenv(native_plan.PLAN_ENV, "native")
    assert native_plan.native_f32_tokens() == native_plan.DEFAULT_MAX_TOKENS
    assert native_plan.keeps_blocks()
    runner = TorchRunner(tiny_model(), RunnerConfig(slots=1, max_ctx=16, dtype="float32"))
    assert runner.native_max_tokens == native_plan.DEFAULT_MAX_TOKENS
    monkeypatch.setenv(native_plan.PLAN_ENV, "torch")
    assert native_plan.native_f32_tokens() == 0
    assert not native_plan.keeps_blocks()
    runner = TorchRunner(tiny_model(), RunnerConfig(slots=1, max_ctx=16, dtype="float32"))
    assert runner.native_max_tokens == 0
    monkeypatch.setenv(native_plan.PLAN_ENV, "fastest")
    with pytest.raises(BackendUnavailableError, match="expected 'native' or 'torch'"):
        native_plan.native_plan()


def test_the_measurement_times_every_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine's own measurement (what runs without a given plan): every product timed,
    whatever it concludes. Which path it picks is not asserted: that is this machine's timing."""
    from localinfer.backends.torch import native_plan

    # A cache of its own, so no stored calibration is found and none is left in the run's; its
    # library is a copy of the run's build (compiling it again is the test above's subject, and
    # cost more than the measurement).
    built = native_build.build()
    (tmp_path / "kernels").mkdir()
    shutil.copy2(built, tmp_path / "kernels" / built.name)
    monkeypatch.delenv(native_plan.PLAN_ENV)
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    assert native_plan._library() == tmp_path / "kernels" / built.name
    assert native_plan._stored(native_plan._library()) is None
    native_plan._measure_once.cache_clear()
    try:
        plan = native_plan.native_plan()
    finally:
        native_plan._measure_once.cache_clear()
    assert plan is not None and plan.threads == native_plan.CALIBRATION_THREADS
    assert sorted(row.tokens for row in plan.products) == list(native_plan.TOKEN_COUNTS)
    for row in plan.products:
        assert 0 < row.native_f32 < 1 and 0 < row.native_q4_1 < 1 and 0 < row.torch_f32 < 1
    assert 0 <= plan.native_f32_max_tokens() <= native_plan.DEFAULT_MAX_TOKENS
    assert native_plan._stored(native_plan._library()) == plan  # kept for the next process


@pytest.mark.parametrize(
    ("q4_1_seconds", "kept"),
    [(0.9e-4, True), (1.01e-4, True), (1.1e-4, True), (1.3e-4, False)],
)
def test_blocks_are_kept_unless_clearly_slower(q4_1_seconds: float, kept: bool) -> None:
    """Given timings (not this machine's): blocks read ~5x fewer bytes of a whole model than
    float32, so a near tie on the calibration's cached matrix keeps them; only a product on
    them more than BLOCKS_MARGIN slower than the faster float32 path drops them."""
    from localinfer.backends.torch import native_plan

    rows = tuple(
        native_plan.ProductTimes(tokens, 1e-4 * tokens, q4_1_seconds * tokens, 2e-4 * tokens)
        for tokens in native_plan.TOKEN_COUNTS
    )
    plan = native_plan.Calibration(isa=512, threads=1, torch_overhead=0.0, products=rows)
    assert plan.blocks_faster() is kept
    assert 1.1 < native_plan.BLOCKS_MARGIN < 1.3
