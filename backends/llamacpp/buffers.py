"""The buffer sizes llama.cpp logs while it builds a context, read back out of its log."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BUFFER_RE = re.compile(r"(\S+)\s+(KV|output|compute) buffer size =\s+([\d.]+) MiB")


@dataclass(slots=True, frozen=True)
class LlamaCppBuffers:
    """Buffer sizes llama.cpp reported (its own log) while building the context, in bytes."""

    kv: int
    output: int
    compute: int


def parse_buffers(log_text: str) -> LlamaCppBuffers:
    """The context's buffers from its log.

    Every KV line is a cache of its own: a model with sliding-window layers has two (llama.cpp's
    iswa cache, one for the full-attention layers and one for the sliding ones), each with a line
    per device, so they add up. A compute line for a device it logged before replaces the earlier
    one (llama.cpp reserves its graphs again after a memory update).
    """
    kv = 0
    sizes: dict[str, dict[str, int]] = {"output": {}, "compute": {}}
    for device, kind, mib in _BUFFER_RE.findall(log_text):
        size = round(float(mib) * 1024 * 1024)
        if kind == "KV":
            kv += size
        else:
            sizes[kind][device] = size
    return LlamaCppBuffers(
        kv=kv, output=sum(sizes["output"].values()), compute=sum(sizes["compute"].values())
    )
