"""Images in a prompt, as they cross the Runner seam (issue #37); re-exported by base.py.

A prompt with images is a list of token ids in which each image's positions hold placeholder
ids: ids from :data:`IMAGE_ID_BASE` up, which no vocabulary reaches, drawn from the image's
digest (31 bits a position, from shake-256 of the digest). The prefix cache and the KV tiers
compare ids, so they key an image's cells by the image itself: the same picture in a later turn
reuses its cells, another picture never matches (one position in 2**31 by chance, and the whole
image only with every position alike), and the disk tier stores them as any id (uint32).

The images travel beside the ids as :class:`PromptImage`: where the image starts in the prompt,
how many positions it takes, its digest and the runner's own prepared input (opaque above the
seam). A runner that reads images (``runner.vision``, :class:`VisionInput`) makes both from the
prompt's text, in which :data:`IMAGE_MARKER` stands where each image goes; the marker carries a
random part, so no client text can forge one.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

IMAGE_ID_BASE = 1 << 31  # placeholder ids are IMAGE_ID_BASE + 31 bits: below 2**32
IMAGE_MARKER = f"<__image_{secrets.token_hex(6)}__>"  # one per process (module doc)


def image_token_ids(digest: str, n_tokens: int) -> list[int]:
    """The placeholder ids of an image of ``n_tokens`` positions whose digest is ``digest``."""
    raw = hashlib.shake_256(bytes.fromhex(digest)).digest(4 * n_tokens)
    return [
        IMAGE_ID_BASE + (int.from_bytes(raw[i : i + 4], "little") & 0x7FFFFFFF)
        for i in range(0, 4 * n_tokens, 4)
    ]


def is_image_id(token: int) -> bool:
    return token >= IMAGE_ID_BASE


@dataclass(frozen=True, slots=True)
class RGBImage:
    """A decoded picture: ``width x height`` pixels, 3 bytes (R, G, B) each, row by row."""

    width: int
    height: int
    pixels: bytes = field(repr=False)
    digest: str = field(init=False, repr=False)  # sha256 of the size and the pixels

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"an image of {self.width}x{self.height} pixels")
        if len(self.pixels) != self.width * self.height * 3:
            raise ValueError("an RGB image holds width x height x 3 bytes")
        size = f"{self.width}x{self.height}:".encode()
        object.__setattr__(self, "digest", hashlib.sha256(size + self.pixels).hexdigest())


@dataclass(frozen=True, slots=True, eq=False)
class PromptImage:
    """One image of a prompt: positions ``[start, start + n_tokens)`` hold its placeholder ids."""

    start: int
    n_tokens: int
    digest: str
    data: object = field(repr=False)  # the runner's prepared input (llama.cpp: an mtmd chunk)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    """A prompt's ids (placeholders where the images go) and its images, in order."""

    ids: list[int]
    images: tuple[PromptImage, ...]


@runtime_checkable
class VisionInput(Protocol):
    """What a runner that reads images offers as ``runner.vision``. ``prompt`` may be called from
    any thread; the runner's forward reads the images' data on the engine thread."""

    def prompt(self, text: str, images: Sequence[RGBImage], bos: int | None) -> ImagePrompt:
        """``text`` (with :data:`IMAGE_MARKER` where each image goes, as many as ``images``)
        tokenized, with ``bos`` first when given; ValueError when the markers and images do not
        pair up or an image cannot be prepared."""
        ...

    def encode(self, image: PromptImage) -> Any:
        """The image's embeddings, ``[n_tokens, width]`` float32, as the text model takes them
        (a numpy array; on the thread that runs the runner's forward)."""
        ...

    def load_growth(self) -> int | None:
        """Bytes this process's resident memory grew by while the projector loaded (its
        weights, and what loading touched of its buffers); None where it was not read."""
        ...


def runner_vision(runner: object) -> VisionInput | None:
    """``runner.vision`` when the runner reads images (a projector loaded); None otherwise."""
    vision = getattr(runner, "vision", None)
    return vision if isinstance(vision, VisionInput) else None


def check_images(ids: Sequence[int], images: Sequence[PromptImage]) -> None:
    """ValueError unless ``images`` are in order, apart, within ``ids``, and every placeholder id
    lies inside one of them (the engine's request check and the runners rely on it)."""
    end = 0
    for image in images:
        if image.n_tokens < 1 or image.start < end or image.end > len(ids):
            raise ValueError(f"an image at [{image.start}, {image.end}) of a {len(ids)}-id prompt")
        end = image.end
    covered = {p for image in images for p in range(image.start, image.end)}
    stray = next((i for i, t in enumerate(ids) if is_image_id(t) and i not in covered), None)
    if stray is not None:
        raise ValueError(f"an image placeholder id at position {stray} belongs to no image")


def images_within(images: Sequence[PromptImage], start: int, end: int) -> tuple[PromptImage, ...]:
    """The images that have positions in ``[start, end)``."""
    return tuple(i for i in images if i.start < end and i.end > start)


def image_safe_end(images: Sequence[PromptImage], start: int, end: int) -> int:
    """``end`` moved so that ``[start, end)`` splits no image: past an image it would cut (the
    image's tokens are fed in one piece, which some projectors need: Gemma 3's image attends to
    itself both ways), or back to the image's start when the piece starts before it."""
    for image in images:
        if image.start < end < image.end:
            return image.start if image.start > start else image.end
    return end
