"""The native kernels as other machines build them compute what this machine's build computes.

On aarch64 Linux (a Raspberry Pi, Graviton, Ampere) native_build compiles cpu_kernels.c with
``-mcpu=native``; on macOS with Apple's clang, ``-mcpu=apple-m1`` and no OpenMP. Either way the
16-lane vector code becomes NEON (or SVE) through the compiler's generic vectors: none of the
hand-written x86 paths. Here cross compilers build ``tests/fixtures/kernel_check.c`` (the kernels
compiled in, deterministic inputs) with the flag sets native_build gives those machines (``BUILDS``:
gcc for aarch64 with and without OpenMP, clang with Apple Silicon's set, and clang for this
machine), QEMU's user mode runs the ARM programs, and each result is compared with the program
built for this machine:
- every matrix product (float32 rows and each GGUF block type, 1-9 tokens) and every decoded block
  row is bit for bit this machine's (every build uses FMA and one summation order);
- a two-layer forward (float32 and block layers, biases, q/k norms, a sliding window) agrees to
  float32 rounding (SiLU's exp is libm's on ARM, a polynomial in the x86 hand-written paths), and
  within each build batched = one token at a time, exactly.

Each build needs its compiler (``aarch64-linux-gnu-gcc``, ``clang``) and ``qemu-aarch64`` for the
ARM ones; ``scripts/test-cross-arch`` installs them with apt-get and runs this file. Without them
those cases skip. Marked slow (each compile takes ~10 s): ``scripts/test --all`` runs them too.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.torch import native_build

QEMU = ["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]
DRIVER = Path(__file__).parent / "fixtures" / "kernel_check.c"


@dataclass(frozen=True)
class Build:
    """One way a user's machine builds the kernels: native_build's flags for ``where`` (the
    OpenMP set or the retry without it), compiled by ``cc``. A cross compiler cannot resolve
    ``-mcpu=native``: ``cpu`` names the ARM CPU that stands in for the user's."""

    cc: tuple[str, ...]
    where: native_build.Platform
    openmp: bool
    cpu: str | None = None
    emulated: bool = True

    def flags(self) -> list[str]:
        chosen = next(
            s for s in native_build.build_flags(self.where) if ("-fopenmp" in s) == self.openmp
        )
        flags = [f for f in chosen if f not in ("-shared", "-fPIC")]  # a program, not a library
        if self.cpu:
            assert "-mcpu=native" in flags
            flags = [f"-mcpu={self.cpu}" if f == "-mcpu=native" else f for f in flags]
        return flags

    def missing_tools(self) -> list[str]:
        tools = [self.cc[0], *(QEMU[:1] if self.emulated else [])]
        return [t for t in tools if not shutil.which(t)]


LINUX_ARM = native_build.Platform("Linux", "aarch64")
BUILDS = {
    # Raspberry Pi 4 (NEON), OpenMP as on any aarch64 Linux with gcc
    "gcc-cortex-a72": Build(("aarch64-linux-gnu-gcc",), LINUX_ARM, True, "cortex-a72"),
    # Graviton3 (SVE), the single-threaded retry a compiler without OpenMP gets
    "gcc-neoverse-v1-no-openmp": Build(("aarch64-linux-gnu-gcc",), LINUX_ARM, False, "neoverse-v1"),
    # macOS on Apple Silicon: its exact flag set (-mcpu=apple-m1, no OpenMP) through clang, as
    # Apple's clang compiles it (for Linux on ARM here: QEMU runs Linux programs)
    "clang-apple-m1": Build(
        ("clang", "--target=aarch64-linux-gnu"), native_build.Platform("Darwin", "arm64"), False
    ),
    # a Linux machine whose only compiler is clang (no libomp: the retry without OpenMP)
    "clang-x86-native": Build(
        ("clang",), native_build.Platform("Linux", "x86_64"), False, emulated=False
    ),
}


