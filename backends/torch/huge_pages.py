"""Host memory for dense CPU weights on transparent huge pages (Linux).

A decode step streams every weight once. On 4 KB pages that is a TLB miss every 4 KB, and the
hardware prefetchers stop at each page boundary; on 2 MB pages neither happens. The gain is small
(scripts/bench-native-kernels: 2-5% more GB/s for a one-token product on the project's 2-core
VM). Most Linux systems run THP in ``madvise`` mode, so the memory has to ask.

An arena is one anonymous mapping advised with MADV_HUGEPAGE; each tensor taken from it is a
separate torch storage (``torch.frombuffer`` on its own slice), so memory accounting per tensor
is unchanged. Elsewhere (not Linux, madvise refused) ``HugePageArena.create`` returns None and
callers allocate as usual.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h
ALIGN = 64  # every tensor starts on a cache line


class HugePageArena:
    def __init__(self, mapping: mmap.mmap, start: int, size: int) -> None:
        self._mapping = mapping  # kept alive by every tensor's buffer as well
        self._next = start
        self._end = start + size

    @classmethod
    def create(cls, nbytes: int) -> HugePageArena | None:
        """An arena of at least ``nbytes`` on huge pages, or None where that is not possible."""
        if sys.platform != "linux" or nbytes < HUGE_PAGE:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
            mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            anchor = ctypes.c_char.from_buffer(mapping)
            base = ctypes.addressof(anchor)
            del anchor  # releases the export, so only tensors pin the mapping
            start = -base % HUGE_PAGE  # first huge-page boundary inside the mapping
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            if libc.madvise(base + start, size, MADV_HUGEPAGE) != 0:
                return None
        except (OSError, AttributeError, ValueError):
            return None
        return cls(mapping, start, size)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` carved from the arena (its own storage)."""
        itemsize = torch.empty(0, dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        offset = -(-self._next // ALIGN) * ALIGN
        if offset + nbytes > self._end:
            raise MemoryError(f"huge-page arena exhausted ({nbytes} bytes asked)")
        self._next = offset + nbytes
        buffer = (ctypes.c_char * nbytes).from_buffer(self._mapping, offset)
        return torch.frombuffer(buffer, dtype=dtype).view(shape)

    @staticmethod
    def padded_bytes(shapes: list[tuple[int, ...]], itemsize: int) -> int:
        """Arena size for tensors of these shapes (alignment included)."""
        return sum(-(-math.prod(s) * itemsize // ALIGN) * ALIGN for s in shapes)
