"""`localinfer pull` / `rm` end to end against a fake Hub on 127.0.0.1 (tests/hub_server.py):
only the asked file is fetched, a dropped connection resumes with a Range request, the budget
refuses what cannot fit, and `rm` frees the space. No real network."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localinfer.loading.embedded import embedded_model_path
from tests.hub_server import FakeHub

REPO_360 = "bartowski/SmolLM2-360M-Instruct-GGUF"
FILE_Q8 = "SmolLM2-360M-Instruct-Q8_0.gguf"
FILE_Q4 = "SmolLM2-360M-Instruct-Q4_K_M.gguf"
REPO_17 = "bartowski/SmolLM2-1.7B-Instruct-GGUF"
FILE_17 = "SmolLM2-1.7B-Instruct-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def gguf_bytes() -> bytes:
    # A real GGUF (the embedded SmolLM2-135M) stands in for the 360M file, so what lands in the
    # cache can be read by the budget and loaded; it is also larger than huggingface_hub's
    # 10 MiB download chunk, which a resumed download needs to have written something.
    return embedded_model_path().read_bytes()


@pytest.fixture
def hub(gguf_bytes: bytes) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        fake.add_file(REPO_360, FILE_Q8, gguf_bytes)
        fake.add_file(REPO_360, FILE_Q4, b"not this one" * 1000)
        fake.add_file(REPO_360, "README.md", b"# card\n")
        fake.add_file(REPO_17, FILE_17, b"GGUF" + bytes(range(256)) * 64)
        yield fake


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HUB_CACHE=str(tmp_path / "hf-cache"),
        HF_HOME=str(tmp_path / "hf-home"),  # no token, no stray config from the machine
        HF_HUB_DISABLE_TELEMETRY="1",
        LOCALINFER_CACHE_DIR=str(tmp_path / "li-cache"),
        LOCALINFER_DATA_DIR=str(tmp_path / "li-data"),
    )
    env.update(extra)
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localinfer", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,  # only stops a hung test; the behaviour checks are below
    )


@pytest.fixture
def in_process(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> Callable[..., tuple[int, str, str]]:
    """`localinfer ARGS` in this process, in the environment ``cli`` gives its child: the error
    paths start no interpreter of their own (the tests above and below keep the real child)."""
    from test_budget_remote import point_at

    from localinfer.cli import main

    for name in os.environ:
        if name.startswith(("HF_", "HUGGINGFACE_")):
            monkeypatch.delenv(name)
    env = hub_env(tmp_path, hub.url)
    for name in ("HF_HUB_CACHE", "HF_HOME", "LOCALINFER_CACHE_DIR", "LOCALINFER_DATA_DIR"):
        monkeypatch.setenv(name, env[name])
    point_at(monkeypatch, hub.url)  # huggingface_hub read HF_ENDPOINT at its import

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))  # an exception escaping main would fail the test: a traceback
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_pull_resumes_a_dropped_download_and_rm_frees_it(
    hub: FakeHub,
    tmp_path: Path,
    gguf_bytes: bytes,
    in_process: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = hub_env(tmp_path, hub.url)
    drop_at = 25_000_000  # > two 10 MiB chunks, so the retry starts from what was written
    hub.drop_once(REPO_360, FILE_Q8, after=drop_at)

    # The dropped download and its resume in a real `localinfer pull` process. --device: the
    # budget plans for a named machine, so the test does not depend on this one.
    done = cli(env, "pull", "smollm2-360m", "--quant", "Q8_0", "--device", "64GiB")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.name == FILE_Q8 and str(path).startswith(env["HF_HUB_CACHE"])
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()
    assert "fits" in done.stderr and "Trying to resume" in done.stderr

    first, second = hub.file_gets(FILE_Q8)
    assert first.range is None
    resumed_from = int(second.range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= drop_at  # only the missing tail was fetched again
    assert not hub.file_gets(FILE_Q4) and not hub.file_gets("README.md")  # only what Q8_0 needs

    # What follows reads and removes what that process left, in this process (the `in_process`
    # fixture: the same environment as the child's, without an interpreter each).
    from test_budget_remote import point_at

    # The cache is huggingface_hub's: resolve finds the file without any network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    point_at(monkeypatch, hub.url, offline=True)
    asked = len(hub.requests)
    code, out, err = in_process("budget", "smollm2-360m", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model_path"] == str(path) and "GGUF header" in report["weights_source"]
    assert len(hub.requests) == asked  # nothing asked of the Hub
    monkeypatch.delenv("HF_HUB_OFFLINE")
    point_at(monkeypatch, hub.url)

    # A second pull finds everything cached and downloads nothing.
    gets = len(hub.file_gets(FILE_Q8))
    code, _, err = in_process("pull", "smollm2-360m", "--quant", "Q8_0", "--device", "64GiB")
    assert code == 0 and "already in the cache" in err
    assert len(hub.file_gets(FILE_Q8)) == gets

    code, out, _ = in_process("rm", "smollm2-360m", "--dry-run")
    assert code == 0 and "would free" in out and path.is_file()
    code, out, err = in_process("rm", "smollm2-360m")
    assert code == 0, err
    assert f"({len(gguf_bytes)} bytes)" in out and "freed" in out
    assert not path.exists()
    assert not (
        Path(env["HF_HUB_CACHE"]) / "models--bartowski--SmolLM2-360M-Instruct-GGUF"
    ).exists()
    code, _, err = in_process("rm", "smollm2-360m")
    assert code == 1 and "not in the Hugging Face cache" in err


def test_pull_refuses_a_model_that_does_not_fit(hub: FakeHub, in_process: Callable) -> None:
    code, _, err = in_process("pull", "smollm2-1.7b", "--device", "1GiB")
    assert code == 3
    assert "does not fit" in err and "--force" in err
    assert hub.requests == []  # the budget ran before any request to the Hub

    code, out, err = in_process("pull", "smollm2-1.7b", "--device", "1GiB", "--force", "--quiet")
    assert code == 0, err
    assert "downloading anyway" in err
    assert Path(out.strip()).name == FILE_17


def test_pull_errors_are_one_line(in_process: Callable) -> None:
    code, _, err = in_process("pull", "nobody/missing-model", "--quant", "Q4_0")
    assert code == 1
    assert "nobody/missing-model is not on the Hub" in err
    assert "Traceback" not in err

    code, _, err = in_process("pull", "smollm2-360m", "--quant", "Q2_K")
    assert code == 1 and "there is no Q2_K" in err

    code, _, err = in_process("pull", "smollm2-135m")
    assert code == 0 and "nothing to download" in err
    assert in_process("rm", "smollm2-135m")[0] == 1


def test_pull_by_repo_id(hub: FakeHub, in_process: Callable) -> None:
    # A catalog repo id is that catalog model; a lower-case quant still finds the file.
    args = ("--quant", "q4_k_m", "--quiet", "--device", "64GiB")
    code, out, err = in_process("pull", REPO_360, *args)
    assert code == 0, err
    assert Path(out.strip()).name == FILE_Q4
    assert not hub.file_gets(FILE_Q8)

    # A repo outside the catalog is budgeted from its GGUF header before download; one whose
    # header is not a GGUF's still comes, with a warning. The quant picks the file.
    hub.add_file("someone/tiny-GGUF", "tiny-Q4_0.gguf", b"q4" * 100)
    hub.add_file("someone/tiny-GGUF", "tiny-Q8_0.gguf", b"q8" * 100)
    code, out, err = in_process("pull", "someone/tiny-GGUF", "--quant", "Q8_0", "--quiet")
    assert code == 0, err
    assert "warning: no memory budget for someone/tiny-GGUF" in err
    assert "not a GGUF file" in err
    assert Path(out.strip()).read_bytes() == b"q8" * 100
    assert not hub.file_gets("tiny-Q4_0.gguf")
    code, out, _ = in_process("rm", "someone/tiny-GGUF")
    assert code == 0 and "(200 bytes)" in out


def test_plans_name_only_the_files_a_quantization_needs() -> None:
    from localinfer.errors import InvalidParameterError, UnknownModelError
    from localinfer.hub import SAFETENSORS_PATTERNS, plan_download

    gguf = plan_download("smollm2-360m", "q8_0")
    assert (gguf.repo_id, gguf.quant, gguf.patterns) == (REPO_360, "Q8_0", (FILE_Q8,))
    assert gguf.wants(FILE_Q8) and not gguf.wants(FILE_Q4)
    default = plan_download("smollm2-1.7b")  # the catalog's default quantization
    assert default.patterns == (FILE_17,)
    original = plan_download("smollm2-360m", "none")
    assert original.repo_id == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert original.patterns == SAFETENSORS_PATTERNS and original.wants("model.safetensors")
    assert plan_download("HuggingFaceTB/SmolLM2-360M-Instruct") == original  # that repo's files
    assert plan_download(f"{REPO_360}:Q8_0").patterns == (FILE_Q8,)
    assert not original.wants("onnx/model.onnx") and not original.wants("pytorch_model.bin")
    outside = plan_download("someone/x-GGUF", "q4_k_m")
    assert (
        outside.entry is None and outside.wants("x-Q4_K_M.gguf") and outside.wants("x-q4_k_m.gguf")
    )
    with pytest.raises(InvalidParameterError, match="ships inside the pip package"):
        plan_download("default")
    with pytest.raises(UnknownModelError):
        plan_download("not-a-model")


@pytest.mark.parametrize("spec", ["../x", "a/b c", "org/..", "org/x--y"])
def test_pull_refuses_a_malformed_repo_id_in_one_line(
    hub: FakeHub, in_process: Callable, spec: str
) -> None:
    code, _, err = in_process("pull", spec)
    assert code == 1
    assert err.startswith("localinfer: error: ") and "not a Hugging Face repo id" in err
    assert len(err.strip().splitlines()) == 1  # no HFValidationError traceback
    assert hub.requests == []


def start_cli(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "localinfer", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_partial(blobs: Path, ignore: set[str], proc: subprocess.Popen) -> Path:
    """The new `.incomplete` file a running pull writes, once it holds a 10 MiB chunk."""
    while True:
        for path in blobs.glob("*.incomplete") if blobs.is_dir() else []:
            if path.name not in ignore and path.stat().st_size >= 10 * 2**20:
                return path
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def test_a_killed_pulls_partial_file_goes_and_a_running_ones_stays(
    hub: FakeHub, tmp_path: Path, gguf_bytes: bytes, in_process: Callable[..., tuple[int, str, str]]
) -> None:
    repo = "someone/big-GGUF"
    # Two blobs (etags), each over a 10 MiB chunk and the 12 MB a stalled download sends: the
    # GGUF's first 16 MiB (its header, so the budget reads it as before; not all 94 MB, which
    # three pulls would copy for nothing).
    q8 = gguf_bytes[: 16 * 2**20]
    q4 = q8 + b"\0"
    hub.add_file(repo, "big-Q8_0.gguf", q8)
    hub.add_file(repo, "big-Q4_0.gguf", q4)
    # A stalled download must not time out and resume: it stays in progress until released.
    env = hub_env(tmp_path, hub.url, HF_HUB_DOWNLOAD_TIMEOUT="300")
    blobs = Path(env["HF_HUB_CACHE"]) / "models--someone--big-GGUF" / "blobs"

    # 1. A pull killed mid-download leaves its partial file behind.
    release = hub.stall_once(repo, "big-Q8_0.gguf", after=12_000_000)
    killed = start_cli(env, "pull", repo, "--quant", "Q8_0", "--quiet")
    left = wait_for_partial(blobs, set(), killed)
    killed.kill()
    killed.wait()
    release.set()
    assert left.is_file()

    # 2. The next pull of the repo removes it, and is itself stalled mid-download.
    release = hub.stall_once(repo, "big-Q4_0.gguf", after=12_000_000)
    running = start_cli(env, "pull", repo, "--quant", "Q4_0", "--quiet")
    try:
        partial = wait_for_partial(blobs, {left.name}, running)
        assert not left.exists()

        # 3. A third pull meanwhile (in this process, beside the running one's) leaves the
        # running pull's partial file alone.
        code, out, err = in_process("pull", repo, "--quant", "Q8_0", "--quiet")
        assert code == 0, err
        assert Path(out.strip()).read_bytes() == q8
        assert "partial download" not in err
        assert partial.is_file()
    finally:
        release.set()
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    assert "removed 1 partial download(s), 10" in err  # MiB, the chunk it held
    assert Path(out.strip()).read_bytes() == q4
    assert list(blobs.glob("*.incomplete")) == []
