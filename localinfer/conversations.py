"""Saved chat conversations: one JSON file per conversation under the user data dir.

Files live in ``data_dir()/conversations/<id>.json`` (``LOCALINFER_DATA_DIR`` overrides the
platform default, see localinfer/paths.py). Every write goes to a temporary file in the same
folder, is flushed to disk and then renamed over the old file with ``os.replace``, which is atomic
on POSIX and Windows: a crash mid-save leaves either the old conversation or the new one, never a
half-written file; the temporary a killed writer leaves is swept away later (it carries the
writer's pid, see localinfer/stale_files.py).

A conversation's id is its file name, whatever the file says inside: a copy of a file (a backup, a
sync tool's conflict copy) is another conversation with its own id, never a second one with the same
id. Nothing a file contains may break the store: a file that cannot be parsed or has fields of the
wrong type is skipped by :meth:`ConversationStore.list` and reported by
:meth:`ConversationStore.load`, so one bad file never hides the others.

An image attached to a user message (the chat's ``/image``, issue #37) is saved as a
:class:`MessageImage`: its file name, the tokens it took, and either the path it was attached
from (a reference) or the name of a copy of its bytes in the store's ``images/`` folder, named
by their sha256 so the same picture attached twice is one file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from localinfer.context_fit import window_messages
from localinfer.errors import LocalinferError
from localinfer.stale_files import LeftoverSweep, writer_tag

Role = Literal["system", "user", "assistant"]
FORMAT_VERSION = 1
# Ids are file names: one path component, not hidden (temporaries start with a dot), no control
# characters. Wider than the ids this app makes, so copies named "abc (1)" or
# "abc.sync-conflict-2024" open too.
_ID_RE = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]{0,199}")
# A save's temporary: ".<id>.<writer pid>.<random>.tmp" (tempfile.mkstemp's random part has no dot).
_TEMP_RE = re.compile(r"\..*\.(?P<pid>\d+)\.[^.]+\.tmp|\..*\.tmp")
# A save takes milliseconds: a temporary this old belongs to no one, whatever its pid says.
STALE_TEMP_S = 600.0
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError)
IMAGES_FOLDER = "images"  # copies of attached images, under the store's root
_KEY_RE = re.compile(r"[0-9a-f]{64}")  # an image's key: the sha256 of its file's bytes
_COPY_RE = re.compile(r"[0-9a-f]{64}\.[a-z0-9]{1,5}")  # its copy's name: the key, a suffix
# Where an image goes in a prompt's text: a tag the chat's host turns into the projector's
# marker (tui/chat_images.py). Its random part is this process's, so no typed or saved text can
# forge one, and it is never saved: a message's images are saved beside its text.
_TAG_OPEN = f"<__chat_image_{secrets.token_hex(6)}_"
IMAGE_TAG_RE = re.compile(re.escape(_TAG_OPEN) + r"(?P<key>[0-9a-f]{64})__>")


class ConversationError(LocalinferError, code="conversation_error"):
    """A saved conversation is missing or unreadable."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")  # noqa: UP017 (3.10)


@dataclass(slots=True, frozen=True)
class MessageImage:
    """An image attached to a user message, as saved (module doc)."""

    name: str  # the file's name, as the chat shows it
    key: str  # sha256 of the file's bytes
    tokens: int = 0  # the positions the model's projector gave it (0: not known)
    path: str = ""  # the file it was attached from (a reference: read from there again)
    copy: str = ""  # its copy in the store's images/ folder ('': kept by reference)

    def tag(self) -> str:
        """Where the image goes in the prompt's text (IMAGE_TAG_RE)."""
        return f"{_TAG_OPEN}{self.key}__>"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "key": self.key, "tokens": self.tokens}
        return out | {k: v for k, v in (("path", self.path), ("copy", self.copy)) if v}

    @classmethod
    def from_dict(cls, item: Any) -> MessageImage:
        """A saved image; ValueError for anything else (a copy's name never leaves its folder)."""
        if not isinstance(item, dict):
            raise ValueError(f"bad image {item!r}")
        name, key, tokens = item.get("name"), item.get("key"), item.get("tokens", 0)
        path, copy = item.get("path", ""), item.get("copy", "")
        texts_ok = all(isinstance(v, str) for v in (name, key, path, copy))
        if not texts_ok or not _KEY_RE.fullmatch(key) or not (path or copy):
            raise ValueError(f"bad image {item!r}")
        if copy and not _COPY_RE.fullmatch(copy):
            raise ValueError(f"bad image copy {copy!r}")
        ok = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0
        return cls(name, key, tokens if ok else 0, path, copy)


