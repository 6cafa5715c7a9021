"""Server-Sent Events: the data payloads of the events in a text stream.

One decoder for every client of a streaming server here: the chat's remote answers
(tui/remote_stream.py) and the benchmark's load generator (bench/targets.py). It follows the
WHATWG event-stream rules the servers rely on: lines end in CRLF, LF or CR (a CRLF may be split
across two chunks); a blank line ends an event; ``data`` lines join with newlines; comments
(``:`` lines, keep-alives) and other fields are skipped; an event with no ``data`` line yields
nothing.
OpenAI's closing ``data: [DONE]`` comes out as the payload :data:`DONE`: the caller stops there.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

DONE = "[DONE]"  # the payload OpenAI-style streams end with


class SSEDecoder:
    """Feed lines (``feed``, without their line ending) or raw text chunks (``feed_text``, cut
    anywhere); an event's data comes out at the blank line that ends it."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._partial = ""  # feed_text: the line not ended yet
        self._after_cr = False  # feed_text: the last chunk ended in CR (its LF may come next)

    def feed(self, line: str) -> str | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def feed_text(self, chunk: str) -> list[str]:
        """The data of every event that ``chunk`` completes, in order."""
        if not chunk:
            return []
        if self._after_cr and chunk.startswith("\n"):
            chunk = chunk[1:]  # the LF of a CRLF cut between chunks
        self._after_cr = chunk.endswith("\r")
        lines = (self._partial + chunk).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self._partial = lines.pop()  # after the last line ending: not a line yet
        return [data for line in lines if (data := self.feed(line)) is not None]

    def flush(self) -> str | None:
        """The pending event's data, if any (a stream may end without the final blank line)."""
        if self._partial:
            line, self._partial = self._partial, ""
            self.feed(line)
        return self._dispatch()

    def _dispatch(self) -> str | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data


def sse_events(chunks: Iterable[str]) -> Iterator[str]:
    """The data payloads of the SSE events in a stream of text chunks."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed_text(chunk)
    tail = decoder.flush()
    if tail is not None:
        yield tail


async def sse_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """The data payloads of the SSE events in `lines` (each without its line ending)."""
    decoder = SSEDecoder()
    async for line in lines:
        data = decoder.feed(line.rstrip("\r"))
        if data is not None:
            yield data
    tail = decoder.flush()
    if tail is not None:
        yield tail
