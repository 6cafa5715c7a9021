"""The messages of a chat completion request, told apart by role so that /openapi.json says what
each role's message holds: content for system, developer, user and tool messages, the id of the
call a tool message answers, and an assistant's calls in OpenAI's shape.

``localinfer.tools.template_messages`` then checks the history as a whole (a tool message must
answer an earlier call; a call's arguments must be a JSON object) and turns it into what the chat
template expects, naming the field a malformed history gets wrong.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from localinfer.engine.images import IMAGE_MARKER


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Part):
    """One text element of an array ``content``."""

    type: Literal["text"]
    text: str


class ImageURL(_Part):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector sets the size


class ImagePart(_Part):
    """An image in a system, developer or user message: a ``data:`` URL or bare base64. Remote
    URLs are refused, unless the server runs with ``--allow-image-urls`` (image_fetch.py)."""

    type: Literal["image_url"]
    image_url: ImageURL


InputPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class CalledFunction(_Part):
    name: str = Field(min_length=1)
    # The arguments as a JSON object's text ("" for none, as some clients send it) or as the
    # object: template_messages reads both.
    arguments: str | dict[str, Any]


class ToolCall(_Part):
    """A call an assistant turn made, as OpenAI's answers carry it."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: CalledFunction


class _Message(_Part):
    """What every message of a chat history has."""

    content: str | list[TextPart] | list[InputPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The text; an image part stands as the image marker (engine/images.py)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else IMAGE_MARKER for p in self.content)

    def image_urls(self) -> list[tuple[int, str]]:
        """The images' (part index, url), in order."""
        if not isinstance(self.content, list):
            return []
        parts = enumerate(self.content)
        return [(i, p.image_url.url) for i, p in parts if isinstance(p, ImagePart)]

    def as_openai(self) -> dict[str, Any]:
        """The message as an OpenAI client sent it (text parts joined, absent fields left out)."""
        message: dict[str, Any] = self.model_dump(exclude_none=True, exclude={"content"})
        if self.content is not None:
            message["content"] = self.text()
        return message


class InputMessage(_Message):
    """A system, developer or user message: it has content. "developer" is OpenAI's newer name
    for the system role (o1 and later)."""

    role: Literal["system", "developer", "user"]
    content: str | list[InputPart]


class ToolMessage(_Message):
    """A tool's result: its content, and the id of the call it answers."""

    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(min_length=1)


class AssistantMessage(_Message):
    """An assistant's turn: its text, its calls of tools, or both."""

    role: Literal["assistant"]
    tool_calls: list[ToolCall] | None = None
    # A thinking model's reasoning in that turn (the name llama-server and vLLM read back): the
    # chat template keeps or drops it.
    reasoning_content: str | None = None


# One message of a chat history, told apart by its role (so the document says what each holds).
ChatMessage = Annotated[InputMessage | ToolMessage | AssistantMessage, Field(discriminator="role")]
