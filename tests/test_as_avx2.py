"""Running as on a CPU without AVX-512: the environment (as_avx2) and llama.cpp's AVX2 build.

The build itself takes about a minute; scripts/test makes it before its AVX-512-hidden pass, where
the tests marked llamacpp here check what was built and that the pass imports it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import as_avx2, llamacpp_avx2

ROOT = Path(__file__).resolve().parent.parent


def test_build_dir_is_keyed_by_version_and_flags(monkeypatch):
    monkeypatch.delenv(llamacpp_avx2.BUILD_ENV, raising=False)
    a, b = llamacpp_avx2.build_dir("0.3.36"), llamacpp_avx2.build_dir("0.3.37")
    assert a != b and "0.3.36" in a.name
    monkeypatch.setattr(llamacpp_avx2, "CMAKE_ARGS", llamacpp_avx2.CMAKE_ARGS + " -DGGML_X=ON")
    assert llamacpp_avx2.build_dir("0.3.36") != a  # other flags: another build
    monkeypatch.setenv(llamacpp_avx2.BUILD_ENV, "/some/where")
    assert llamacpp_avx2.build_dir("0.3.36") == Path("/some/where")


def test_an_unfinished_or_older_build_is_not_used(tmp_path, monkeypatch):
    """The marker is written last and names the version and flags: a build interrupted before
    it, or one of another version in an override directory, is built again, not imported."""
    (tmp_path / "llama_cpp").mkdir()
    assert not llamacpp_avx2.is_built(tmp_path, "0.3.36")
    (tmp_path / llamacpp_avx2.MARKER).write_text(llamacpp_avx2.marker_text("0.3.35"))
    assert not llamacpp_avx2.is_built(tmp_path, "0.3.36")
    (tmp_path / llamacpp_avx2.MARKER).write_text(llamacpp_avx2.marker_text("0.3.36"))
    assert llamacpp_avx2.is_built(tmp_path, "0.3.36")
    monkeypatch.setenv(llamacpp_avx2.BUILD_ENV, str(tmp_path))
    monkeypatch.setattr(llamacpp_avx2, "installed_version", lambda: "0.3.36")
    assert llamacpp_avx2.ensure_built(log=pytest.fail) == tmp_path  # found: no build, no line


def test_nothing_to_build_without_llama_cpp_installed(monkeypatch):
    monkeypatch.setattr(llamacpp_avx2, "installed_version", lambda: None)
    with pytest.raises(llamacpp_avx2.BuildFailed, match="not installed"):
        llamacpp_avx2.ensure_built(log=print)
    assert "PYTHONPATH" not in as_avx2.avx2_env({}, log=pytest.fail)


def test_a_failed_build_keeps_the_installed_llama_cpp_and_says_so(monkeypatch):
    def fail(log):
        raise llamacpp_avx2.BuildFailed("pip wheel failed (exit 1)")

    monkeypatch.setattr(llamacpp_avx2, "installed_version", lambda: "0.3.36")
    monkeypatch.setattr(llamacpp_avx2, "ensure_built", fail)
    lines: list[str] = []
    env = as_avx2.avx2_env({"PYTHONPATH": "/x"}, log=lines.append)
    assert "PYTHONPATH" not in env and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert lines == ["llama.cpp: no AVX2 build (pip wheel failed (exit 1)); the one built for "
                     "this CPU stays"]  # fmt: skip


def test_pythonpath_puts_the_build_first():
    assert llamacpp_avx2.pythonpath_with(Path("/b"), None) == "/b"
    assert llamacpp_avx2.pythonpath_with(Path("/b"), "/x:/y") == os.pathsep.join(["/b", "/x:/y"])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 dispatch targets")
def test_numpy_runs_without_its_avx512_kernels_under_the_environment():
    """The shell lines evaluate; numpy in that process reports its AVX-512 targets off."""
    targets = as_avx2.numpy_avx512_targets()
    if not targets:
        pytest.skip("this numpy build dispatches no AVX-512 kernels")
    probe = ("from numpy._core._multiarray_umath import __cpu_features__ as f; "
             f"print(' '.join(t for t in {targets!r} if f.get(t)))")  # fmt: skip
    py = sys.executable
    script = (f'eval "$({py} -m bench.as_avx2 --no-llamacpp)" && '
              f'echo "$ONEDNN_MAX_CPU_ISA $LOCALINFER_KERNEL_ISA"; {py} -c "{probe}"')  # fmt: skip
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT,
                          check=True, timeout=120)  # fmt: skip
    first, enabled = (done.stdout.splitlines() + [""])[:2]
    assert first == "AVX2 avx2"
    assert enabled == "", f"numpy still dispatches {enabled} (stderr: {done.stderr})"
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": ""}
    plain = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True,
                           timeout=60, env=env)  # fmt: skip
    if "avx512f" in Path("/proc/cpuinfo").read_text():
        assert plain.stdout.strip(), "on an AVX-512 CPU numpy uses them when not told otherwise"


def _avx2_build() -> Path:
    version = llamacpp_avx2.installed_version()
    site = llamacpp_avx2.build_dir(version) if version else None
    if site is None or not llamacpp_avx2.is_built(site, version):
        pytest.skip("no AVX2 build of llama.cpp here yet (scripts/test makes one)")
    return site


@pytest.mark.llamacpp
def test_the_avx2_build_has_no_avx512_instruction():
    """No instruction of the built libraries names a zmm (512-bit) register; the CPU backend
    does use ymm (256-bit) ones."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 registers")
    site = _avx2_build()
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    libs = sorted((site / "llama_cpp" / "lib").glob("*.so"))
    assert any("ggml-cpu" in lib.name for lib in libs), f"no CPU backend library under {site}"
    for lib in libs:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "%zmm" not in text, lib.name
        assert "ggml-cpu" not in lib.name or "%ymm" in text


@pytest.mark.llamacpp
def test_the_avx512_hidden_pass_imports_the_avx2_build():
    """In scripts/test's second pass (as_avx2's environment) llama.cpp is the AVX2 build."""
    if os.environ.get(as_avx2.MARK) != "1":
        pytest.skip("only in the AVX-512-hidden pass")
    _avx2_build()
    pytest.importorskip("llama_cpp")
    assert llamacpp_avx2.loaded_build() == "AVX2 build, no AVX-512"
