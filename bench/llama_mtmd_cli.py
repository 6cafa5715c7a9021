"""llama.cpp's own multimodal CLI (``llama-mtmd-cli``), built from the installed
llama-cpp-python's vendored sources into the user's cache, once: the reference the vision tests
hold localinfer's image answers to (tests/test_vision_mtmd_cli.py, a slow test).

Built like bench/llama_server.py builds llama-server (same sdist, static, offline), in a sibling
folder renamed into place when finished, one build at a time (a lock beside it).

    python -m bench.llama_mtmd_cli          # builds it if needed; prints its path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.cached_build import CachedBuild
from bench.llamacpp_source import BuildFailed, cmake_build, fetch_source, installed_version

CMAKE_ARGS = (
    "-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "
    "-DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON"
)
BINARY = "llama-mtmd-cli"
MARKER = "localinfer-llama-mtmd-cli-build.txt"  # written last: without it, an unfinished build
TRIES = 12  # runs of the CLI for one answer (run_greedy: its output may lose its end)


SPEC = CachedBuild("llama-mtmd-cli", CMAKE_ARGS, MARKER, product=BINARY)


def ensure_built(log: Callable[[str], None] = print) -> Path:
    """The llama-mtmd-cli binary, built first when missing; BuildFailed otherwise."""

    def fill(version: str, work: Path, staged: Path) -> None:
        source = fetch_source(version, work) / "vendor" / "llama.cpp"
        cmake_build(source, work / "build", CMAKE_ARGS.split(), BINARY, os.cpu_count() or 2)
        built = work / "build" / "bin" / BINARY
        if not built.is_file():
            raise BuildFailed(f"the build made no {built}")
        staged.mkdir()
        shutil.copy2(built, staged / BINARY)

    return SPEC.ensure(installed_version(), fill, BINARY, log) / BINARY


def run_greedy(
    binary: Path, model: Path, projector: Path, images: Sequence[Path], prompt: str, n: int
) -> bytes:
    """What ``llama-mtmd-cli`` answers ``prompt`` about ``images``, greedy, ``n`` tokens at most,
    on one thread: its stdout's bytes (each token's piece as printed: a NUL byte prints nothing),
    without the newlines it writes around the answer. Its log goes to stderr.

    The CLI prints through llama.cpp's asynchronous log, whose thread it does not wait for at exit
    (common/log.cpp leaks it on purpose), so a run may lose the end of its output, even all of it.
    Every run's output is then a start of the whole (greedy); the whole ends with the blank line
    the CLI writes last. It is run again until two runs agree on such an output and none printed
    more, at most TRIES times."""
    command = [str(binary), "-m", str(model), "--mmproj", str(projector), "-p", prompt,
               "-n", str(n), "--temp", "0", "-t", "1", "-c", "256", "--no-warmup"]  # fmt: skip
    for image in images:
        command += ["--image", str(image)]
    seen: list[bytes] = []
    for _ in range(TRIES):
        done = subprocess.run(command, capture_output=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{BINARY} failed ({done.returncode}): {done.stderr[-2000:]!r}")
        seen.append(done.stdout)
        longest = max(seen, key=len)
        if longest.endswith(b"\n\n") and seen.count(longest) >= 2:
            return longest.strip(b"\n")
    raise RuntimeError(f"{BINARY} printed no whole answer in {TRIES} runs: {seen!r}")


def main() -> int:
    try:
        print(ensure_built(lambda line: print(line, file=sys.stderr)))
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
