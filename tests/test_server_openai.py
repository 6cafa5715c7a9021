# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""The official `openai` client against a real server on the embedded model.

References come from the same engine called directly (``engine.generate``), so each test checks
that the HTTP layer passes prompts, parameters and results through unchanged.
"""

from __future__ import annotations

import json

import httpx
import openai

from localinfer.engine import Request, SamplingParams
from localinfer.server import ServerThread
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    SHORT,
    client,
    model_name,
    server,
    session,
    sse_lines,
)

QUESTION = [{"role": "user", "content": "Name three colours."}]
# A stream whose last chunk carries the usage.
WITH_USAGE = {"stream": True, "stream_options": {"include_usage": True}}


def direct(session: Session, messages: list[dict], **params: object) -> tuple[str, int]:
    """Greedy answer and token count straight from the engine."""
    ids = session.chat_prompt_ids(messages)
    params = {"max_tokens": SHORT, "temperature": 0.0, **params}
    result = session.engine.generate(Request(ids, SamplingParams(**params)))
    return result.text, len(result.token_ids)


def test_models_and_health(client: openai.OpenAI, server: ServerThread, model_name: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_chat_non_streaming_matches_the_engine(
    client: openai.OpenAI, session: Session, model_name: str
) -> None:
    want, n_tokens = direct(session, QUESTION)
    reply = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=SHORT, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == want
    assert choice.finish_reason in ("stop", "length")
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.usage.prompt_tokens == len(session.chat_prompt_ids(QUESTION))
    assert reply.usage.completion_tokens == n_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + n_tokens
    timings = reply.model_extra["timings"]
    # The same prompt just ran in the engine, and the session reuses cached prefixes.
    cached = reply.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < reply.usage.prompt_tokens
    assert timings["cached_tokens"] == cached
    assert timings["ttft_ms"] > 0 and timings["completion_tokens"] == n_tokens
    assert set(timings) >= {"tpot_ms", "prompt_tokens_per_second", "decode_tokens_per_second"}


def test_max_completion_tokens_and_text_parts(
    client: openai.OpenAI, session: Session, model_name: str
) -> None:
    want, _ = direct(session, QUESTION, max_tokens=3)
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Name three "},
                {"type": "text", "text": "colours."},
            ],
        }
    ]
    reply = client.chat.completions.create(
        model=model_name, messages=parts, max_completion_tokens=3, temperature=0
    )
    assert reply.choices[0].message.content == want
    assert reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"


def test_chat_streaming_chunks_and_usage(
    client: openai.OpenAI, session: Session, model_name: str
) -> None:
    want, n_tokens = direct(session, QUESTION)
    stream = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=SHORT, temperature=0, **WITH_USAGE
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    *content, finish, usage = chunks
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text == want
    assert all(c.choices[0].finish_reason is None for c in content)
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert finish.model_extra["timings"]["completion_tokens"] == n_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert usage.choices == []
    assert usage.usage.completion_tokens == n_tokens
    assert usage.usage.prompt_tokens == len(session.chat_prompt_ids(QUESTION))


def test_raw_stream_ends_with_done(server: ServerThread, model_name: str) -> None:
    body = {
        "model": model_name,
        "messages": QUESTION,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = sse_lines(r)
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[-2])["choices"][0]["finish_reason"] == "length"
    assert "usage" not in json.loads(payloads[0])  # only with stream_options.include_usage


def test_completions_streaming_and_not(
    client: openai.OpenAI, session: Session, model_name: str
) -> None:
    prompt = "The capital of France is"
    ids = session.raw_prompt_ids(prompt)
    want = session.engine.generate(
        Request(ids, SamplingParams(max_tokens=SHORT, temperature=0.0))
    ).text
    reply = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=SHORT, temperature=0
    )
    assert reply.object == "text_completion"
    assert reply.choices[0].text == want
    assert reply.usage.prompt_tokens == len(ids)
    stream = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=SHORT, temperature=0, **WITH_USAGE
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    echoed = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=SHORT, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompt + want
    by_ids = client.completions.create(
        model=model_name, prompt=ids, max_tokens=SHORT, temperature=0
    )
    assert by_ids.choices[0].text == want
    echoed_ids = client.completions.create(
        model=model_name, prompt=ids, max_tokens=SHORT, temperature=0, echo=True
    )
    assert echoed_ids.choices[0].text == session.tokenizer.decode(ids) + want
    default_length = client.completions.create(
        model=model_name, prompt=prompt, temperature=0, extra_body={"ignore_eos": True}
    )
    assert default_length.usage.completion_tokens == 16  # OpenAI's completions default


def test_stop_strings(client: openai.OpenAI, session: Session, model_name: str) -> None:
    full, _ = direct(session, QUESTION, max_tokens=16)
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]  # cut the answer inside, at the third word
    want = full[: full.index(stop)]
    for stops in (stop, ["@@never@@", stop]):
        reply = client.chat.completions.create(
            model=model_name, messages=QUESTION, max_tokens=16, temperature=0, stop=stops
        )
        assert reply.choices[0].message.content == want
        assert reply.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproduces_sampling(client: openai.OpenAI, model_name: str) -> None:
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Write a word."}],
            max_tokens=SHORT,
            temperature=1.5,
            seed=seed,
        )
        return reply.choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(s) for s in (1, 2, 3)}
    assert others != {first}  # different seeds really sample


def test_chat_logprobs(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy picks the most likely token
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True
        )
        assert bytes(t.bytes).decode("utf-8", errors="replace") == t.token
    plain = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=4, temperature=0
    )
    assert plain.choices[0].logprobs is None

    stream = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=1, stream=True,
    )  # fmt: skip
    streamed = [
        t
        for c in stream
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_completion_logprobs(client: openai.OpenAI, model_name: str) -> None:
    reply = client.completions.create(
        model=model_name, prompt="One, two, three,", max_tokens=4, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2
        assert max(top.values()) == top[token] == logprob
