"""scripts/_llamacpp_gpu.sh: on a machine whose NVIDIA driver answers, llama-cpp-python is rebuilt
with CUDA when a toolkit is found, kept apart by version and flags, and said once (with the
command that fixes it) when it cannot be. Run with a fake driver, python and nvcc: nothing here
builds or installs anything."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "_llamacpp_gpu.sh"

# A python that has llama_cpp without GPU offload, logs its arguments, and "builds" a wheel.
FAKE_PYTHON = """#!/bin/sh
echo "$@" >> "$LOG"
case "$*" in
  *llama_supports_gpu_offload*) exit 1 ;;
  *"print(version"*) echo 0.3.99 ;;
  *"pip wheel"*) for a in "$@"; do
      [ "$prev" = "-w" ] && touch "$a/llama_cpp_python-0.3.99-cp311-linux_x86_64.whl"; prev="$a"
    done ;;
esac
exit 0
"""


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run(tmp: Path, nvcc: bool, gpu: bool = True) -> tuple[subprocess.CompletedProcess, str]:
    work, bin_dir, log = tmp / "work", tmp / "bin", tmp / "log"
    executable(work / ".venv" / "bin" / "python", FAKE_PYTHON)
    if gpu:
        executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: fake'\n")
    if nvcc:
        executable(bin_dir / "nvcc", "#!/bin/sh\nexit 0\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "LOG": str(log),
        "CUDA_HOME": str(tmp / "no-cuda"),  # not this machine's /usr/local/cuda
    }
    out = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {SCRIPT}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    return out, log.read_text() if log.exists() else ""


def test_no_driver_no_build(tmp_path: Path) -> None:
    out, log = run(tmp_path, nvcc=True, gpu=False)
    assert out.returncode == 0 and log == "" and out.stderr == ""


def test_with_a_toolkit_the_cuda_wheel_is_built_once_and_installed(tmp_path: Path) -> None:
    out, log = run(tmp_path, nvcc=True)
    assert out.returncode == 0, out.stderr
    assert "pip wheel" in log and "llama-cpp-python==0.3.99" in log
    assert "install -q --force-reinstall --no-deps" in log
    wheels = list((tmp_path / "cache" / "localinfer-dev").glob("llamacpp-cuda-0.3.99-*/*.whl"))
    assert len(wheels) == 1
    out, log = run(tmp_path, nvcc=True)  # again: the kept wheel, no second build
    assert log.count("pip wheel") == 1 and log.count("--force-reinstall") == 2


def test_without_a_toolkit_it_says_so_once_with_the_fix(tmp_path: Path) -> None:
    out, log = run(tmp_path, nvcc=False)
    assert out.returncode == 0
    assert "no CUDA toolkit (nvcc)" in out.stderr
    assert 'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON' in out.stderr  # the RPC backend kept
    assert "pip wheel" not in log
    again, _ = run(tmp_path, nvcc=False)
    assert again.stderr == ""  # said once
