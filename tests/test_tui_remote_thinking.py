"""`localinfer chat --url` on a thinking model: the real chat app attached to a real
`localinfer serve` over Qwen3's template and a model scripted to think then answer
(tests/tui_thinking.py). The server's ``reasoning_content`` streams into the reasoning block, its
reasoning token count reaches the stats panel, and the thinking settings travel with each
request (``chat_template_kwargs``, ``thinking_budget``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localinfer.engine import Engine
from localinfer.engine.types import Request, SamplingParams
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from localinfer.tools.thinking import Thinking, thinking_prompt
from localinfer.tui.app import ChatApp
from localinfer.tui.remote_host import RemoteHost
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stats_panel import StatsPanel
from localinfer.tui.thinking_block import ThinkingBlock
from tests.test_server_scripted import ScriptedSession
from tests.tui_pilot import SIZE, StepClock
from tests.tui_thinking import ANSWER, QWEN3, THOUGHT, ask, obedient_runner


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedSession, str]]:
    model = load_model(embedded_model_path())
    model.chat_template = ChatTemplate(QWEN3.read_text(), eos_token="<|im_end|>")
    session = ScriptedSession(model)
    session.engine.close()
    session.runner = obedient_runner(model.tokenizer)
    session.engine = Engine(session.runner, model.tokenizer, prefill_chunk=4096)
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        yield session, server.url
    session.close()


def remote_app(url: str, tmp_path, **settings) -> ChatApp:
    from localinfer.conversations import ConversationStore

    base = {"temperature": 0.0, "max_tokens": 300}
    host = RemoteHost(url, ChatSettings(**{**base, **settings}))
    return ChatApp(host, ConversationStore(tmp_path), clock=StepClock())


async def test_server_reasoning_streams_into_the_block(served, tmp_path) -> None:
    session, url = served
    app = remote_app(url, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "What is 2+2?")
        assert answer.source == ANSWER
        assert app.query_one(ThinkingBlock).text == THOUGHT
        text = app.query_one(StatsPanel).answer_text
        assert "ctrl+g" in app.screen.active_bindings  # reasoning came: the key is listed
    assert app.conversation.messages[-1].reasoning == THOUGHT
    # The server's count (usage.completion_tokens_details) is the engine's for this prompt.
    prompt = thinking_prompt(session, [{"role": "user", "content": "What is 2+2?"}])
    params = SamplingParams(max_tokens=300, temperature=0.0)
    metrics = (
        session.engine.submit(Request(prompt.ids, params, reasoning=prompt.reasoning))
        .result()
        .metrics
    )
    answer_tokens = metrics.completion_tokens - metrics.reasoning_tokens
    assert f"reasoning   {metrics.reasoning_tokens} tok" in text and metrics.reasoning_tokens
    assert f"answer      {answer_tokens} tok" in text and "TTFT answer" in text


async def test_thinking_settings_travel_with_the_request(served, tmp_path) -> None:
    session, url = served
    app = remote_app(url, tmp_path, thinking=False)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "What is 2+2?")
        assert answer.source == ANSWER and not app.query(ThinkingBlock)
        assert session.runner.prompts[-1].endswith("<think>\n\n</think>\n\n")
    app = remote_app(url, tmp_path, thinking_budget=5)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "What is 2+2?")
        block = app.query_one(ThinkingBlock)
        assert 0 < len(session.model.tokenizer.encode(block.text)) <= 5
        assert answer.source == ANSWER


def test_earlier_reasoning_is_not_sent_to_the_server() -> None:
    host = RemoteHost("http://127.0.0.1:9")
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "2+2?"},
    ]
    prompt = host.prepare(messages, Thinking(enabled=False))
    assert all("reasoning_content" not in m for m in prompt.messages)
    assert prompt.thinking == Thinking(enabled=False)
    host.close()
