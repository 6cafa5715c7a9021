"""Whether this machine's native kernels are the faster CPU path: the calibration's answer,
readable without importing torch (the budget and backend choice ask before any framework loads).

calibrate.py measures the kernels against torch ops once per kernel build and stores the result
beside the library as JSON. ``native_plan()`` reads it; when there is none yet it measures in a
subprocess, which costs a torch import once per kernel build. The decisions:

- ``native_f32_max_tokens``: forwards of up to this many tokens run natively on float32 rows (the
  largest measured size at which the kernels beat torch ops, counting up from one token; 0 when
  torch ops win a decode step).
- ``blocks_faster``: GGUF Q8_0/Q4_0/Q4_1 matrices are kept as stored blocks when a one-token
  product on them beats the faster float32 path.
- With blocks kept, forwards up to DEFAULT_MAX_TOKENS run natively and longer ones (prefill
  chunks) run torch ops on each block matrix dequantized as it is used (``native_block_tokens``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from localinfer.backends.child_json import run_json_child
from localinfer.backends.torch.native_build import (
    BuildError,
    Platform,
    build_flags,
    compiler,
    cpu_flags,
    kernel_isa,
    library_path,
    native_kernels_expected,
)
from localinfer.errors import BackendUnavailableError

log = logging.getLogger(__name__)

# Above about this many tokens in one forward the torch GEMMs catch up (on the AVX-512 machine,
# scripts/bench-native-kernels part 2): the most a calibrated machine sends to the kernels.
DEFAULT_MAX_TOKENS = 32
TOKEN_COUNTS = (1, 8, DEFAULT_MAX_TOKENS)  # decode, batched decode / verification, prefill chunk
CALIBRATION_VERSION = 2
SUBPROCESS_TIMEOUT_S = 300  # a first build (~1 s) + torch import + ~0.1 s of timing
# A given answer instead of this machine's measurement: "native" (the kernels win every measured
# size and keep blocks, so a CPU picks them over llama.cpp wherever their build's SIMD would) or
# "torch" (torch ops win). Tests set it, so that which path a test runs
# never hangs on how fast this machine happens to be; also a user's way to pin the path.
PLAN_ENV = "LOCALINFER_NATIVE_PLAN"


@dataclass(frozen=True, slots=True)
class ProductTimes:
    """Seconds for one product over the calibration matrix, at ``tokens`` tokens."""

    tokens: int
    native_f32: float
    native_q4_1: float
    torch_f32: float


@dataclass(frozen=True, slots=True)
class Calibration:
    isa: int  # the kernels' vector ISA: 512, 256 (AVX2) or 0 (generic vectors)
    threads: int
    # Seconds of the small torch ops that surround each product in a torch-ops forward (the
    # kernels do that work inside their one call): added to every torch product compared.
    torch_overhead: float
    products: tuple[ProductTimes, ...]

    def torch_seconds(self, row: ProductTimes) -> float:
        return row.torch_f32 + self.torch_overhead

    def native_f32_max_tokens(self) -> int:
        best = 0
        for row in sorted(self.products, key=lambda r: r.tokens):
            if row.native_f32 >= self.torch_seconds(row):
                break
            best = row.tokens
        return best

    def blocks_faster(self) -> bool:
        """Whether blocks are kept: unless a one-token product on them measured more than
        BLOCKS_MARGIN slower than the faster float32 path."""
        one = min(self.products, key=lambda r: r.tokens)
        return one.native_q4_1 < BLOCKS_MARGIN * min(one.native_f32, self.torch_seconds(one))

    @classmethod
    def given(cls, winner: str, isa: int) -> Calibration:
        """A calibration in which ``winner`` ("native" or "torch") is faster at every size, of
        kernels built for ``isa``. Only the timings are given: the ISA is the build's, as a
        measured calibration records it, since the backend choice reads it (the kernels beat
        llama.cpp only where their SIMD was measured against it: torch/profile.py)."""
        fast, slow = 1e-4, 1e-3
        # native f32, native on Q4_1 blocks, torch ops
        times = (fast, fast / 2, slow) if winner == "native" else (slow, slow, fast)
        rows = tuple(ProductTimes(tokens, *times) for tokens in TOKEN_COUNTS)
        return cls(isa=isa, threads=CALIBRATION_THREADS, torch_overhead=0.0, products=rows)

    @classmethod
    def crashed(cls) -> Calibration:
        """The kernels died on this CPU (illegal instruction: built for features it lacks):
        every product of theirs counts as infinitely slow, so every decision is torch ops."""
        never = float("inf")
        rows = tuple(ProductTimes(tokens, never, never, 0.0) for tokens in TOKEN_COUNTS)
        return cls(isa=0, threads=CALIBRATION_THREADS, torch_overhead=0.0, products=rows)

    def to_json(self) -> dict:
        return {"version": CALIBRATION_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        if data.get("version") != CALIBRATION_VERSION:
            raise ValueError("calibration of another version")
        rows = tuple(ProductTimes(**row) for row in data["products"])
        return cls(
            isa=int(data["isa"]),
            threads=int(data["threads"]),
            torch_overhead=float(data["torch_overhead"]),
            products=rows,
        )


# How much slower than float32 a product on Q4_1 blocks may measure and blocks still be kept. The
# calibration's 12 MB matrix stays in cache between its timed calls, where reading blocks saves
# nothing; a whole model is read from memory at every token, where blocks read about 5x fewer
# bytes. So a near tie on the matrix is a clear win on a model: on the project's AVX-512 machine
# blocks measured 1.01x slower than float32 rows on the matrix and decode the embedded model at
# about 3.5x the float32 rate. Without a margin that tie picked the backend by noise, run to run.
BLOCKS_MARGIN = 1.15

# One thread: with two threads on a 2-core machine, one busy neighbour (the chat UI, a test run)
# stalls every parallel region at its barrier for a whole time slice, and the fastest of several
# calls is still a stall (measured: 5 ms instead of 0.25 ms). One thread's calls each get a core
# or not, so the fastest is clean, and which path wins a product does not hinge on the count.
CALIBRATION_THREADS = 1


def calibration_path(library: Path) -> Path:
    return library.with_suffix(".calibration.json")


def store_calibration(library: Path, result: Calibration) -> None:
    path = calibration_path(library)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result.to_json()))
    os.replace(tmp, path)  # a concurrent reader sees the old file or the new one, never half


def _stored(library: Path) -> Calibration | None:
    try:
        return Calibration.from_json(json.loads(calibration_path(library).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _library() -> Path | None:
    """The library this machine's build would use, if already built."""
    try:
        cc = compiler()
        for flags in build_flags(Platform.here()):
            path = library_path(flags, cc)
            if path.exists():
                return path
    except (BuildError, OSError, subprocess.SubprocessError):
        return None
    return None


