"""Where a llama.cpp slot's tokens sit when images are placed by M-RoPE (issue #37).

A slot holds one KV cell per token, and the engine counts tokens: ``lengths[slot]`` is the cells
cached, the index of the slot's next token (context accounting and the overflow checks count
these). Without M-RoPE each token's position is its index. With M-RoPE (Qwen2-VL, Qwen2.5-VL and
later Qwen VL models) an image of ``rows x columns`` tokens takes four positions a token, time,
row and column, all from the image's first position ``p``: ``(p, p + row, p + column, 0)``, and
only ``n_pos = max(rows, columns)`` of the sequence's positions, so the text after it goes on from
``p + n_pos``, not from ``p + rows x columns`` (llama.cpp's mtmd_input_chunk_get_n_pos; its
server's ``server_tokens::pos_next`` keeps the same two counts).

:class:`SlotPositions` is the runner's ``SlotLengths`` with each slot's M-RoPE images recorded
where they were fed, so the runner turns a token index into the position llama.cpp keys the
cell by: for text at the slot's end, the index plus the slot's ``shift`` (the sum of ``n_pos -
n_tokens`` of its images); for a cut, the position of the first token dropped. Every image cell
of one picture shares the time position ``p``, which is what llama.cpp removes cells by, so a
slot cannot be cut inside such an image (as llama-server's ``keep_first`` refuses it): the cut is
a ValueError and the engine prefills that slot again instead. Whatever sets a slot's length
(a cut, a release, a failed decode put back) drops the images recorded at or past it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localinfer.backends.slot_lengths import SlotLengths


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """An image placed by M-RoPE: tokens ``[start, start + n_tokens)`` of the slot, which take
    ``n_pos`` positions of the sequence."""

    start: int
    n_tokens: int
    n_pos: int

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


class SlotPositions(SlotLengths):
    """Tokens cached per slot (``lengths[slot]``, as SlotLengths) and the M-RoPE images among
    them (module doc). ``shift[slot]``: position minus index of a token after the slot's last
    image."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self._images: list[list[ImageSpan]] = [[] for _ in range(slots)]
        self.shift = np.zeros(slots, dtype=np.int32)
        self._shifted = False  # any slot's shift non-zero: text positions need turning

    def __setitem__(self, slot: int, length: int) -> None:  # type: ignore[override]
        super().__setitem__(slot, length)
        images = None if isinstance(slot, slice) else self._images[slot]
        if images and images[-1].start >= length:
            self._images[slot] = [i for i in self._images[slot] if i.start < length]
            self._reshift(slot)

    def add_image(self, slot: int, start: int, n_tokens: int, n_pos: int) -> None:
        """Record an image placed at the slot's end, at index ``start`` (before its rows are
        decoded: a length set inside it keeps it)."""
        if start != self[slot]:
            raise ValueError(f"slot {slot}: an image at {start}, but the slot holds {self[slot]}")
        self._images[slot].append(ImageSpan(start, n_tokens, n_pos))
        self._reshift(slot)

    def position(self, slot: int, index: int) -> int:
        """The position of the slot's token ``index`` (or of the token that would come there):
        its index plus the shift of the images before it. ValueError for an index strictly inside
        an image (its cells cannot be told apart by position)."""
        shift = 0
        for image in self._images[slot]:
            if index <= image.start:
                break
            if index < image.end:
                raise ValueError(
                    f"slot {slot}: cannot cut at {index}, inside an image placed by M-RoPE "
                    f"(tokens {image.start}..{image.end - 1})"
                )
            shift += image.n_pos - image.n_tokens
        return index + shift

    def cut_position(self, slot: int, length: int) -> int:
        """The position from which llama.cpp drops the slot's cells to cut it to ``length``;
        ValueError for a length the slot cannot be cut to (check_truncate, ``position``)."""
        self.check_truncate(slot, length)
        return self.position(slot, length)

    def end(self, slot: int) -> int:
        """The position the slot's next token takes."""
        return self.position(slot, self[slot])

    def text_positions(self, index: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Positions of a flat batch's rows: token ``index`` of ``slot`` each, at its slot's end."""
        return index + self.shift[slot] if self._shifted else index

    def _reshift(self, slot: int) -> None:
        self.shift[slot] = sum(i.n_pos - i.n_tokens for i in self._images[slot])
        self._shifted = bool(self.shift.any())
