"""Run a benchmark once per CPU ISA level on this machine: as built for it, and as an AVX2 laptop.

Most users' CPUs have AVX2 + FMA and no AVX-512; the project's machines have AVX-512. A benchmark
run with ``--isa native,avx2`` measures both in one run: the second pass is a fresh process with
every library held at AVX2 (as_avx2: the native kernels, torch, numpy, and llama.cpp's second
build). Where that llama.cpp build cannot be made, the pass says so and uses the installed one,
compiled for this CPU: its rows then err in llama.cpp's favour.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from bench.as_avx2 import avx2_env
from bench.child import child_env, module_argv
from localinfer.backends.torch.profile import cpu_flags  # torch-free

SHOWN_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
               "amx_tile", "avx_vnni", "neon", "asimd")  # fmt: skip


def cpu_summary() -> str:
    """One line: the CPU's name, core count and the vector features that matter here."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    shown = [f for f in SHOWN_FLAGS if f in flags]
    return f"{name}, {os.cpu_count()} CPUs, flags: {' '.join(shown) or 'unknown'}"


def levels(asked: str) -> list[str]:
    """``auto``: this machine's own build, plus the AVX2 build where the CPU has AVX-512."""
    if asked != "auto":
        return [level.strip() for level in asked.split(",") if level.strip()]
    return ["native", "avx2"] if "avx512f" in cpu_flags() else ["native"]


PASS_ENV = "LOCALINFER_ISA_PASS"  # set in the child: it measures instead of re-running


def in_pass() -> bool:
    return bool(os.environ.get(PASS_ENV))


def run_levels(module: str, argv: list[str], asked: str, llamacpp: bool = True) -> int:
    """The parent's job: print the CPU, run ``python -m module argv`` once per level; the worst
    exit. ``llamacpp``: the run measures llama.cpp (its AVX2 pass then needs the AVX2 build)."""
    print(f"CPU: {cpu_summary()}")
    return max(rerun(module, argv, level, llamacpp) for level in levels(asked))


def rerun(module: str, argv: list[str], level: str, llamacpp: bool = True) -> int:
    """Run ``python -m module argv`` in a fresh Python at ``level`` (native | avx2); its exit
    code."""
    env = child_env()
    env[PASS_ENV] = level
    if level == "avx2":
        env.update(avx2_env(env, llamacpp, log=lambda line: print(line, flush=True)))
    elif level != "native":
        raise ValueError(f"unknown ISA level {level!r}: native or avx2")
    label = "this machine's build" if level == "native" else "AVX-512 hidden (an AVX2 laptop)"
    print(f"\n=== ISA level: {level} — {label}", flush=True)
    return subprocess.run(module_argv(module, *argv), env=env, check=False).returncode
