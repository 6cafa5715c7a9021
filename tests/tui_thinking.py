"""What the chat's thinking tests share: a model scripted to think then answer under a real
thinking template (Qwen3's, DeepSeek-R1's), which answers without thinking when the prompt
closed the reasoning block, as such a model does when its template turns thinking off. The
engine, the tokenizer (the embedded model's) and the templates are real; only the runner's
choice of token is scripted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localinfer.conversations import ConversationStore
from localinfer.engine import Engine
from localinfer.loading.chat_template import ChatTemplate
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.host import ChatHost
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from tests.test_engine_model import ScriptRunner
from tests.tui_pilot import ScriptedChatSession, StepClock, wait_until

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
QWEN3 = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
THOUGHT = "The user asks for 2+2. " * 8 + "So: 4."
ANSWER = "It is **4**."


class ObedientRunner(ScriptRunner):
    """Writes ``thinking`` (reasoning, then the answer), or ``answering`` alone after a prompt
    that closed the reasoning block; when the engine forces the closing tag (a thinking budget),
    the answer follows it. Records every prompt it is given (the part not cached). One slot."""

    def __init__(self, thinking: list[int], answering: list[int], decode: Any, **kw: Any) -> None:
        super().__init__(thinking, **kw)
        self.scripts = (thinking, answering)
        self.decode = decode
        self.prompts: list[str] = []
        self.output: list[int] = []  # the tokens fed back since the prompt

    def forward(self, batch: Sequence[Any]) -> list[Any]:
        for work in batch:
            if work.start_pos == 0 or len(work.tokens) > 1:  # a prompt (a decode feeds one)
                self.prompt_len[work.slot] = work.start_pos + len(work.tokens)
                text = self.decode(list(work.tokens))
                self.prompts.append(text)
                closed = text.rstrip().endswith("</think>")
                self.script = self.scripts[1] if closed else self.scripts[0]
                self.output = []
                continue
            self.output.extend(work.tokens)
            if self.output != self.script[: len(self.output)]:
                # Tokens the script did not write were forced (the closing tag): answer next.
                self.script = self.output + self.scripts[1]
        return super().forward(batch)


def obedient_runner(tok: Any, *, opened: bool = False) -> ObedientRunner:
    """A runner that thinks ``THOUGHT`` then answers ``ANSWER`` in ``tok``'s tokens (``opened``:
    the template opens the reasoning block in the prompt, as R1's does)."""
    thinking = f"{THOUGHT}\n</think>\n\n{ANSWER}"
    return ObedientRunner(
        tok.encode(thinking if opened else f"<think>\n{thinking}", add_special_tokens=False),
        tok.encode(ANSWER, add_special_tokens=False),
        tok.decode,
        end=next(iter(tok.eos_ids)),
        vocab_size=tok.vocab_size,
        slots=1,
        max_ctx=4096,
    )


class ThinkingSession(ScriptedChatSession):
    """A chat session on ``template`` over :func:`obedient_runner`."""

    runner: ObedientRunner

    def __init__(self, template: Path, eos_token: str, *, opened: bool = False) -> None:
        super().__init__("")
        self.engine.close()
        self.model.chat_template = ChatTemplate(template.read_text(), eos_token=eos_token)
        self.runner = obedient_runner(self.model.tokenizer, opened=opened)
        self.engine = Engine(self.runner, self.model.tokenizer, prefill_chunk=4096)

    def encode(self, text: str) -> list[int]:
        return self.model.tokenizer.encode(text, add_special_tokens=False)


def qwen3_session() -> ThinkingSession:
    return ThinkingSession(QWEN3, "<|im_end|>")


def r1_session() -> ThinkingSession:
    return ThinkingSession(R1, "<｜end▁of▁sentence｜>", opened=True)


def chat_app(session: Any, root: Path, **settings: Any) -> ChatApp:
    base = {"ctx": 4096, "slots": 1, "temperature": 0.0, "max_tokens": 500}
    host = ChatHost(ChatSettings(**{**base, **settings}), session=session)
    return ChatApp(host, ConversationStore(root), clock=StepClock())


async def ask(pilot: Any, text: str) -> AnswerTurn:
    """Send ``text`` and wait for its answer to end; the answer."""
    app = pilot.app
    await wait_until(pilot, lambda: app.host.loaded and not app.loading, 60)
    answers = len(app.query(AnswerTurn))
    prompt = app.query_one(PromptInput)
    prompt.focus()  # a clicked reasoning block holds the focus (Enter folds it)
    prompt.load_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(app.query(AnswerTurn)) > answers and not app.answering, 60)
    await app.workers.wait_for_complete()
    await pilot.pause()
    return app.query(AnswerTurn).last()
