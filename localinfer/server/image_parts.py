"""Images in a chat request (issue #37): OpenAI's ``image_url`` parts, decoded and checked
(localinfer/image_input.py: a 400 naming the part for a bad one; remote URLs refused, or fetched
under ``serve --allow-image-urls``: image_fetch.py), then the prompt made by the model's projector.

Each image part stands in the message's text as the image marker (chat_messages.py), so the chat
template places it like any text; ``ImageChat`` (localinfer/image_input.py) then tokenizes the
rendered prompt with the projector instead of the text tokenizer, and keeps the images for the
engine's Request. A model that reads no images (no projector, or a runner other than
llama.cpp's) answers 404, as for another capability it lacks (capability.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.engine.images import PromptImage, reads_images
from localinfer.engine.request_checks import IMAGES_NEED
from localinfer.errors import UnsupportedModelError
from localinfer.image_input import (
    ChatSource,
    ImageChat,
    check_image_count,
    decode_image,
    image_url_bytes,
)
from localinfer.server.capability import capability_refused
from localinfer.server.chat_messages import ChatMessage
from localinfer.server.image_fetch import (
    REQUEST_IMAGE_FETCH,
    ImageFetch,
    fetch_image,
    is_remote,
)


def with_images(source: ChatSource, messages: Sequence[ChatMessage]) -> ChatSource:
    """``source`` itself for a chat without images; for one with images, an ``ImageChat`` over
    them, decoded here (400s naming the part), or the 404 of a model that reads none."""
    found = [
        (f"messages[{m}].content[{p}].image_url.url", url)
        for m, message in enumerate(messages)
        for p, url in message.image_urls()
    ]
    if not found:
        return source
    # A bad image is a 400 whatever the model (capability.py), so it is checked first; but
    # nothing is fetched for a model that reads no images.
    check_image_count(len(found), "messages")
    fetch = REQUEST_IMAGE_FETCH.get()
    runner = getattr(getattr(source, "engine", None), "runner", None)
    if fetch is not None and any(is_remote(url) for _, url in found):
        _check_reads(source.model.name, runner)
    images = [decode_image(_image_bytes(url, field, fetch), field) for field, url in found]
    _check_reads(source.model.name, runner)
    return ImageChat(source, runner, images)


def _image_bytes(url: str, field: str, fetch: ImageFetch | None) -> bytes:
    if fetch is not None and is_remote(url):
        return fetch_image(url, field, fetch)  # serve --allow-image-urls
    return image_url_bytes(url, field)


def _check_reads(model: str, runner: object) -> None:
    with capability_refused(model, "read images", param="messages"):
        if not reads_images(runner):
            raise UnsupportedModelError(IMAGES_NEED)


def prompt_images(source: ChatSource) -> tuple[PromptImage, ...]:
    """The images of the prompt ``source`` rendered (none for a chat without images)."""
    return source.images if isinstance(source, ImageChat) else ()