def build_and_run(
    cc: tuple[str, ...], flags: list[str], out: Path, runner: list[str]
) -> dict[str, np.ndarray]:
    include = native_build.SOURCE.parent
    compiled = subprocess.run(
        [*cc, *flags, "-Wno-psabi", f"-I{include}", str(DRIVER), "-o", str(out), "-lm"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    ran = subprocess.run([*runner, str(out)], capture_output=True, timeout=600, check=False)
    assert ran.returncode == 0, ran.stderr.decode(errors="replace")[-2000:]
    return parse_records(ran.stdout)


def parse_records(data: bytes) -> dict[str, np.ndarray]:
    """kernel_check.c's output: (32-byte name, int64 count, count float32) records."""
    records, at = {}, 0
    while at < len(data):
        name = data[at : at + 32].rstrip(b"\0").decode()
        count = int(np.frombuffer(data[at + 32 : at + 40], dtype="<i8")[0])
        at += 40
        records[name] = np.frombuffer(data[at : at + 4 * count], dtype="<f4")
        at += 4 * count
        assert records[name].size == count, f"{name}: cut short"
    return records


@pytest.fixture(scope="module")
def here_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The program built for this machine with the flags the runner's library gets (with
    OpenMP, or without where the compiler refuses it, as native_build retries)."""
    out = tmp_path_factory.mktemp("here") / "kernel_check"
    cc, where = native_build.compiler(), native_build.Platform.here()
    openmp = _compiles(cc, Build((cc,), where, True, emulated=False).flags())
    here = Build((cc,), where, openmp, emulated=False)
    return build_and_run(here.cc, here.flags(), out, [])


def _compiles(cc: str, flags: list[str]) -> bool:
    probe = subprocess.run(
        [cc, *flags, "-x", "c", "-", "-o", "/dev/null"],
        input="int main(void) { return 0; }\n", capture_output=True, text=True, check=False,
    )  # fmt: skip
    return probe.returncode == 0


def test_parse_records_rejects_a_cut_stream() -> None:
    whole = b"a".ljust(32, b"\0") + np.int64(2).tobytes() + np.float32([1, 2]).tobytes()
    assert parse_records(whole)["a"].tolist() == [1.0, 2.0]
    with pytest.raises(AssertionError, match="cut short"):
        parse_records(whole[:-4])


@pytest.mark.slow
def test_this_machines_build_is_batch_independent(here_results: dict[str, np.ndarray]) -> None:
    """The reference itself: batched = one token at a time (the runner's parity tests rely on
    it), and products are not all zeros."""
    assert np.array_equal(here_results["forward/batched/x"], here_results["forward/single/x"])
    assert np.abs(here_results["linear/q4_1/t9"]).max() > 1.0


@pytest.mark.slow  # ~10 s a compile (scripts/test-cross-arch, scripts/test --all)
@pytest.mark.parametrize("name", BUILDS)
def test_other_builds_match_this_machine(
    here_results: dict[str, np.ndarray], tmp_path: Path, name: str
) -> None:
    build = BUILDS[name]
    if not build.emulated and build.where.machine != native_build.Platform.here().machine:
        pytest.skip(f"a build for {build.where.machine} runs natively only there")
    if missing := build.missing_tools():
        pytest.skip(f"needs {', '.join(missing)} (scripts/test-cross-arch installs them)")
    other = build_and_run(
        build.cc, build.flags(), tmp_path / "kernel_check", QEMU if build.emulated else []
    )
    if build.emulated:
        assert other["isa"].tolist() == [0.0]  # ARM: the generic vectors, no x86 path
    assert other.keys() == here_results.keys()
    exact = [name for name in other if name.startswith(("linear/", "rows/"))]
    assert len(exact) == 4 * 7 + 3
    for record in exact:
        assert np.array_equal(other[record], here_results[record]), record
    for record in [n for n in other if n.startswith("forward/")]:
        scale = np.abs(here_results[record]).max()
        assert np.abs(other[record] - here_results[record]).max() <= 1e-5 * scale, record
    for what in ("x", "logits"):
        assert np.array_equal(other[f"forward/batched/{what}"], other[f"forward/single/{what}"])
