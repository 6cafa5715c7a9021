"""Messages workers post to the app: workers never touch widgets; handlers run on the UI thread.

Textual messages may be dataclasses (``Message.__post_init__`` sets up the base).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from localinfer.conversations import ConversationListing
from localinfer.engine.types import EngineMetrics
from localinfer.tui.host import MemoryFigures, ModelChoice
from localinfer.tui.live_stats import StatsSnapshot
from localinfer.tui.stream_pump import AnswerEnd


@dataclass
class AnswerDelta(Message):
    """The text that arrived since the previous delta (a few tokens); appended as it is."""

    request_id: str
    text: str


@dataclass
class ReasoningDelta(Message):
    """A thinking model's reasoning since the previous delta (shown apart from the answer)."""

    request_id: str
    text: str


@dataclass
class AnswerStatsUpdated(Message):
    """The answer's live figures; a queued one is stale once a newer one comes."""

    request_id: str
    stats: StatsSnapshot
    engine: EngineMetrics | None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, AnswerStatsUpdated) and message.request_id == self.request_id


@dataclass
class AnswerFinished(Message):
    """The answer ended (stop, length, abort or an engine-side error)."""

    end: AnswerEnd


@dataclass
class AnswerRejected(Message):
    """The request never started: context overflow, bad parameter, full queue, no server..."""

    error: str
    hint: str | None = None  # what to do next, when the failure knows better than the default


@dataclass
class ModelLoaded(Message):
    description: str
    notice: str | None


@dataclass
class ModelLoadFailed(Message):
    error: str
    hint: str  # what the user can do next
    still_loaded: bool  # the previous model was restored


@dataclass
class ModelChoicesReady(Message):
    choices: list[ModelChoice]
    ctx: int


@dataclass
class MemoryMeasured(Message):
    figures: MemoryFigures


@dataclass
class ConversationsListed(Message):
    listing: ConversationListing
