"""What a loaded model measurably takes from this process, split into the budget's rows.

The budget predicts the process's memory growth from loading and running a model; `budget
--verify` checks it against the resident-set growth of a fresh process, and the chat's memory
panel shows the same quantity. The growth splits into the budget's rows: weights and KV cache as
the runner holds them (both written in full: weights read or copied in, the KV cache allocated
zeroed), and the rest of it: compute buffers as far as they were written, the backend's library
and runtime. A backend may reserve more than it writes (llama.cpp sizes its compute buffers for
its worst graph and writes a fraction of them): what the runner holds beyond weights + KV is kept
apart as *reserved*, and never added to what is used.

A model keeps growing a little after it loads: the first forward passes write compute buffers
(and torch's activations) that loading only reserved. That growth is read from the anonymous
mappings that appeared while the model loaded (the backend's buffers, the engine thread's malloc
arena), not from the process's RSS, which by then also holds whatever the program around the
model allocated (the chat's window).

On a GPU the process's RSS says nothing about device memory; there the runner's own figures are
the measurement (torch's allocator keeps what it reserved: taken from the device, so counted).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# The module each backend's runtime constant is the import of (as localinfer/budget_verify.py).
BACKEND_LIBRARY = {"torch": "torch", "llamacpp": "llama_cpp", "mlx": "mlx.core"}


class RunnerMemory(Protocol):
    """backends.base.MemoryReport: what a runner says it holds, in bytes."""

    weights: int
    kv_cache: int
    overhead: int
    device: str


def process_rss() -> int | None:
    """Resident set size of this process in bytes (Linux /proc; None elsewhere)."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # kB
    return None


_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
Ranges = tuple[tuple[int, int], ...]  # [start, end) address ranges, page-aligned


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of /proc/self/maps: an address range and its name."""

    start: int
    end: int
    name: str  # a file, [heap], [stack]..., or "" for anonymous memory

    @property
    def anonymous(self) -> bool:
        return self.name == "" or self.name.startswith("[anon")


def read_mappings() -> list[Mapping] | None:
    """This process's mappings (Linux; None elsewhere)."""
    path = Path("/proc/self/maps")
    if not path.is_file():
        return None
    out = []
    for line in path.read_text().splitlines():
        match = _MAPPING.match(line)
        if match:
            start, end = int(match.group(1), 16), int(match.group(2), 16)
            out.append(Mapping(start, end, match.group(3).strip()))
    return out


def _subtract(ranges: list[tuple[int, int]], taken: list[tuple[int, int]]) -> Ranges:
    """The parts of ``ranges`` outside every range of ``taken``."""
    out = []
    for start, end in ranges:
        pieces = [(start, end)]
        for t_start, t_end in taken:
            pieces = [
                part
                for a, b in pieces
                for part in ((a, min(b, t_start)), (max(a, t_end), b))
                if part[0] < part[1]
            ]
        out.extend(pieces)
    return tuple(out)


def resident_bytes(ranges: Ranges) -> int | None:
    """Bytes of ``ranges`` in RAM now (the present bit of /proc/self/pagemap), or None where
    the kernel does not say. Exact per page: a neighbour the kernel merged into the same mapping
    later is not counted."""
    import numpy as np

    try:
        pagemap = open("/proc/self/pagemap", "rb")  # noqa: SIM115 - closed below
    except OSError:
        return None
    pages = 0
    with pagemap:
        for start, end in ranges:
            pagemap.seek(start // _PAGE * 8)
            entries = np.frombuffer(pagemap.read((end - start) // _PAGE * 8), dtype=np.uint64)
            pages += int(np.count_nonzero(entries >> np.uint64(63)))
    return pages * _PAGE


@dataclass(frozen=True, slots=True)
class LoadGrowth:
    """The process's RSS before and after a model loaded, read by whoever loaded it, and the
    anonymous memory mapped meanwhile that was not all written yet (where the model goes on
    growing as it runs: compute buffers, activations, the engine thread's malloc arena)."""

    before: int
    after: int
    # The backend's library was imported before the first reading (a process that loaded a
    # model before): the growth then lacks the library, part of the budget's runtime constant.
    library_preloaded: bool = False
    unwritten: Ranges = ()  # ranges mapped during the load, partly resident at its end
    unwritten_resident: int = 0  # their resident bytes at the end of the load

    @property
    def growth(self) -> int:
        return self.after - self.before

    def growth_now(self) -> int:
        """The load's growth plus the pages the model has written since in what it mapped."""
        resident = resident_bytes(self.unwritten) if self.unwritten else None
        if resident is None:
            return self.growth
        return self.growth + max(0, resident - self.unwritten_resident)


class GrowthProbe:
    """Reads RSS around a load: ``probe = GrowthProbe(backend); load(); probe.finish()``."""

    def __init__(self, backend: str | None) -> None:
        library = BACKEND_LIBRARY.get(backend or "", "")
        # Unknown backend (None: chosen while loading): preloaded if any library is.
        libraries = [library] if library else list(BACKEND_LIBRARY.values())
        self._preloaded = any(name in sys.modules for name in libraries)
        self._mapped = [(m.start, m.end) for m in read_mappings() or []]
        self._before = process_rss()

    def finish(self) -> LoadGrowth | None:
        after = process_rss()
        if self._before is None or after is None:
            return None
        anonymous = [(m.start, m.end) for m in read_mappings() or [] if m.anonymous]
        partial, resident = [], 0
        for piece in _subtract(anonymous, self._mapped):
            held = resident_bytes((piece,))
            if held is not None and held < piece[1] - piece[0]:  # a full one cannot grow
                partial.append(piece)
                resident += held
        return LoadGrowth(self._before, after, self._preloaded, tuple(partial), resident)


@dataclass(frozen=True, slots=True)
class MeasuredMemory:
    """A loaded model's memory in the budget's rows, in bytes."""

    weights: int
    kv_cache: int
    rest: int | None  # compute buffers as written + library and runtime; None: not measured
    reserved: int  # what the runner holds beyond weights + KV, written or not
    device: str
    library_preloaded: bool = False

    @property
    def total(self) -> int | None:
        return None if self.rest is None else self.weights + self.kv_cache + self.rest


def measured_memory(runner: RunnerMemory, load: LoadGrowth | None) -> MeasuredMemory:
    """The runner's figures with the process growth of its load split around them.

    On CPU the total is the RSS growth of the load (``load``; None leaves the rest unmeasured).
    Elsewhere the runner's overhead is device memory it holds, so it is the rest.
    """
    on_cpu = runner.device == "cpu"
    if not on_cpu:
        rest: int | None = runner.overhead
    elif load is None:
        rest = None
    else:
        rest = max(0, load.growth_now() - runner.weights - runner.kv_cache)
    return MeasuredMemory(
        weights=runner.weights,
        kv_cache=runner.kv_cache,
        rest=rest,
        reserved=runner.overhead,
        device=runner.device,
        library_preloaded=bool(load and load.library_preloaded),
    )
