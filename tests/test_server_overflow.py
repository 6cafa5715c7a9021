"""serve --context-overflow: a chat past the context refused (stop, the default) or answered
without its oldest whole turns (drop-oldest), saying how many, on the real embedded model."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from localinfer.server.overflow import DROPPED_HEADER, answer_room
from localinfer.session import Session, open_session
from tests.test_server_support import SHORT, client_for, make_session, serving

CTX = 256
MODEL = "smollm2-135m"


def long_chat(turns: int = 12) -> list[dict[str, str]]:
    """A system prompt, ``turns`` questions and answers of ~40 tokens each, then a question:
    several times the context."""
    messages = [{"role": "system", "content": "You answer in one short sentence."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 10})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "here it is " * 10})
    messages.append({"role": "user", "content": "What is the capital of France?"})
    return messages


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    s = make_session(slots=2, ctx=CTX)
    yield s
    s.close()


def test_stop_is_the_default_and_refuses_a_chat_past_the_context(session: Session) -> None:
    with serving(session) as server, pytest.raises(openai.BadRequestError) as caught:
        client_for(server).chat.completions.create(
            model=MODEL, messages=long_chat(), max_tokens=SHORT
        )
    assert caught.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_drop_oldest_answers_with_the_newest_whole_turns_and_says_so(
    session: Session, stream: bool
) -> None:
    messages = long_chat()
    with serving(session, context_overflow="drop-oldest") as server:
        client = client_for(server)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=SHORT,
            temperature=0,
            stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        dropped = int(raw.headers[DROPPED_HEADER])
        reply = raw.parse()
        if stream:
            chunks = list(reply)
            usage = chunks[-1].usage
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            usage, text = reply.usage, reply.choices[0].message.content
    # Whole turns (a question and its answer) go, oldest first; the system prompt and the
    # question stay, and the prompt leaves the answer its room.
    assert dropped > 0 and dropped % 2 == 0 and dropped < len(messages) - 2
    assert usage.model_extra["dropped_messages"] == dropped
    assert usage.prompt_tokens <= CTX - answer_room(CTX, SHORT)
    assert usage.completion_tokens == SHORT and text
    # The same answer as the kept messages sent as they are, under stop.
    kept = [messages[0], *messages[1 + dropped :]]
    with serving(session) as server:
        plain = client_for(server).chat.completions.create(
            model=MODEL, messages=kept, max_tokens=SHORT, temperature=0
        )
    assert plain.usage.prompt_tokens == usage.prompt_tokens
    assert plain.choices[0].message.content == text


def test_drop_oldest_on_anthropic_messages_and_a_question_too_long_alone(
    session: Session,
) -> None:
    messages = long_chat()
    with serving(session, context_overflow="drop-oldest") as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        raw = claude.messages.with_raw_response.create(
            model=MODEL,
            system=messages[0]["content"],
            messages=messages[1:],  # type: ignore[arg-type]
            max_tokens=SHORT,
        )
        assert int(raw.headers[DROPPED_HEADER]) > 0
        assert raw.parse().content[0].text
        too_long = [*messages[:-1], {"role": "user", "content": "word " * (CTX + 10)}]
        with pytest.raises(openai.BadRequestError) as caught:
            client_for(server).chat.completions.create(
                model=MODEL, messages=too_long, max_tokens=SHORT
            )
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert "the system prompt and the last message alone" in error["message"]


def test_with_cache_reuse_a_cut_keeps_the_kept_turns_kv() -> None:
    """The conversation grows by a turn and the cut moves: the turns kept in both requests were
    computed for the first and are moved (chunk reuse), not prefilled again."""
    s = open_session(
        None, backend="torch", slots=1, ctx=CTX, threads=1, prefix_reuse=True, cache_reuse=16
    )
    messages = long_chat()
    try:
        with serving(s, context_overflow="drop-oldest") as server:
            client = client_for(server)
            first = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=SHORT, temperature=0
            )
            more = long_chat(14)[-5:-1]  # two more long turns: the cut moves
            grown = [*messages[:-1], *more, messages[-1]]
            second = client.chat.completions.create(
                model=MODEL, messages=grown, max_tokens=SHORT, temperature=0
            )
    finally:
        s.close()
    assert (
        second.usage.model_extra["dropped_messages"] > first.usage.model_extra["dropped_messages"]
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > second.usage.prompt_tokens // 3, second.usage
