"""Images in the chat (issue #37): what ``/image`` attaches, and how a conversation's images reach
the model.

A user message's images are saved with it (conversations.MessageImage) and stand in its prompt
text as tags (conversations.IMAGE_TAG_RE). :class:`ChatImages` knows where each image is read from
(the file a reference names, or its copy in the conversations folder), holds the last few decoded,
and turns a prompt's tags into the projector's marker with the images in order
(:meth:`ChatImages.chat_source`): the prompt then goes the way ``generate --image`` and the
server's go (image_input.ImageChat, the engine's Request images). Every turn sends the earlier
turns' images again, decoded to the same pixels, so their placeholder ids match and the engine's
cached KV for them is reused.

An image whose file is gone (a reference to a moved or deleted file, a deleted copy) is left out
of the prompt; the chat says so when it opens the conversation (:meth:`ChatImages.know`).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.conversations import IMAGE_TAG_RE, ConversationStore, MessageImage
from localinfer.errors import UnsupportedModelError

if TYPE_CHECKING:
    from localinfer.conversations import Conversation
    from localinfer.engine.images import RGBImage

IMAGE_STORES: tuple[str, ...] = ("copy", "reference")  # chat --image-store
NO_IMAGES_HINT = "remove the images (/image clear) or load a model that reads them (Ctrl+L)"
_SUFFIX_RE = re.compile(r"\.[a-z0-9]{1,5}")


class ImagesRefused(UnsupportedModelError):
    """The model reads no images here (the engine's reason), and what the chat user can do."""

    hint = NO_IMAGES_HINT


def chip(image: MessageImage, *, gone: bool = False) -> str:
    """How an attached image shows: its file name and the context it takes."""
    tokens = f" · {image.tokens} tokens" if image.tokens else ""
    return f"▣ {image.name}{tokens}" + (" · file gone" if gone else "")


def has_images(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of the prompt ``messages`` holds an image's tag."""
    return any(IMAGE_TAG_RE.search(str(m.get("content", ""))) for m in messages)


def image_tokens(session: Any, image: RGBImage) -> int:
    """The positions ``session``'s projector gives ``image``; ImagesRefused naming the llama.cpp
    backend when the model reads no images (no projector, or another runner)."""
    from localinfer.engine.images import IMAGE_MARKER, image_prompt, reads_images
    from localinfer.engine.request_checks import IMAGES_NEED

    runner = session.engine.runner
    if not reads_images(runner):
        raise ImagesRefused(IMAGES_NEED)
    prompt = image_prompt(runner, session.model.tokenizer, IMAGE_MARKER, [image])
    return prompt.images[0].n_tokens


class ChatImages:
    """The images a chat's prompts hold, by key (the sha256 of the file's bytes): where each is
    read from, the bytes of copies not yet written, the last ``HELD`` decoded. Thread-safe: the
    app registers images, its workers read them."""

    HELD = 8  # decoded images kept (one of 4096 x 4096 pixels is 48 MiB)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, Path] = {}
        self._unsaved: dict[str, bytes] = {}  # a copy's bytes until the conversation is saved
        self._held: OrderedDict[str, RGBImage] = OrderedDict()

    def attach(
        self, path: Path, tokens: Callable[[RGBImage], int], store: ConversationStore | None
    ) -> MessageImage:
        """(Worker thread.) ``path`` read, decoded and counted by ``tokens`` (the model's
        projector, image_tokens); InvalidParameterError for a bad file, ImagesRefused for a model
        that reads no images. ``store``: keep a copy there when the conversation is saved;
        None: keep the path."""
        from localinfer.image_input import decode_image, read_image_bytes

        path = path.expanduser()
        data = read_image_bytes(path, "/image")
        pixels = decode_image(data, f"/image {path}")
        count = tokens(pixels)
        key = hashlib.sha256(data).hexdigest()
        suffix = path.suffix.lower() if _SUFFIX_RE.fullmatch(path.suffix.lower()) else ".img"
        copy = f"{key}{suffix}" if store is not None else ""
        image = MessageImage(path.name, key, count, str(path.resolve()), copy)
        with self._lock:
            self._sources[key] = store.image_path(copy) if store is not None else path.resolve()
            if store is not None and not self._sources[key].is_file():
                self._unsaved[key] = data
            self._hold(key, pixels)
        return image

    def know(
        self, images: Iterable[MessageImage], store: ConversationStore
    ) -> list[tuple[MessageImage, Path]]:
        """Remember where each of a saved conversation's ``images`` is read from; the ones
        whose file is gone, with the path looked at."""
        gone = []
        with self._lock:
            for image in images:
                source = store.image_path(image.copy) if image.copy else Path(image.path)
                self._sources[image.key] = source
                if image.key not in self._unsaved and not source.is_file():
                    gone.append((image, source))
                    self._held.pop(image.key, None)  # left out, as the note will say
        return gone

    def write_copies(self, conversation: Conversation, store: ConversationStore) -> None:
        """(Worker thread.) Write the copies ``conversation``'s images still wait for."""
        for message in conversation.messages:
            for image in message.images:
                with self._lock:
                    data = self._unsaved.get(image.key)
                if data is not None and image.copy:
                    store.keep_image(image.copy, data)
                    with self._lock:
                        self._unsaved.pop(image.key, None)

    def chat_source(
        self, session: Any, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[Any, list[dict[str, Any]]]:
        """(Worker thread.) What renders ``messages`` and their text: ``session`` itself for a
        chat without images; for one with images, an ImageChat over them, each tag turned into
        the projector's marker (a gone image's tag dropped). ImagesRefused when the model reads
        no images."""
        sent = [dict(m) for m in messages]
        if not has_images(sent):
            return session, sent
        from localinfer.engine.images import IMAGE_MARKER, reads_images
        from localinfer.engine.request_checks import IMAGES_NEED
        from localinfer.image_input import ImageChat

        images: list[RGBImage] = []

        def place(found: re.Match[str]) -> str:
            image = self._pixels(found["key"])
            if image is None:
                return ""
            images.append(image)
            return IMAGE_MARKER

        for message in sent:
            message["content"] = IMAGE_TAG_RE.sub(place, str(message.get("content", "")))
        if not images:
            return session, sent
        runner = session.engine.runner
        if not reads_images(runner):
            raise ImagesRefused(IMAGES_NEED)
        return ImageChat(session, runner, images), sent

    def _pixels(self, key: str) -> RGBImage | None:
        """The image ``key`` decoded (the held one, else read again); None when its file is
        gone or it was never registered."""
        from localinfer.image_input import decode_image, read_image_bytes

        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
                return held
            data, source = self._unsaved.get(key), self._sources.get(key)
        if data is None:
            if source is None or not source.is_file():
                return None
            data = read_image_bytes(source, "image")
        pixels = decode_image(data, f"image {source}")
        with self._lock:
            self._hold(key, pixels)
        return pixels

    def _hold(self, key: str, pixels: RGBImage) -> None:
        self._held[key] = pixels
        self._held.move_to_end(key)
        while len(self._held) > self.HELD:
            self._held.popitem(last=False)
