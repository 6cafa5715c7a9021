"""Attaching images to the next message (issue #37): ``/image PATH`` typed at the prompt, or the
path dialog (F6); ``/image clear`` removes the images waiting for the next message (``/image
clear N``: the N-th). They show above the prompt until the message goes, then as chips on it,
each with the context it takes (the model's projector counts it when it is attached).

Reading, decoding and counting run in a worker (chat_images.py); a bad file, or a model that
reads no images, is one line in the conversation, and what was typed stays typed. A conversation
saved with images keeps a copy of each in the conversations folder, or only the path it was
attached from (``chat --image-store copy|reference``); one whose file is gone opens with a note
and the image left out of the prompt.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.message import Message

from localinfer.conversations import Conversation, MessageImage
from localinfer.tui.app_base import ChatAppBase
from localinfer.tui.chat_images import chip
from localinfer.tui.failure_text import error_text
from localinfer.tui.image_screen import ImagePathScreen

COMMAND = "/image"
USAGE = "/image PATH attaches an image to the next message (or F6); /image clear removes them"


@dataclass
class ImageAttached(Message):
    image: MessageImage


@dataclass
class ImageRefused(Message):
    error: str
    command: str  # the command typed, put back in the prompt ('' from the dialog)


def image_path_text(text: str) -> str:
    """A typed path as a terminal's drag and drop writes it: quoted, or its spaces escaped."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if "\\" in text and not Path(text).expanduser().exists():
        try:
            words = shlex.split(text)
        except ValueError:
            return text
        return words[0] if len(words) == 1 else text
    return text


class ImageActions(ChatAppBase):
    image_store = "copy"  # "reference": save the path instead of a copy (chat --image-store)

    def image_command(self, text: str) -> bool:
        """Run ``text`` when it is an /image command (True); the lines after it stay typed."""
        first, _, rest = text.partition("\n")
        command = first.strip()
        if command != COMMAND and not command.startswith(COMMAND + " "):
            return False
        if rest.strip():
            self.prompt.load_text(rest)
        argument = command.removeprefix(COMMAND).strip()
        if not argument:
            self.notify(USAGE)
        elif argument.split()[0] == "clear":
            self.clear_pending(argument.removeprefix("clear").strip())
        else:
            self.start_attach(image_path_text(argument), command)
        return True

    def action_attach_image(self) -> None:
        self.push_screen(ImagePathScreen(), self._attach_from_dialog)

    def _attach_from_dialog(self, path: str | None) -> None:
        if path:
            self.start_attach(image_path_text(path))

    def start_attach(self, path: str, command: str = "") -> None:
        from localinfer.image_input import MAX_IMAGES

        why = None
        if self.loading or not self.host.loaded:
            why = "the model is still loading"
        elif len(self.pending_images) >= MAX_IMAGES:
            why = f"at most {MAX_IMAGES} images go with one message"
        if why:
            self.post_message(ImageRefused(why, command))
            return
        self.attach_image(Path(path), command)

    @work(thread=True, group="image")
    def attach_image(self, path: Path, command: str) -> None:
        store = self.store if self.image_store == "copy" else None
        try:
            image = self.host.images.attach(path, self.host.image_tokens, store)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a line in the chat
            self.post_message(ImageRefused(error_text(exc), command))
            return
        self.post_message(ImageAttached(image))

    @on(ImageAttached)
    def on_image_attached(self, message: ImageAttached) -> None:
        self.pending_images.append(message.image)
        self.show_pending()

    @on(ImageRefused)
    def on_image_refused(self, message: ImageRefused) -> None:
        self.view.add_notice(f"Not attached: {message.error}.", error=True)
        if message.command and not self.prompt.text:
            self.prompt.load_text(message.command)

    def clear_pending(self, which: str) -> None:
        pending = self.pending_images
        if not pending:
            self.notify("No image is attached.", severity="warning")
            return
        if not which:
            removed = list(pending)
            pending.clear()
        elif which.isdigit() and 1 <= int(which) <= len(pending):
            removed = [pending.pop(int(which) - 1)]
        else:
            self.notify(
                f"/image clear {which}: give 1 to {len(pending)}, or nothing for all.",
                severity="warning",
            )
            return
        self.show_pending()
        self.notify(f"Removed {', '.join(image.name for image in removed)}.")

    def show_pending(self) -> None:
        """The images waiting for the next message, above the prompt (hidden when none)."""
        pending = self.pending_images
        chips = "  ".join(f"{i}. {chip(image)}" for i, image in enumerate(pending, 1))
        self.pending_row.update(f"Next message: {chips} · /image clear removes them")
        self.pending_row.set_class(bool(pending), "-shown")

    def take_pending(self) -> list[MessageImage]:
        """The pending images, for the message being sent."""
        taken = list(self.pending_images)
        self.pending_images.clear()
        self.show_pending()
        return taken

    def restore_pending(self, images: Iterable[MessageImage]) -> None:
        """A message that was not answered gives its images back to the next one."""
        self.pending_images[:0] = list(images)
        self.show_pending()

    def show_saved(self, conversation: Conversation, *, notes: bool = True) -> None:
        """``conversation`` in the view, each image's chip marked where its file is gone, and
        (``notes``) a note saying so under it."""
        images = [image for message in conversation.messages for image in message.images]
        known = self.host.images.know(images, self.store)
        gone = {image.key: (image, path) for image, path in known}
        shown = self.reasoning_shown
        self.view.show_conversation(conversation, reasoning_shown=shown, gone=frozenset(gone))
        for image, path in gone.values() if notes else ():
            self.view.add_notice(
                f"The image {image.name} is gone ({path}): the model no longer sees it; the "
                "conversation's text is kept."
            )