@dataclass(slots=True)
class ChatMessage:
    role: Role
    content: str
    reasoning: str = ""  # a thinking model's reasoning before this answer (kept apart)
    # An answer's figures as the chat measured them (ttft_s, decode_tok_s, prompt_tokens, ...):
    # saved with it so an export can quote them; never part of the prompt.
    stats: dict[str, float] = field(default_factory=dict)
    images: list[MessageImage] = field(default_factory=list)  # a user message's, in order

    def as_dict(self) -> dict[str, Any]:
        """The message as saved: the reasoning, where there is one, under ``reasoning``."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.stats:
            out["stats"] = dict(self.stats)
        if self.images:
            out["images"] = [image.as_dict() for image in self.images]
        return out

    def as_prompt(self) -> dict[str, str]:
        """The message as a chat template takes it: the reasoning under ``reasoning_content``,
        the name the templates that read it use (Qwen3's renders it only for the turns after
        the last question, i.e. inside a tool loop, and drops it elsewhere; the rest ignore it).
        Each image stands before the text as its tag (IMAGE_TAG_RE), as llama-mtmd-cli places
        images."""
        tags = "".join(image.tag() for image in self.images)
        out = {"role": self.role, "content": tags + self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        return out


@dataclass(slots=True)
class Conversation:
    """A chat: the system prompt, the turns, and which model answered."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = ""
    system_prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    model: str = ""
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    branched_from: str = ""  # the conversation this one was branched off (an edit, a regenerate)
    # Where the model's context begins (#39): the messages before this index are shown and saved
    # but no longer sent (context_fit.py); a "system" message among them summarises them.
    context_start: int = 0

    def add(
        self,
        role: Role,
        content: str,
        reasoning: str = "",
        images: list[MessageImage] | None = None,
    ) -> ChatMessage:
        message = ChatMessage(role, content, reasoning, images=list(images or ()))
        self.messages.append(message)
        if not self.title and role == "user":
            self.title = _title_from(content)
        return message

    def prompt_messages(self) -> list[dict[str, str]]:
        """The messages a chat template renders: the system prompt (when set) then the turns the
        model still sees (from ``context_start``; see context_fit.window_messages)."""
        return window_messages(self.system_prompt, self.messages, self.context_start)

    def to_json(self) -> dict[str, Any]:
        return (
            {
                "version": FORMAT_VERSION,
                "id": self.id,
                "title": self.title,
                "system_prompt": self.system_prompt,
                "model": self.model,
                "created": self.created,
                "updated": self.updated,
                "messages": [m.as_dict() for m in self.messages],
            }
            | ({"branched_from": self.branched_from} if self.branched_from else {})
            | ({"context_start": self.context_start} if self.context_start else {})
        )

    @classmethod
    def from_json(cls, data: Any, conversation_id: str | None = None) -> Conversation:
        """Parse a saved conversation; ``conversation_id`` (the file's name) overrides the id the
        data carries. Raises ValueError for anything that is not a conversation."""
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ValueError("not a conversation object")
        messages = []
        for item in data["messages"]:
            if not isinstance(item, dict):
                raise ValueError(f"bad message {item!r}")
            role, content = item.get("role"), item.get("content")
            reasoning = item.get("reasoning", "")
            if role not in ("system", "user", "assistant") or not isinstance(content, str):
                raise ValueError(f"bad message {item!r}")
            if not isinstance(reasoning, str):
                raise ValueError(f"bad reasoning in {item!r}")
            images = item.get("images", [])
            if not isinstance(images, list):
                raise ValueError(f"bad images in {item!r}")
            figures = _figures(item.get("stats"))
            shown = [MessageImage.from_dict(i) for i in images]
            messages.append(ChatMessage(role, content, reasoning, figures, shown))
        if conversation_id is None:
            conversation_id = _text(data.get("id"))
            if not conversation_id:
                raise ValueError("no conversation id")
        return cls(
            id=conversation_id,
            title=_text(data.get("title")),
            system_prompt=_text(data.get("system_prompt")),
            messages=messages,
            model=_text(data.get("model")),
            created=_text(data.get("created")),
            updated=_text(data.get("updated")),
            branched_from=_text(data.get("branched_from")),
            context_start=_start(data.get("context_start"), len(messages)),
        )