def native_plan() -> Calibration | None:
    """The calibration for this machine's kernel build (measured now if never measured); None
    when the kernels are off, cannot be built, or could not be measured (logged)."""
    if not native_kernels_expected():
        return None
    given = given_plan()
    if given is not None:
        return given
    library = _library()
    stored = _stored(library) if library is not None else None
    if stored is not None:
        return stored
    return _measure_once()


def given_plan() -> Calibration | None:
    """The calibration PLAN_ENV names, or None when it is unset."""
    asked = os.environ.get(PLAN_ENV, "").strip().lower()
    if not asked:
        return None
    if asked not in ("native", "torch"):
        raise BackendUnavailableError(f"{PLAN_ENV}={asked!r}: expected 'native' or 'torch'")
    try:
        isa = kernel_isa(Platform.here(), cpu_flags())
    except BuildError:  # an unknown LOCALINFER_KERNEL_ISA: no build, so no SIMD of its own
        isa = 0
    return Calibration.given(asked, isa)


@cache
def _measure_once() -> Calibration | None:
    # Always in a child process, even where torch is loaded: the measurement then runs on a
    # quiet process, and this module (which the torch-free profile imports) never imports the
    # torch code that imports it back.
    log.info("measuring the native CPU kernels against torch ops (once per machine)")
    module = "localinfer.backends.torch.calibrate"
    child = run_json_child(module, [str(CALIBRATION_THREADS)], SUBPROCESS_TIMEOUT_S)
    if child.illegal_instruction:
        return _crashed_here()
    if child.data is None:
        log.warning("native kernel calibration failed: %s", child.problem)
        return None
    try:
        return Calibration.from_json(child.data)
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("native kernel calibration failed: unreadable result (%s)", exc)
        return None


def _crashed_here() -> Calibration:
    """The calibration child died of SIGILL: this process must never call the kernels (it would
    die the same way). Stored beside the library, so later processes do not try again."""
    library = _library()
    log.warning(
        "the native CPU kernels crash on this CPU (illegal instruction: %s uses instructions it "
        "does not run): torch ops run instead; delete the library and its .calibration.json "
        "to try again",
        library,
    )
    result = Calibration.crashed()
    if library is not None:
        with contextlib.suppress(OSError):  # unstored, the next process asks its child again
            store_calibration(library, result)
    return result


def native_f32_tokens() -> int:
    """Forwards up to this many tokens run the kernels on float32 rows (0: torch ops only).
    What the runner does by default and the budget assumes."""
    if not native_kernels_expected():
        return 0
    plan = native_plan()
    return DEFAULT_MAX_TOKENS if plan is None else plan.native_f32_max_tokens()


def native_block_tokens() -> int:
    """With a GGUF's blocks kept: forwards up to this many tokens run the kernels, longer ones
    torch ops on the matrices dequantized as they are used. Not from the product calibration,
    which misjudges it: dequantizing every matrix for one forward is a fixed cost a whole
    forward pays once. scripts/bench-native-kernels part 3 shows both sides: a 17-token
    verification forward costs less on the kernels than through dequantized torch ops (about
    half on AVX-512), while a 512-token prefill runs about twice as fast or more through torch
    ops. A long chunk on kept blocks is the same GEMM as torch ops on float32 weights plus one
    dequantization pass (about 3.5%, bound by memory bandwidth), so about 1.00x torch ops at best
    (docs/measurements.md, "Kept blocks: long chunks", with the alternatives tried)."""
    return DEFAULT_MAX_TOKENS


def keeps_blocks() -> bool:
    """Whether a CPU float32 torch runner keeps a GGUF's Q8_0/Q4_0/Q4_1 matrices as stored
    blocks here. What the runner does by default and the budget assumes."""
    if not native_kernels_expected():
        return False
    plan = native_plan()
    return plan is None or plan.blocks_faster()
