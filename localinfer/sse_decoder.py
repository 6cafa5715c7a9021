"""Server-Sent Events: the data payloads of the events in a text stream.

One decoder for every client of a streaming server here: the chat's remote answers
(tui/remote_stream.py) and the benchmark's load generator (bench/targets.py). It follows the
WHATWG event-stream rules the servers rely on: lines end in CRLF, LF or CR (a CRLF may be split
across two chunks); a blank line ends an event; ``data`` lines join with newlines; comments
(``:`` lines, keep-alives) and other fields are skipped; an event with no ``data`` line yields
nothing; a byte order mark opening the stream is dropped. An event the stream ends before its
blank line is discarded, as a browser does: a cut connection loses the half-sent event instead of
handing the caller half a payload.
OpenAI's closing ``data: [DONE]`` comes out as the payload :data:`DONE`: the caller stops there.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

DONE = "[DONE]"  # the payload OpenAI-style streams end with


BOM = "\ufeff"


class SSEDecoder:
    """Feed lines (``feed``, without their line ending) or raw text chunks (``feed_text``, cut
    anywhere); an event's data comes out at the blank line that ends it."""

    def __init__(self) -> None:
        self._data: list[str] = []
        # feed_text: the line not ended yet, in pieces (joined once its end arrives: a long line
        # in many chunks costs its length, not its length times the chunks)
        self._partial: list[str] = []
        self._after_cr = False  # feed_text: the last chunk ended in CR (its LF may come next)
        self._started = False  # the stream's first character was looked at (a BOM)

    def feed(self, line: str) -> str | None:
        if not self._started:
            self._started = True
            line = line.removeprefix(BOM)
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
        if not self._started:
            self._started = True
            chunk = chunk.removeprefix(BOM)
        if self._after_cr and chunk.startswith("\n"):
            chunk = chunk[1:]  # the LF of a CRLF cut between chunks
        self._after_cr = chunk.endswith("\r")
        if "\n" not in chunk and "\r" not in chunk:
            self._partial.append(chunk)
            return []
        text = "".join([*self._partial, chunk])
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self._partial = [lines.pop()]  # after the last line ending: not a line yet
        return [data for line in lines if (data := self.feed(line)) is not None]

    def _dispatch(self) -> str | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data


def sse_events(chunks: Iterable[str]) -> Iterator[str]:
    """The data payloads of the SSE events in a stream of text chunks (an event the stream ends
    before its blank line is dropped)."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed_text(chunk)


async def sse_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """The data payloads of the SSE events in `lines` (each without its line ending; an event
    the lines end before its blank line is dropped)."""
    decoder = SSEDecoder()
    async for line in lines:
        data = decoder.feed(line.rstrip("\r"))
        if data is not None:
            yield data
