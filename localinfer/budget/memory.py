"""How much memory the target device has: this machine's CPU RAM, a CUDA GPU, Apple unified
memory, or a size typed by the user to plan for another machine: `--device 24GiB` (a machine of
any kind), `--device metal:16GiB` (a Mac with 16 GiB of unified memory), `cuda:12GiB` (a 12 GiB
NVIDIA card), `cpu:32GiB` (a machine without a GPU).

No framework is imported: CUDA figures come from `nvidia-smi`, Apple's from `sysctl`.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import InvalidParameterError

# Apple lets Metal keep about 2/3 to 3/4 of unified memory resident (its
# recommendedMaxWorkingSetSize); the rest stays with macOS and other apps.
APPLE_WORKING_SET_FRACTION = 0.75

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776; '16 GB' -> 16e9. Units: B, KB/KiB, MB/MiB, GB/GiB, TB/TiB."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise InvalidParameterError(
            f"cannot read '{text}' as a memory size; write it like 24GiB, 16GB or 512MiB"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise InvalidParameterError(f"memory size must be positive, got '{text}'")
    return int(value)


def human_bytes(n: int) -> str:
    """Binary units, three significant figures: 1.50 GiB, 512 MiB."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.3g} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
        value /= 1024
    return f"{sign}{value:.3g} TiB" if value < 100 else f"{sign}{value:.0f} TiB"


def looks_like_size(text: str) -> bool:
    return bool(re.match(r"^\s*\d", text))


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """Memory the model may use on one device, in bytes."""

    device: str  # cpu | cuda:N | metal | "24GiB" (a planned machine)
    kind: str  # cpu | cuda | metal | planned
    available: int  # what the budget may fill
    total: int  # the device's whole memory
    note: str = ""
    planned: bool = False  # a machine that is not this one (--device SIZE, KIND:SIZE)


def device_memory(device: str = "auto") -> DeviceMemory:
    """Resolve a --device value to its memory figures."""
    name = device.strip().lower()
    if looks_like_size(name):
        size = parse_size(device)
        return DeviceMemory(device.strip(), "planned", size, size, "planned machine", True)
    kind, _, size_text = name.partition(":")
    if kind in PLANNED_KINDS and _SIZE.match(size_text):  # a size with its unit: cuda:0 is a GPU
        return planned_device(kind, parse_size(size_text))
    if name == "auto":
        if shutil.which("nvidia-smi") and _nvidia_smi():
            return _cuda(0)
        if _is_apple_silicon():
            return _metal()
        return _cpu()
    if name == "cpu":
        return _cpu()
    if name in ("metal", "mps"):
        if not _is_apple_silicon():
            raise InvalidParameterError("--device metal needs an Apple Silicon Mac")
        return _metal()
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise InvalidParameterError(f"bad CUDA device '{device}'; use cuda or cuda:N")
        return _cuda(int(index_text))
    raise InvalidParameterError(
        f"unknown device '{device}'; use auto, cpu, cuda, cuda:N, metal, a size like 24GiB, or "
        "a machine to plan for like metal:16GiB, cuda:12GiB or cpu:32GiB"
    )


PLANNED_KINDS = ("cpu", "cuda", "metal")


def planned_device(kind: str, size: int) -> DeviceMemory:
    """A machine that is not this one: a Mac's unified memory (of which Metal keeps the working
    set), an NVIDIA card's memory, or a CPU machine's RAM."""
    shown = f"{kind}:{human_bytes(size).replace(' ', '')}"
    if kind == "metal":
        usable = int(size * APPLE_WORKING_SET_FRACTION)
        return DeviceMemory(shown, "metal", usable, size, "planned Mac: Metal working set", True)
    note = "planned GPU" if kind == "cuda" else "planned machine's RAM"
    return DeviceMemory(shown, kind, size, size, note, True)


def _cpu() -> DeviceMemory:
    available, total = cpu_memory()
    return DeviceMemory("cpu", "cpu", available, total, "available RAM")


def cpu_memory() -> tuple[int, int]:
    """(available, total) RAM in bytes: /proc/meminfo on Linux, sysctl/vm_stat-free on macOS."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        values: dict[str, int] = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024  # kB
        total = values.get("MemTotal", 0)
        return values.get("MemAvailable", values.get("MemFree", total)), total
    total = _sysctl_int("hw.memsize")
    if total:
        return total, total  # macOS frees file cache on demand; treat all RAM as available
    import os

    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * size, pages * size


def _nvidia_smi() -> list[tuple[int, int]]:
    """[(free, total)] in bytes per GPU, or [] when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


def parse_nvidia_smi(output: str) -> list[tuple[int, int]]:
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            gpus.append((int(parts[0]) * 2**20, int(parts[1]) * 2**20))  # MiB
    return gpus


def _torch_cuda() -> list[tuple[int, int]]:
    """[(free, total)] per GPU from torch when a process already imported it (a container
    without nvidia-smi): never imports torch itself, the budget stays framework-free."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())]


def _cuda(index: int) -> DeviceMemory:
    gpus = _nvidia_smi() or _torch_cuda()
    if not gpus:
        raise InvalidParameterError("no CUDA GPU found (nvidia-smi is missing or reports none)")
    if index >= len(gpus):
        raise InvalidParameterError(f"cuda:{index} does not exist; this machine has {len(gpus)}")
    free, total = gpus[index]
    return DeviceMemory(f"cuda:{index}", "cuda", free, total, "free GPU memory")


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _sysctl_int(key: str) -> int:
    exe = shutil.which("sysctl")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-n", key], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return 0
    text = out.stdout.strip()
    return int(text) if text.isdigit() else 0


def _metal() -> DeviceMemory:
    total = _sysctl_int("hw.memsize")
    usable = int(total * APPLE_WORKING_SET_FRACTION)
    return DeviceMemory("metal", "metal", usable, total, "Metal working set (75% of RAM)")
