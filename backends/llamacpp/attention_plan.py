"""Flash attention on or off for llama.cpp on the CPU: measured once per machine and head shape,
never assumed.

llama.cpp's ``flash_attn = auto`` turns its fused attention kernel on for the CPU. On the
project's machine that kernel is the slow one wherever a forward carries few tokens per sequence
(1.4-3x slower at 1,024 cached tokens, more at 2,048; docs/measurements.md, "llama.cpp flash
attention on the CPU"). Decode steps, batched decode (one token per slot), speculative
verification and the short prefills that prefix reuse leaves are all such forwards; only long
prefill chunks gain from it, and not by much. Which side wins depends on the
CPU, the llama.cpp build and the model's attention heads (many narrow heads favour the plain
kernel, few wide ones the fused: attention_probe.py), so attention_calibrate.py times both at
each of DEPTHS cached tokens on a probe model with the real model's heads and little else (one to
a few seconds, once), and the result is stored per machine, llama.cpp build, thread count and
head shape.

The decision weighs a one-token decode step, a step of BATCHED sequences decoding together (per
token: what a server runs) and a CHUNK-token forward (per token) equally, summed over a short and a
long context (the winner can change with depth: on an AVX2 build the fused kernel is faster at 256
cached tokens and slower at 1,024), and keeps llama.cpp's own default (on) unless off is
``MARGIN`` faster. Without flash attention a
prefill chunk materializes its scores against the whole context (chunk x heads x context
floats); past ``SCORES_CAP`` bytes of them, memory wins and flash attention stays on. The budget
asks :func:`flash_attention` with the same arguments as the runner, so both agree.

Numerics: without flash attention llama.cpp multiplies V by an f16 copy of the probabilities.
Against the float32 torch reference (`localinfer quality`) the quality is the same either way
(docs/measurements.md, "llama.cpp flash attention on the CPU"). Greedy speculation is
token-identical to plain decoding only with it (a verification batch's products round
differently from a one-token step's); without it, equal up to a near-tie
(tests/test_speculative_runners.py).

Nothing here imports llama_cpp: the measurement runs in a child process (``python -m
localinfer.backends.llamacpp.attention_calibrate THREADS``) before the runner loads the library,
so a llama-cpp-python built for another CPU (a wheel made on a machine with AVX-512, a copied
environment) dies there with an illegal instruction, and the caller gets an error that says so
instead of crashing the same way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no lock between processes
    fcntl = None  # type: ignore[assignment]

from localinfer.backend_profile import measuring_allowed
from localinfer.backends.child_json import ChildResult, run_json_child
from localinfer.backends.llamacpp.attention_probe import AttentionShape
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.cpu_identity import cpu_identity
from localinfer.errors import BackendUnavailableError
from localinfer.facts.arch import AttentionHeads
from localinfer.paths import cache_dir

log = logging.getLogger(__name__)

ENV = "LOCALINFER_FLASH_ATTN"  # on | off: skip the measurement (benchmarks, tests)
CALIBRATION_VERSION = 5  # 2: per head shape; 3: a batched step; 4: two depths; 5: rounds
DEPTHS = (256, 1024)  # cached tokens the timed steps attend over: a short chat and a long one
CHUNK = 16  # tokens of the timed short forward (verification, a short prefill)
BATCHED = 4  # sequences of the timed batched decode step
# Off must save this share of the probe's chat turn, in every round of the measurement, to replace
# llama.cpp's default. The probe overstates what off saves: its forward is nearly all attention,
# with a working set that stays in cache, where a real model's steps carry the rest of the model
# and stream its KV from memory. Against the real model (docs/measurements.md, "llama.cpp flash
# attention on the CPU"): a probe saving of 70% was off 1.4-3x faster; savings of 16% (Qwen3-1.7B's
# heads) and 27-36% (SmolLM2's heads, an AVX2 build) were ties or on faster in the shapes a server
# runs, with off saving 6-8% of the real model's turn at most.
MARGIN = 0.40
SCORES_CAP = 256 * 2**20  # bytes of materialized scores beyond which flash attention stays on
PREFILL_UBATCH = 512  # the runner's default n_ubatch: the most tokens one chunk's scores cover
SUBPROCESS_TIMEOUT_S = 120
CALIBRATE_MODULE = "localinfer.backends.llamacpp.attention_calibrate"
_LOCK = threading.Lock()  # one measurement per process: server loads run in threads
_DECIDED: dict[tuple[int, str, str], bool] = {}
_RUNS_HERE = False  # this process has seen llama.cpp run on this CPU (check_runs_here)


@dataclass(frozen=True, slots=True)
class AttentionTimes:
    """Seconds per token with flash attention ``flash``, summed over DEPTHS cached tokens."""

    flash: bool
    decode: float  # one-token step
    prefill: float  # per token of a CHUNK-token forward
    batched: float = 0.0  # per token of a step of BATCHED sequences, one token each

    def chat_turn(self) -> float:
        """Seconds for a decode step, one token of a batched step and one of a short forward."""
        return self.prefill + self.decode + self.batched


@dataclass(frozen=True, slots=True)
class AttentionCalibration:
    threads: int
    depths: tuple[int, ...]
    rows: tuple[AttentionTimes, ...]  # flash on and off
    heads: str = ""  # AttentionShape.key of the probe it was measured on
    version: int = CALIBRATION_VERSION
    # The share of the probe's turn that off saved in each of the measurement's rounds
    # (attention_calibrate.time_settings); empty for a calibration given by hand.
    round_savings: tuple[float, ...] = ()

    def row(self, flash: bool) -> AttentionTimes:
        return next(r for r in self.rows if r.flash == flash)

    def flash_faster(self) -> bool:
        """Flash attention unless turning it off saves at least MARGIN of the probe's chat turn,
        in the medians and in every round: on a noisy machine one setting's rounds can land in
        a slow second, and llama.cpp's default gives way only to a saving that holds."""
        on, off = self.row(True).chat_turn(), self.row(False).chat_turn()
        off_saves = off < on * (1 - MARGIN) and all(s >= MARGIN for s in self.round_savings)
        return not off_saves

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> AttentionCalibration:
        rows = tuple(AttentionTimes(**r) for r in data["rows"])
        if sorted(r.flash for r in rows) != [False, True]:
            raise ValueError("an attention calibration needs one row with and one without")
        depths = tuple(int(d) for d in data["depths"])
        savings = tuple(float(s) for s in data.get("round_savings", ()))
        return cls(threads=int(data["threads"]), depths=depths, rows=rows,
                   heads=str(data.get("heads", "")),
                   version=int(data.get("version", 0)), round_savings=savings)  # fmt: skip


