"""Every script under scripts/ starts when typed as the README shows it, from a plain shell.

The scripts are run as `scripts/NAME --help` with the project venv off PATH, as on a fresh clone
where nothing is activated. They reuse the existing .venv: scripts/_env.sh is idempotent once its
stamp is current, so these runs install nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCED = ("_env.sh", "_llamacpp_gpu.sh")  # read by other scripts, never run alone
SCRIPTS = sorted(
    p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and p.name not in SOURCED
)
# What the scripts ask _env.sh for between them (scripts/test asks for all of these).
EXTRAS = {"torch", "llamacpp", "mlx", "test"}


def _stamp_is_current() -> bool:
    """True when scripts/_env.sh would install nothing (a run here must not reach a registry)."""
    stamp = ROOT / ".venv" / ".install-stamp"
    if not stamp.is_file():
        return False
    parts = stamp.read_text().split()
    want_hash = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return len(parts) == 2 and parts[0] == want_hash and set(parts[1].split(",")) >= EXTRAS


pytestmark = pytest.mark.skipif(
    not _stamp_is_current(),
    reason="the .venv install stamp is stale: run scripts/test once so _env.sh installs nothing",
)


@pytest.fixture(scope="module")
def plain_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The caller's environment without any trace of the project venv, and with a `python` and
    `python3` on PATH that are not the project's (as a system Python without its packages is):
    a script must reach the venv by itself, not through whatever `python` the shell finds."""
    stubs = tmp_path_factory.mktemp("bin")
    for name in ("python", "python3"):
        stub = stubs / name
        stub.write_text("#!/bin/sh\necho 'not the project python' >&2\nexit 97\n")
        stub.chmod(0o755)
    venv = str(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not d.startswith(venv)]
    env["PATH"] = os.pathsep.join([str(stubs), *path])
    return env


def run_ok(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run ``argv`` and check that it exits 0; its stdout."""
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_help_runs_from_a_plain_shell(name: str, plain_env: dict[str, str]) -> None:
    out = run_ok([f"scripts/{name}", "--help"], ROOT, plain_env, timeout=300)
    assert out.strip()
    # The sh line of the Python scripts' polyglot is no part of their help text.
    assert "_python" not in out or name == "_python"


def test_bench_embeddings_quick_run(plain_env: dict[str, str]) -> None:
    """scripts/bench-embeddings --quick: one JSON line per backend with every figure measured, and
    the stream's greedy tokens beside the job equal to its tokens alone."""
    # One text (13 tokens): the job still runs beside a stream that outlives it, and the stream
    # alone then decodes as many tokens; what the stream decodes beside the job, and so the run's
    # cost, grows with the job's tokens (two texts, 37 tokens, cost twice as much).
    argv = ["scripts/bench-embeddings", "--quick", "--texts", "1", "--threads", "1"]
    out = run_ok(argv, ROOT, plain_env, timeout=600)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["backend"] for r in records] == ["torch", "llamacpp"]
    for r in records:
        assert r["job_texts"] == 1 and r["job_tokens"] > 2
        assert r["same_tokens"] and r["stream_outlived"]
        rates = ("embed_alone_tps", "decode_alone_tps", "decode_beside_tps", "job_beside_tps")
        assert all(r[k] > 0 for k in rates)
        assert r["ratio"] == pytest.approx(r["decode_beside_tps"] / r["decode_alone_tps"])
    assert "decode beside" in out  # the table


def test_python_launcher_keeps_the_callers_directory(
    tmp_path: Path, plain_env: dict[str, str]
) -> None:
    # _env.sh moves to the repo root; relative paths given to a script must still mean the same.
    code = "import os, localinfer; print(os.getcwd())"
    out = run_ok([str(ROOT / "scripts" / "_python"), "-c", code], tmp_path, plain_env, timeout=120)
    assert Path(out.strip()) == tmp_path
