"""Marks and fixtures shared by the whole suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Modules whose results depend on the CPU's vector ISA (torch runner and its native kernels,
# oneDNN packing, the calibration the budget and backend choice read): scripts/test runs the
# tests marked `isa` a second time with AVX-512 hidden, as on most laptops.
ISA_DEPENDENT = {
    "test_torch_native",
    "test_native_quant",
    "test_torch_runner",
    "test_select",
    "test_budget",
    "test_budget_cli",
    "test_budget_files",
    "test_budget_measured",
    "test_quant",
    "test_quant_runner",
}


# Choices that a machine makes by timing itself (the torch runner's native kernels against torch
# ops, llama.cpp's flash attention on or off) are given here for the whole run, subprocesses
# included, so which path a test runs never depends on how fast this machine is or how busy it
# was when it measured. A test of another path sets that path itself; the choice logic is tested
# with given timings; the tests of the measurement itself unset these.
PINNED_CHOICES = {"LOCALINFER_NATIVE_PLAN": "native", "LOCALINFER_FLASH_ATTN": "on"}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in PINNED_CHOICES.items():
        os.environ.setdefault(name, value)
    pin_worker_to_its_core()


def pin_worker_to_its_core() -> None:
    """Under pytest-xdist with at least one worker per allowed CPU, hold each worker (and the
    processes it starts) to one CPU of its own.

    Every runner defaults to the cores this process may use (backends/llamacpp/cpu.py), so two
    workers on two cores would each start two compute threads: four threads on two cores, whose
    OpenMP teams (llama.cpp's and torch's) then wait at every barrier for a partner that is not
    running. Pinned, each worker's runners see one core and start one thread. Tests that are
    about thread counts set them themselves."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if count >= len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in ISA_DEPENDENT:
            item.add_marker(pytest.mark.isa)


def cache_with_the_runs_kernels(cache: Path) -> Path:
    """``cache`` (created), whose ``kernels`` folder is the run's own cache's: the native kernels
    are a build product of this machine, not something a test caches, and compiling them again
    for each private cache cost seconds a test (test_torch_native's tests of the build use
    folders of their own)."""
    from localinfer.paths import cache_dir

    kernels = cache_dir() / "kernels"  # LOCALINFER_CACHE_DIR as the run started, or the user's
    kernels.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "kernels").exists():
        (cache / "kernels").symlink_to(kernels, target_is_directory=True)
    return cache


@pytest.fixture
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """LOCALINFER_CACHE_DIR in this test's own folder: nothing cached by another test is seen
    (but the compiled native kernels: cache_with_the_runs_kernels)."""
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(cache_with_the_runs_kernels(tmp_path / "cache")))


@pytest.fixture
def session_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LOCALINFER_CACHE_DIR in one folder for the whole run: kept out of the user's cache, but
    what one test caches (a parsed chat template, a quantized model) the next may reuse."""
    cache = cache_with_the_runs_kernels(tmp_path_factory.getbasetemp() / "cache")
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(cache))


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP threads that
    wait on each other under contention make a run many times slower: use one, then restore."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