def scores_bytes(n_heads: int, ctx: int, chunk: int = PREFILL_UBATCH) -> int:
    """What one full prefill chunk's attention holds without flash attention: its float32
    scores, and the f16 copy of the probabilities the CPU backend multiplies V with."""
    return chunk * n_heads * ctx * (4 + 2)


def flash_attention(heads: AttentionHeads, ctx: int, chunk: int = PREFILL_UBATCH) -> bool:
    """Whether a CPU llama.cpp context of ``ctx`` cells per sequence, prefilling up to ``chunk``
    tokens at a time (its n_ubatch), for a model with these attention ``heads`` (a ModelConfig,
    an ArchSpec, an AttentionShape) runs flash attention here. The measurement is at this
    machine's default thread count, whatever a runner is given, and decided once per process and
    head shape: the budget, which knows no thread count, and every runner then decide alike."""
    asked = os.environ.get(ENV, "").strip().lower()
    if asked in ("on", "off"):
        return asked == "on"
    shape = AttentionShape.of(heads)
    if scores_bytes(shape.n_heads, ctx, chunk) > SCORES_CAP:
        return True
    return _machine_prefers_flash(shape)


def _machine_prefers_flash(shape: AttentionShape) -> bool:
    key = (_default_threads(), str(cache_dir()), shape.key)  # a test's cache: another machine
    with _LOCK:
        if key not in _DECIDED:
            if measuring_allowed():
                result = calibration(key[0], shape)
            else:  # a listing: a stored answer, else llama.cpp's default (not kept: measure later)
                result = stored_calibration(key[0], shape)
                if result is None:
                    return True
            _DECIDED[key] = True if result is None else result.flash_faster()
        return _DECIDED[key]


def forget() -> None:
    """Drop this process's decisions (tests that change the cache folder or the environment)."""
    global _RUNS_HERE
    with _LOCK:
        _DECIDED.clear()
        _RUNS_HERE = False


def running_in_the_probe() -> None:
    """Called by the measuring child: it is the probe, so its runners do not start another."""
    global _RUNS_HERE
    _RUNS_HERE = True


