"""How llama.cpp's OpenMP threads wait (backends/llamacpp/omp_wait.py): the spin count is set
before libgomp loads, a user's choice wins, and a process that already loaded it is told so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localinfer.backends.llamacpp.omp_wait import (
    DEFAULT_POLICY,
    DEFAULT_SPINCOUNT,
    POLICY_ENV,
    SPIN_ENV,
    libgomp_loaded,
    prepare_omp_wait,
)

SYSTEM_GOMP = "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n"
TORCH_GOMP = "7f00-7f10 r-xp 00000000 08:01 43 /venv/torch.libs/libgomp-a34b3233.so.1\n"


@pytest.fixture
def maps(tmp_path: Path) -> Path:
    path = tmp_path / "maps"
    path.write_text("7f00-7f10 r-xp 00000000 08:01 41 /usr/lib/libc.so.6\n" + TORCH_GOMP)
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (SPIN_ENV, POLICY_ENV):
        # setenv first so teardown restores the variable's absence too (what a test sets goes)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_libgomp_loaded_finds_the_system_library_only(maps: Path, tmp_path: Path) -> None:
    assert not libgomp_loaded(maps)  # torch's bundled copy is another library
    maps.write_text(maps.read_text() + SYSTEM_GOMP)
    assert libgomp_loaded(maps)
    assert not libgomp_loaded(tmp_path / "no-such-maps")  # no /proc: nothing to detect


def test_sets_the_spin_count_before_libgomp_loads(maps: Path, clean_env: None) -> None:
    wait = prepare_omp_wait(maps=maps)
    assert (wait.spincount, wait.policy, wait.source) == (
        str(DEFAULT_SPINCOUNT),
        DEFAULT_POLICY,
        "localinfer",
    )
    assert os.environ[SPIN_ENV] == str(DEFAULT_SPINCOUNT)
    assert os.environ[POLICY_ENV] == DEFAULT_POLICY  # the throttled spin too: omp_wait.py
    assert prepare_omp_wait(spincount=5, maps=maps).source == "environment"  # set once


@pytest.mark.parametrize(("name", "value"), [(SPIN_ENV, "300000"), (POLICY_ENV, "PASSIVE")])
def test_the_users_environment_wins(
    maps: Path, clean_env: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    wait = prepare_omp_wait(maps=maps)
    assert wait.source == "environment"
    assert (wait.spincount if name == SPIN_ENV else wait.policy) == value
    assert os.environ.get(SPIN_ENV) == (value if name == SPIN_ENV else None)
    assert os.environ.get(POLICY_ENV) == (value if name == POLICY_ENV else None)


def test_too_late_once_libgomp_is_loaded(maps: Path, clean_env: None) -> None:
    maps.write_text(maps.read_text() + SYSTEM_GOMP)
    wait = prepare_omp_wait(maps=maps)
    assert wait.source == "too late"
    assert SPIN_ENV not in os.environ and POLICY_ENV not in os.environ


CHILD = """
import json, os
from localinfer.backends.base import RunnerConfig
from localinfer.backends.llamacpp.omp_wait import libgomp_loaded
from localinfer.backends.llamacpp.runner import LlamaCppRunner
from localinfer.loading.embedded import embedded_model_path
from tests.model_files import file_model
before = libgomp_loaded()
model = file_model(embedded_model_path(), "Q4_1")
runner = LlamaCppRunner(model, RunnerConfig(slots=1, max_ctx=32, threads=1))
print(json.dumps([before, libgomp_loaded(), os.environ.get("GOMP_SPINCOUNT"),
                  os.environ.get("OMP_WAIT_POLICY")]))
runner.close()
"""


@pytest.mark.llamacpp
def test_a_fresh_process_opening_a_runner_gets_the_spin_count() -> None:
    pytest.importorskip("llama_cpp")
    env = {k: v for k, v in os.environ.items() if k not in (SPIN_ENV, POLICY_ENV)}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after, spin, policy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before is False
    assert (spin, policy) == (str(DEFAULT_SPINCOUNT), DEFAULT_POLICY)
    if sys.platform.startswith("linux"):  # llama-cpp-python's Linux build runs on OpenMP
        assert after is True
