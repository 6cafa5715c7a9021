"""The scrolling conversation: user turns, streamed Markdown answers, and notices/errors."""

from __future__ import annotations

from collections.abc import Sequence

from markdown_it import MarkdownIt
from textual import events
from textual.await_complete import AwaitComplete
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from localinfer.conversations import Conversation, MessageImage
from localinfer.tui.chat_images import chip
from localinfer.tui.context_marker import SummaryNote, marker_for
from localinfer.tui.thinking_block import ThinkingBlock


class UserTurn(Static):
    """What the user sent, shown as plain text (never interpreted as markup), its images'
    chips (chat_images.chip) on the line above."""

    def __init__(self, text: str, chips: Sequence[str] = ()) -> None:
        self.chips = tuple(chips)
        shown: str | Content = text
        if self.chips:
            shown = Content.assemble(("  ".join(self.chips), "bold"), "\n", text)
        super().__init__(shown, markup=False, classes="turn user-turn")


def reserve_for(widget: Widget, lines: int) -> int:
    """The blank lines ``widget`` may hold below a streaming answer's text: ``lines``, at most a
    quarter of the conversation view's height. The paragraph's and the answer's reserves stack
    below the text, and in a short terminal a full reserve pushed the line being written out of
    the view; a small view gets a small reserve (or none: a layout per new line instead)."""
    for node in widget.ancestors:
        if isinstance(node, ConversationView):
            return min(lines, node.size.height // 4)
    return lines


# Textual's paragraph block, reached through the public BLOCKS table (its module is private).
_Paragraph = Markdown.BLOCKS["paragraph_open"]


class StreamParagraph(_Paragraph):  # type: ignore[misc,valid-type]
    """A paragraph that asks for a layout only when its height changes, and that, while it is
    the streaming answer's last block, holds ``RESERVE_LINES`` blank lines to grow into.

    While an answer streams, its last paragraph gets a few more words many times a second.
    Textual's paragraph asks for a layout on every update, and a layout places every widget on
    the screen again (every block of every answer in the conversation: the cost grows with it),
    twice when sizes change (a widget whose size changed asks for another). Most updates only
    fill the paragraph's last line, and repainting the paragraph is enough for them; with the
    reserve, a new line costs a layout once per ``RESERVE_LINES`` lines instead of every line.
    """

    RESERVE_LINES = 4
    reserved = False  # min-height holds blank lines below the text (AnswerTurn releases it)

    def set_content(self, content: Content) -> None:
        self._content = content
        width, height = self.content_size
        needed = content.get_height(self.styles, width) if width else None
        if needed is not None and (needed == height or (self.reserved and needed < height)):
            self.update(content, layout=False)
            return
        if needed is not None and self._grows_in_a_stream():
            self.reserved = True
            self.styles.min_height = needed + reserve_for(self, self.RESERVE_LINES)
        self.update(content, layout=True)

    def _grows_in_a_stream(self) -> bool:
        parent = self.parent
        return isinstance(parent, AnswerTurn) and parent.streaming

    def release(self) -> None:
        """Drop the blank lines below the text (the paragraph is done growing)."""
        if self.reserved:
            self.reserved = False
            self.styles.min_height = None


class AnswerTurn(Markdown):
    """One assistant answer. While it streams, :meth:`write` takes the text that arrived since
    the last write; a :class:`MarkdownStream` merges writes that come faster than the widget can
    append them. ``Markdown.append`` re-parses only from the last block's start, so an update
    costs about the same on a long answer as on a short one; fenced code is highlighted by the
    widget. While streaming the answer holds ``RESERVE_LINES`` blank lines below its text to
    grow into (see :meth:`on_resize`). ``renders`` counts the appends (tests bound it: renders
    are coalesced, not per token).
    """

    BLOCKS = {**Markdown.BLOCKS, "paragraph_open": StreamParagraph}
    RESERVE_LINES = 4

    def __init__(self, text: str = "") -> None:
        # While it streams, one parser per answer: Markdown builds a new one per append otherwise
        # (~1 ms each). Per answer, not shared: a widget's parses are serialised by its lock, not
        # across widgets. A finished answer lets it go: it parses again only when updated, and a
        # parser is ~200 KB, one per answer of a long conversation otherwise (#39).
        self._parser: MarkdownIt | None = None
        super().__init__(text, classes="turn answer-turn", parser_factory=self._parser_now)
        self.renders = 0
        self._stream: MarkdownStream | None = None
        self._reserved = 0  # lines held for the answer to grow into while it streams

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def _parser_now(self) -> MarkdownIt:
        return self._parser or MarkdownIt("gfm-like")

    def append(self, markdown: str) -> AwaitComplete:
        self.renders += 1
        appended = super().append(markdown)

        async def then_release() -> None:
            await appended
            self._release_paragraphs(keep_last=True)

        return AwaitComplete(then_release())

    def _release_paragraphs(self, keep_last: bool) -> None:
        # Only the last block grows; one that a new block now follows gives its reserve back.
        blocks = list(self.children)
        for block in blocks[:-1] if keep_last else blocks:
            if isinstance(block, StreamParagraph):
                block.release()

    async def write(self, delta: str) -> None:
        """Append ``delta`` (never empty) soon; merged with other writes while one renders."""
        if self._stream is None:
            self._parser = MarkdownIt("gfm-like")
            self._stream = Markdown.get_stream(self)
        await self._stream.write(delta)

    async def end_stream(self) -> None:
        """Render whatever writes are still pending and stop streaming."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.stop()
        self._parser = None
        self._release_paragraphs(keep_last=False)
        if self._reserved:
            self._reserved = 0
            self.styles.min_height = None

    def on_resize(self, event: events.Resize) -> None:
        # The answer outgrew its reserve: take RESERVE_LINES more. Growth inside the reserve
        # moves nothing above the last block, so only that block repaints; the view (anchored
        # to its end) scrolls once per RESERVE_LINES lines instead of once per line.
        if self.streaming and event.size.height > self._reserved:
            self._reserved = event.size.height + reserve_for(self, self.RESERVE_LINES)
            self.styles.min_height = self._reserved

    note: str = ""  # why the answer ended early ("stopped", the token limit), shown under it


class Notice(Static):
    """A line from the app itself: an error with what to do next, or an information."""

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(text, markup=False, classes="turn notice" + (" error" if error else ""))


class ConversationView(VerticalScroll):
    """Holds the turns; keeps the newest in view while an answer streams.

    The view is anchored: while it is scrolled to the end, growing content keeps the end in view
    at layout time (no scroll call per update); scrolling up releases the anchor so the user can
    read, and scrolling back to the end takes it again.
    """

    DEFAULT_CSS = """
    ConversationView { height: 1fr; }
    """

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str, images: Sequence[MessageImage] = ()) -> UserTurn:
        turn = UserTurn(text, [chip(image) for image in images])
        self.mount(turn)
        self.scroll_end(animate=False)
        return turn

    def start_answer(self, text: str = "") -> AnswerTurn:
        turn = AnswerTurn(text)
        self.mount(turn)
        self.scroll_end(animate=False)
        return turn

    def thinking_above(self, answer: AnswerTurn) -> ThinkingBlock | None:
        """The reasoning block above ``answer``, if it has one."""
        children = list(self.children)
        at = children.index(answer) if answer in children else 0
        above = children[at - 1] if at > 0 else None
        return above if isinstance(above, ThinkingBlock) else None

    def thinking_for(self, answer: AnswerTurn) -> ThinkingBlock:
        """The reasoning block above ``answer`` (mounted on first use, streaming shown)."""
        block = self.thinking_above(answer)
        if block is None:
            block = ThinkingBlock()
            self.mount(block, before=answer)
        return block

    def thinking_blocks(self) -> list[ThinkingBlock]:
        return list(self.query(ThinkingBlock))

    def add_notice(self, text: str, *, error: bool = False) -> Notice:
        notice = Notice(text, error=error)
        self.mount(notice)
        self.scroll_end(animate=False)
        return notice

    def end_answer(self, answer: AnswerTurn, note: str) -> None:
        """Say under an answer why it ended early."""
        answer.note = note
        self.mount(Static(note, markup=False, classes="answer-note"), after=answer)

    def clear(self) -> None:
        self.remove_children()

    def show_conversation(
        self,
        conversation: Conversation,
        *,
        reasoning_shown: bool = False,
        gone: frozenset[str] = frozenset(),
    ) -> None:
        """``conversation``'s turns; a saved answer's reasoning above it, folded to one line
        unless ``reasoning_shown``; the chips of images whose key is in ``gone`` say so."""
        self.clear()
        for index, message in enumerate(conversation.messages):
            marker = marker_for(conversation, index)  # where the model's context begins (#39)
            if marker is not None:
                self.mount(marker)
            if message.role == "system":
                self.mount(SummaryNote(message.content))
            elif message.role == "user":
                chips = [chip(image, gone=image.key in gone) for image in message.images]
                self.mount(UserTurn(message.content, chips))
            elif message.role == "assistant":
                if message.reasoning:
                    block = ThinkingBlock(message.reasoning)
                    block.fold(None, None, keep_open=reasoning_shown)
                    self.mount(block)
                self.mount(AnswerTurn(message.content))
        self.scroll_end(animate=False)

    def last_answer(self) -> AnswerTurn | None:
        answers = self.query(AnswerTurn)
        return answers.last() if answers else None