def calibration(threads: int, shape: AttentionShape) -> AttentionCalibration | None:
    """This machine's measurement for ``threads`` (measured now if never measured: one process
    at a time, the others wait for its file); None when llama.cpp could not be measured here
    (logged: llama.cpp's default then applies)."""
    stored = stored_calibration(threads, shape)
    path = calibration_path(threads, shape)
    if stored is not None or path is None:
        return stored
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path.with_suffix(".lock")):
        return _stored(path, threads, shape) or _measure(threads, shape)


def stored_calibration(threads: int, shape: AttentionShape) -> AttentionCalibration | None:
    """The measurement stored for ``threads`` and ``shape`` on this machine and build, if any."""
    path = calibration_path(threads, shape)
    return None if path is None else _stored(path, threads, shape)


def check_runs_here() -> None:
    """Raise BackendUnavailableError if this llama-cpp-python crashes on this CPU. A child
    process loads it and runs one forward of the embedded model once per machine and llama.cpp
    build (a marker file remembers it); the runner asks before this process loads the library."""
    global _RUNS_HERE
    path = calibration_path(0)
    if _RUNS_HERE or path is None:
        return
    marker = path.with_name(path.name.replace("attention-", "runs-here-"))
    if marker.exists():
        _RUNS_HERE = True
        return
    child = run_json_child(CALIBRATE_MODULE, ["--probe"], SUBPROCESS_TIMEOUT_S)
    _refuse_illegal_instruction(child)
    if child.data is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("ok\n")
        _RUNS_HERE = True
    else:  # another failure (no embedded model, a timeout): the runner will say what it is
        log.warning("could not check llama.cpp in a child process: %s", child.problem)


def store_calibration(result: AttentionCalibration) -> None:
    path = calibration_path(result.threads, result.heads)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_json()))
    os.replace(tmp, path)


def calibration_path(threads: int, shape: AttentionShape | str = "") -> Path | None:
    """Where this machine's result for this llama.cpp build and head shape lives (None: no
    llama.cpp here)."""
    build = _llama_build()
    if build is None:
        return None
    heads = shape.key if isinstance(shape, AttentionShape) else shape
    key = f"{build}|{cpu_identity()}|{threads}|{heads}"
    name = f"attention-v{CALIBRATION_VERSION}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return probe_folder() / f"{name}.json"


def probe_folder() -> Path:
    """Where the calibrations and their probe models live."""
    return cache_dir() / "llamacpp"


def _stored(path: Path, threads: int, shape: AttentionShape) -> AttentionCalibration | None:
    try:
        stored = AttentionCalibration.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measure
    asked = (CALIBRATION_VERSION, threads, DEPTHS, shape.key)
    fresh = (stored.version, stored.threads, stored.depths, stored.heads) == asked
    return stored if fresh else None


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between processes where fcntl exists (POSIX); else none."""
    with open(lock_path, "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@cache
def _default_threads() -> int:
    return physical_cores()


@cache
def _llama_build() -> str | None:
    """The installed llama.cpp libraries' names, sizes and times: a rebuild is a new key."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    try:
        files = sorted(p for p in lib.iterdir() if p.is_file())
        return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    except OSError:
        return str(spec.origin)


def _refuse_illegal_instruction(child: ChildResult) -> None:
    if child.illegal_instruction:
        raise BackendUnavailableError(
            f"llama.cpp crashes on this CPU (illegal instruction): the llama-cpp-python in "
            f"{Path(sys.executable).parent.parent} was built for a CPU with other features. "
            "Rebuild it here: pip install --force-reinstall --no-cache-dir llama-cpp-python "
            "(or use --backend torch)"
        )


def _measure(threads: int, shape: AttentionShape) -> AttentionCalibration | None:
    log.info("measuring llama.cpp's attention kernels for %s heads on this CPU", shape.key)
    args = [str(n) for n in (threads, shape.n_heads, shape.n_kv_heads, shape.head_dim)]
    child = run_json_child(CALIBRATE_MODULE, args, SUBPROCESS_TIMEOUT_S)
    _refuse_illegal_instruction(child)
    try:
        if child.data is not None:
            return AttentionCalibration.from_json(child.data)
    except (KeyError, TypeError, ValueError) as exc:
        child = ChildResult(None, 0, f"unreadable result ({exc})")
    log.warning(
        "llama.cpp attention calibration failed (%s): flash attention stays on", child.problem
    )
    return None
