"""Server-Sent Events: turn a stream of text lines into the data payloads of its events."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


class SSEDecoder:
    """Feed lines (without their line ending); an event's data comes out at the blank line that
    ends it. Multi-line data is joined with newlines; comments and other fields are skipped."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if line == "":
            return self.flush()
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The pending event's data, if any (a stream may end without the final blank line)."""
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data


async def sse_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """The data payloads of the SSE events in `lines`."""
    decoder = SSEDecoder()
    async for line in lines:
        data = decoder.feed(line.rstrip("\r"))
        if data is not None:
            yield data
    tail = decoder.flush()
    if tail is not None:
        yield tail
