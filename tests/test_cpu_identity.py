"""The CPU identity that keys caches of things built or measured for a CPU (the native kernels'
library and calibration, llama.cpp's attention choice): it tells CPUs apart on x86 and on ARM,
whose /proc/cpuinfo has no model name."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.cpu_identity import cpu_identity, identity_lines

CORE = """processor\t: {n}
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

"""
PI4 = CORE.format(n=0) + CORE.format(n=1)  # every core repeats its lines
PI5 = PI4.replace("0xd08", "0xd0b").replace("crc32 cpuid", "crc32 atomics fphp asimdhp cpuid")
X86 = """processor\t: 0
model name\t: Intel(R) Core(TM) i7-1265U
flags\t\t: fpu sse sse2 avx avx2 fma
cpu MHz\t\t: 2688.000
"""


def test_arm_cpus_are_told_apart_without_a_model_name() -> None:
    pi4 = identity_lines(PI4)
    assert pi4 == [
        "CPU implementer\t: 0x41",
        "CPU part\t: 0xd08",
        "CPU variant\t: 0x0",
        "Features\t: fp asimd evtstrm crc32 cpuid",
    ]  # each line once, though every core repeats it; revision and BogoMIPS left out
    assert identity_lines(PI5) != pi4


def test_x86_identity_is_the_model_name_and_flags() -> None:
    assert identity_lines(X86) == [
        "flags\t\t: fpu sse sse2 avx avx2 fma",
        "model name\t: Intel(R) Core(TM) i7-1265U",
    ]  # not the clock, which moves


def test_this_machine_reads_its_own_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo: platform's description stands in")
    lines = identity_lines(cpuinfo.read_text(errors="replace"))
    assert lines and cpu_identity() == "\n".join(lines)
