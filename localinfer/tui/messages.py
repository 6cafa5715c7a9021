"""Messages workers post to the app: workers never touch widgets; handlers run on the UI thread."""

from __future__ import annotations

from textual.message import Message

from localinfer.conversations import ConversationSummary
from localinfer.tui.host import MemoryFigures, ModelChoice
from localinfer.tui.stream_pump import AnswerProgress


class AnswerProgressed(Message):
    """More of the answer arrived. Carries the whole text so far, so a queued one may be dropped."""

    def __init__(self, progress: AnswerProgress) -> None:
        super().__init__()
        self.progress = progress

    def can_replace(self, message: Message) -> bool:
        return (
            isinstance(message, AnswerProgressed)
            and message.progress.request_id == self.progress.request_id
        )


class AnswerFinished(Message):
    """The answer ended (stop, length, abort or an engine-side error)."""

    def __init__(self, progress: AnswerProgress) -> None:
        super().__init__()
        self.progress = progress


class AnswerRejected(Message):
    """The request never started: context overflow, bad parameter, full queue..."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ModelLoaded(Message):
    def __init__(self, description: str, notice: str | None) -> None:
        super().__init__()
        self.description = description
        self.notice = notice


class ModelLoadFailed(Message):
    def __init__(self, error: str, hint: str, still_loaded: bool) -> None:
        super().__init__()
        self.error = error
        self.hint = hint  # what the user can do next
        self.still_loaded = still_loaded  # the previous model was restored


class ModelChoicesReady(Message):
    def __init__(self, choices: list[ModelChoice], ctx: int) -> None:
        super().__init__()
        self.choices = choices
        self.ctx = ctx


class MemoryMeasured(Message):
    def __init__(self, figures: MemoryFigures) -> None:
        super().__init__()
        self.figures = figures


class ConversationsListed(Message):
    def __init__(self, summaries: list[ConversationSummary]) -> None:
        super().__init__()
        self.summaries = summaries
