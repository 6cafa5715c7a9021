"""Server-Sent Events for the benchmark: the project's one decoder (localinfer/sse_decoder.py)."""

from __future__ import annotations

from localinfer.sse_decoder import DONE, SSEDecoder, sse_data, sse_events

__all__ = ["DONE", "SSEDecoder", "sse_data", "sse_events"]
