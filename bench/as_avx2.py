"""The environment that makes a process on this machine run as on a CPU without AVX-512.

Most users' CPUs have AVX2 + FMA and no AVX-512 (Intel Core since 12th gen, AMD Zen 2/3); the
project's machines have AVX-512. Each library that chooses its kernels from the CPU is held back
by its own setting, in a fresh process (they read them once, at load):

- localinfer's native kernels: built without AVX-512 (LOCALINFER_KERNEL_ISA=avx2, its own cache
  key);
- torch: oneDNN, ATen and MKL (F.linear on a CPU is MKL's sgemm) each have a variable;
- numpy: its AVX-512 dispatch targets disabled (NPY_DISABLE_CPU_FEATURES; only those this numpy
  build dispatches, since naming another is an error);
- llama.cpp: compiled for the CPU pip built it on, so a second build without AVX-512 is put first
  on PYTHONPATH (llamacpp_avx2; built once per machine, about a minute).

What no variable reaches: CPUID itself (scripts/test-emulated-cpu runs the ISA tests on an
emulated CPU for that) and /proc/cpuinfo, which scripts/test-as-avx2 replaces where it may.

    eval "$(python -m bench.as_avx2)"     # export lines for a shell
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable

from bench import llamacpp_avx2

MARK = "LOCALINFER_AS_AVX2"  # set in such a process: tests know they run in that pass
LIBRARY_ENV = {
    MARK: "1",
    "LOCALINFER_KERNEL_ISA": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def numpy_avx512_targets() -> list[str]:
    """This numpy's dispatch targets that need AVX-512 (X86_V4, AVX512_*)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__
    except ImportError:  # numpy 1.x kept it elsewhere; without it, leave numpy as it is
        return []
    return [t for t in __cpu_dispatch__ if t == "X86_V4" or t.startswith("AVX512")]


def avx2_env(
    base: dict[str, str], llamacpp: bool = True, log: Callable[[str], None] = print
) -> dict[str, str]:
    """The variables to add to ``base`` (a process's environment) to run it as an AVX2 CPU.

    ``llamacpp``: also the AVX2 build of llama.cpp (built when missing; where it cannot be, a
    line says so and the installed build stays).
    """
    env = dict(LIBRARY_ENV)
    targets = numpy_avx512_targets()
    if targets:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(targets)
    if llamacpp and llamacpp_avx2.installed_version() is not None:
        try:
            site = llamacpp_avx2.ensure_built(log=log)
        except llamacpp_avx2.BuildFailed as exc:
            log(f"llama.cpp: no AVX2 build ({exc}); the one built for this CPU stays")
        else:
            log(f"llama.cpp: the AVX2 build in {site}")
            env["PYTHONPATH"] = llamacpp_avx2.pythonpath_with(site, base.get("PYTHONPATH"))
    return env


def main(argv: list[str]) -> int:
    """Print ``export NAME=value`` lines; ``--no-llamacpp`` leaves llama.cpp out."""
    env = avx2_env(dict(os.environ), llamacpp="--no-llamacpp" not in argv,
                   log=lambda line: print(line, file=sys.stderr))  # fmt: skip
    for name, value in env.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