def _start(value: Any, n: int) -> int:
    """A saved ``context_start``: an index into the messages; anything else reads as 0."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= n
    return value if ok else 0


def _text(value: Any) -> str:
    """A string field of a saved file; a missing or wrong-typed one reads as empty."""
    return value if isinstance(value, str) else ""


def _figures(value: Any) -> dict[str, float]:
    """An answer's saved figures; anything but name -> number is dropped (figures are
    optional: a damaged one must not make the conversation unreadable)."""
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in value.items()
        if isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
    }


@dataclass(slots=True, frozen=True)
class ConversationSummary:
    """What the conversation list shows, without holding every message."""

    id: str
    title: str
    model: str
    updated: str
    turns: int


@dataclass(slots=True, frozen=True)
class ConversationListing:
    """What the folder holds: the conversations it can read, newest first, and the names of the
    ``.json`` files it cannot (so a list can say why a conversation is missing)."""

    summaries: list[ConversationSummary]
    unreadable: list[str]


def _title_from(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def default_root() -> Path:
    from localinfer.paths import data_dir

    return Path(data_dir()) / "conversations"


class ConversationStore:
    """Reads and atomically writes conversations as JSON files in one folder."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self._leftovers = LeftoverSweep(self.root, _TEMP_RE, STALE_TEMP_S)

    def path_for(self, conversation_id: str) -> Path:
        if not isinstance(conversation_id, str) or not _ID_RE.fullmatch(conversation_id):
            # Ids become file names: refuse anything that could leave the folder.
            raise ConversationError(f"invalid conversation id {conversation_id!r}")
        return self.root / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        conversation.updated = _now()
        target = self.path_for(conversation.id)
        self.root.mkdir(parents=True, exist_ok=True)
        self._leftovers.once()
        payload = json.dumps(conversation.to_json(), ensure_ascii=False, indent=1)
        self._write(target, payload.encode("utf-8"), conversation.id)
        return target

    def image_path(self, copy: str) -> Path:
        """Where the image copy named ``copy`` (MessageImage.copy) is kept."""
        if not _COPY_RE.fullmatch(copy):
            raise ConversationError(f"invalid image copy name {copy!r}")
        return self.root / IMAGES_FOLDER / copy

    def keep_image(self, copy: str, data: bytes) -> Path:
        """Write an attached image's bytes as the copy ``copy`` (once: the name is their hash)."""
        target = self.image_path(copy)
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            self._leftovers.once()
            self._write(target, data, "image")
        return target

    def _write(self, target: Path, data: bytes, tag: str) -> None:
        """``data`` into ``target`` whole or not at all (module doc); the temporary sits in the
        root, where the sweep of killed writers' leftovers looks."""
        fd, tmp = tempfile.mkstemp(prefix=f".{tag}.{writer_tag()}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self, conversation_id: str) -> Conversation:
        path = self.path_for(conversation_id)
        try:
            return _read(path)
        except FileNotFoundError:
            raise ConversationError(f"no saved conversation {conversation_id!r}") from None
        except _READ_ERRORS as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConversationError(f"{path}: unreadable conversation ({reason})") from None

    def list(self) -> list[ConversationSummary]:
        """Saved conversations, most recently updated first; unreadable files are skipped."""
        return self.scan().summaries

    def scan(self) -> ConversationListing:
        """Saved conversations, most recently updated first, and the files that are unreadable."""
        if not self.root.is_dir():
            return ConversationListing([], [])
        self._leftovers.once()
        out: list[ConversationSummary] = []
        unreadable: list[str] = []
        for path in self.root.glob("*.json"):
            if not _ID_RE.fullmatch(path.stem):
                continue
            try:
                conv = _read(path)
            except _READ_ERRORS:
                unreadable.append(path.name)
                continue
            questions = [m.content for m in conv.messages if m.role == "user"]
            # A file without a title (written by hand, another tool) is listed by its question.
            title = conv.title or (_title_from(questions[0]) if questions else "")
            out.append(
                ConversationSummary(conv.id, title, conv.model, conv.updated, len(questions))
            )
        out.sort(key=lambda s: s.updated, reverse=True)
        return ConversationListing(out, sorted(unreadable))

    def delete(self, conversation_id: str) -> None:
        self.path_for(conversation_id).unlink(missing_ok=True)

    def remove_stale_temps(self) -> list[Path]:
        """Delete the temporaries of saves that never finished (their process was killed)."""
        return self._leftovers.run()


def _read(path: Path) -> Conversation:
    """The conversation in ``path``, its id taken from the file name."""
    return Conversation.from_json(json.loads(path.read_text(encoding="utf-8")), path.stem)
