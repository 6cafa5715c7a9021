"""Flash attention on or off for llama.cpp on the CPU: measured once per machine, never assumed.

llama.cpp's ``flash_attn = auto`` turns its fused attention kernel on for the CPU. On the
project's machine that kernel is the slow one wherever a forward carries few tokens per sequence:
embedded model, 2 threads, tok/s with it on / off by tokens per forward, at 1,024 cached tokens:
1: 20 / 28, 8: 33 / 80, 32: 38 / 116, 128: 136 / 127, 512: 149 / 125; at 2,048: 1: 14 / 46,
32: 24 / 187, 512: 128 / 183 (/tmp grid, load ~1-2). Decode steps, batched decode (one token per
slot), speculative verification and the short prefills that prefix reuse leaves are all such
forwards; only long prefill chunks gain from it, and not by much. Which side wins depends on the
CPU and the llama.cpp build, so attention_calibrate.py times both on the embedded model at
DEPTH cached tokens (a synthetic KV restored, not prefilled: ~2 s in all), and the result is
stored per machine, llama.cpp build and thread count.

The decision weighs a one-token decode step and a CHUNK-token forward (per token) equally and
keeps llama.cpp's own default (on) unless off is ``MARGIN`` faster. Without flash attention a
prefill chunk materializes its scores against the whole context (chunk x heads x context
floats); past ``SCORES_CAP`` bytes of them, memory wins and flash attention stays on. The budget
asks :func:`flash_attention` with the same arguments as the runner, so both agree.

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
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.errors import BackendUnavailableError
from localinfer.paths import cache_dir

log = logging.getLogger(__name__)

ENV = "LOCALINFER_FLASH_ATTN"  # on | off: skip the measurement (benchmarks, tests)
CALIBRATION_VERSION = 1
DEPTH = 1024  # cached tokens the timed steps attend over
CHUNK = 16  # tokens of the timed short forward (verification, a short prefill)
MARGIN = 0.05  # off must save this share of a chat turn's time to replace llama.cpp's default
SCORES_CAP = 256 * 2**20  # bytes of materialized scores beyond which flash attention stays on
PREFILL_UBATCH = 512  # the runner's default n_ubatch: the most tokens one chunk's scores cover
SUBPROCESS_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class AttentionTimes:
    """Seconds per token with flash attention ``flash`` at DEPTH cached tokens."""

    flash: bool
    decode: float  # one-token step
    prefill: float  # per token of a CHUNK-token forward

    def chat_turn(self) -> float:
        """Seconds for a decode step plus one token of a short forward."""
        return self.prefill + self.decode


@dataclass(frozen=True, slots=True)
class AttentionCalibration:
    threads: int
    depth: int
    rows: tuple[AttentionTimes, ...]  # flash on and off
    version: int = CALIBRATION_VERSION

    def row(self, flash: bool) -> AttentionTimes:
        return next(r for r in self.rows if r.flash == flash)

    def flash_faster(self) -> bool:
        """Flash attention unless turning it off saves at least MARGIN of a chat turn."""
        on, off = self.row(True).chat_turn(), self.row(False).chat_turn()
        return not off < on * (1 - MARGIN)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> AttentionCalibration:
        rows = tuple(AttentionTimes(**r) for r in data["rows"])
        return cls(threads=int(data["threads"]), depth=int(data["depth"]), rows=rows,
                   version=int(data.get("version", 0)))  # fmt: skip


def scores_bytes(n_heads: int, ctx: int, chunk: int = PREFILL_UBATCH) -> int:
    """What one full prefill chunk's attention holds without flash attention: its float32
    scores, and the f16 copy of the probabilities the CPU backend multiplies V with."""
    return chunk * n_heads * ctx * (4 + 2)


def flash_attention(n_heads: int, ctx: int, chunk: int = PREFILL_UBATCH) -> bool:
    """Whether a CPU llama.cpp context of ``ctx`` cells per sequence, prefilling up to ``chunk``
    tokens at a time, for a model with ``n_heads`` query heads runs flash attention here. The
    measurement is at this machine's default thread count, whatever a runner is given: the
    budget, which knows no thread count, then decides as the runner does."""
    asked = os.environ.get(ENV, "").strip().lower()
    if asked in ("on", "off"):
        return asked == "on"
    if scores_bytes(n_heads, ctx, chunk) > SCORES_CAP:
        return True
    result = calibration(physical_cores())
    return True if result is None else result.flash_faster()


def calibration(threads: int) -> AttentionCalibration | None:
    """This machine's measurement for ``threads`` (measured now if never measured); None when
    llama.cpp could not be measured here (logged once: llama.cpp's default then applies)."""
    path = calibration_path(threads)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        stored = AttentionCalibration.from_json(data)
        if stored.version == CALIBRATION_VERSION and stored.threads == threads:
            return stored
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        pass  # absent or unreadable: measure
    return _measure_once(threads)


def store_calibration(result: AttentionCalibration) -> None:
    path = calibration_path(result.threads)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_json()))
    os.replace(tmp, path)


def calibration_path(threads: int) -> Path | None:
    """Where this machine's result for this llama.cpp build lives (None: no llama.cpp here)."""
    build = _llama_build()
    if build is None:
        return None
    key = hashlib.sha256(f"{build}|{_cpu_identity()}|{threads}".encode()).hexdigest()[:16]
    return cache_dir() / "llamacpp" / f"attention-v{CALIBRATION_VERSION}-{key}.json"


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


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return f"{platform.processor()}|{line}"
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{platform.platform()}"


@cache
def _measure_once(threads: int) -> AttentionCalibration | None:
    log.info("measuring llama.cpp's attention kernels on this CPU (once per machine)")
    module = "localinfer.backends.llamacpp.attention_calibrate"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, str(threads)],
            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False,
        )  # fmt: skip
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("llama.cpp attention calibration failed (%s): flash attention stays on", exc)
        return None
    if proc.returncode == -signal.SIGILL:
        raise BackendUnavailableError(
            f"llama.cpp crashes on this CPU (illegal instruction): the llama-cpp-python in "
            f"{Path(sys.executable).parent.parent} was built for a CPU with other features. "
            "Rebuild it here: pip install --force-reinstall --no-cache-dir llama-cpp-python "
            "(or use --backend torch)"
        )
    if data is None:
        log.warning(
            "llama.cpp attention calibration failed (exit %s: %s): flash attention stays on",
            proc.returncode, proc.stderr.strip()[-300:] or "no message",
        )  # fmt: skip
        return None
    return AttentionCalibration.from_json(data)
