# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Bad requests get OpenAI-shaped 4xx errors, never a 5xx, and never stop the server."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import openai
import pytest

from localinfer.server import ServerThread
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures
    client,
    client_for,
    model_name,
    server,
    serving,
    session,
    wait_idle,
)

MSG = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": MSG, "max_tokens": 1, **fields}


# (name, raw body or JSON-able body) for POST /v1/chat/completions: each must get a 400.
BAD_CHAT: list[tuple[str, Any]] = [
    ("not json", b"{bad"),
    ("empty body", b""),
    ("truncated json", b'{"messages": [{"role": "user", "content": "Hi"}'),
    (
        "nan literal temperature",
        b'{"messages": [{"role":"user","content":"Hi"}], "temperature": NaN}',
    ),
    ("json array", []),
    ("json string", "hello"),
    ("no messages", {}),
    ("empty messages", {"messages": []}),
    ("messages not a list", {"messages": "Hi"}),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("tool role", {"messages": [{"role": "tool", "content": "x"}]}),
    ("no role", {"messages": [{"content": "x"}]}),
    ("no content", {"messages": [{"role": "user"}]}),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}),
    (
        "image part",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ]
        },
    ),
    ("part without text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ("message not an object", {"messages": ["Hi"]}),
    ("temperature negative", chat(temperature=-1)),
    ("temperature too high", chat(temperature=3)),
    ("temperature a word", chat(temperature="hot")),
    ("top_p zero", chat(top_p=0)),
    ("top_p above one", chat(top_p=1.5)),
    ("top_k negative", chat(top_k=-1)),
    ("min_p above one", chat(min_p=2)),
    ("max_tokens zero", chat(max_tokens=0)),
    ("max_tokens a string", chat(max_tokens="10")),
    ("max_tokens a float", chat(max_tokens=1.5)),
    ("max_completion_tokens negative", chat(max_completion_tokens=-3)),
    ("n two", chat(n=2)),
    ("n zero", chat(n=0)),
    ("stop a number", chat(stop=5)),
    ("stop list of numbers", chat(stop=[1])),
    ("too many stops", chat(stop=[str(i) for i in range(20)])),
    ("presence_penalty high", chat(presence_penalty=3)),
    ("frequency_penalty low", chat(frequency_penalty=-3)),
    ("repetition_penalty zero", chat(repetition_penalty=0)),
    ("seed a string", chat(seed="x")),
    ("seed a float", chat(seed=1.5)),
    ("seed beyond int64", chat(seed=2**70)),
    ("logprobs a string", chat(logprobs="yes")),
    ("top_logprobs too many", chat(logprobs=True, top_logprobs=21)),
    ("top_logprobs without logprobs", chat(top_logprobs=2)),
    ("stream a string", chat(stream="yes")),
    ("include_usage a string", chat(stream=True, stream_options={"include_usage": "x"})),
    ("response_format unknown type", chat(response_format={"type": "yaml"})),
    (
        "response_format schema not an object",
        chat(response_format={"type": "json_schema", "json_schema": {"schema": 3}}),
    ),
    ("required tool call without tools", chat(tool_choice="required")),
    ("tool named wrongly", chat(tools=[{"type": "function", "function": {"name": "a b"}}])),
    (
        "tool message answering nothing",
        chat(messages=[{"role": "tool", "tool_call_id": "x", "content": "1"}]),
    ),
    ("model a number", chat(model=123)),
    ("logit_bias", chat(logit_bias={"2": -100})),
    ("logit_bias not a map", chat(logit_bias=[1])),
]

BAD_COMPLETION: list[tuple[str, Any]] = [
    ("no prompt", {"max_tokens": 1}),
    ("prompt a number", {"prompt": 5}),
    ("prompt an object", {"prompt": {"text": "x"}}),
    ("empty prompt", {"prompt": ""}),
    ("empty prompt list", {"prompt": []}),
    ("two prompts", {"prompt": ["a", "b"]}),
    ("mixed token list", {"prompt": [[1, "a"]]}),
    ("negative token id", {"prompt": [-1]}),
    ("token id beyond vocab", {"prompt": [10**9]}),
    ("logprobs too many", {"prompt": "a", "logprobs": 6}),
    ("best_of two", {"prompt": "a", "best_of": 2}),
    ("token ids with a suffix", {"prompt": [1, 2], "suffix": "b"}),
    # echo decodes the prompt before the engine checks it: a huge id was a 500 (tokenizer overflow)
    ("echo of a token id beyond vocab", {"prompt": [10**12], "echo": True}),
    ("n a float", {"prompt": "a", "n": 2.0}),
    ("echo with logprobs", {"prompt": "a", "echo": True, "logprobs": 1}),
    ("max_tokens negative", {"prompt": "a", "max_tokens": -1}),
]


def post(server: ServerThread, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        server.url + path,
        content=content,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize(("name", "body"), BAD_CHAT, ids=[n for n, _ in BAD_CHAT])
def test_bad_chat_bodies_get_400(server: ServerThread, name: str, body: Any) -> None:
    err = assert_openai_error(post(server, "/v1/chat/completions", body), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("name", "body"), BAD_COMPLETION, ids=[n for n, _ in BAD_COMPLETION])
def test_bad_completion_bodies_get_400(server: ServerThread, name: str, body: Any) -> None:
    assert_openai_error(post(server, "/v1/completions", body), 400)


def test_validation_errors_name_the_parameter(server: ServerThread) -> None:
    err = assert_openai_error(post(server, "/v1/chat/completions", chat(top_p=7)), 400)
    assert err["param"] == "top_p" and "top_p" in err["message"]
    err = assert_openai_error(post(server, "/v1/chat/completions", chat(n=3)), 400)
    assert err["param"] == "n"


def test_unknown_model_is_404(client: openai.OpenAI, server: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-17", messages=MSG, max_tokens=1)
    assert caught.value.body["code"] == "model_not_found"
    err = assert_openai_error(httpx.get(server.url + "/v1/models/gpt-17"), 404)
    assert err["code"] == "model_not_found"


def test_wrong_route_and_method(server: ServerThread) -> None:
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(server.url + "/v1/chat/completions"), 405)


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_is_400_never_truncated(
    client: openai.OpenAI, session: Session, model_name: str, stream: bool
) -> None:
    long_text = "word " * (session.engine.max_ctx + 10)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": long_text}], stream=stream
        )
    assert caught.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model_name, prompt=long_text, max_tokens=1)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert str(session.engine.max_ctx) in caught.value.body["message"]


def test_mutated_bodies_never_get_5xx(server: ServerThread, session: Session) -> None:
    """A seeded fuzz: a valid body with one field replaced by an arbitrary JSON value. Valid
    results (2xx) are fine; anything else must be a 4xx in OpenAI's shape."""
    rng = random.Random(20261130)
    values: list[Any] = [
        None,
        True,
        False,
        0,
        -1,
        1,
        2**31,
        -(2**63),
        2**80,
        0.5,
        -0.0,
        1e308,
        -1e308,
        "",
        "x",
        "\u0000",
        "🙂" * 3,
        [],
        [None],
        ["a", 1],
        {},
        {"a": {"b": []}},
        [[1]],
        [{"type": "text"}],
    ]
    fields = [
        "messages",
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "seed",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "max_completion_tokens",
        "tools",
        "response_format",
        "prompt",
    ]
    for _ in range(60):
        path = rng.choice(["/v1/chat/completions", "/v1/completions"])
        body: dict[str, Any] = {"messages": MSG, "prompt": "Hi", "max_tokens": 1}
        for _ in range(rng.randint(1, 2)):
            body[rng.choice(fields)] = rng.choice(values)
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > 2:
                body[key] = 2  # keep valid answers short: this test is about errors
        # A null or float max_tokens (1e308) is valid and would answer to the context's end: on
        # chat max_completion_tokens wins over it, and max_tokens is still parsed as fuzzed.
        unbounded = body["max_tokens"] is None or isinstance(body["max_tokens"], float)
        if unbounded and path == "/v1/chat/completions" and "max_completion_tokens" not in body:
            body["max_completion_tokens"] = 2
        r = post(server, path, body)
        assert r.status_code < 500, (body, r.status_code, r.text)
        if r.status_code >= 400:
            assert_openai_error(r, r.status_code)
    wait_idle(session)


def test_api_key(session: Session, model_name: str) -> None:
    with serving(session, api_key="s3cret") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.get(srv.url + "/v1/models", headers=headers)
            err = assert_openai_error(r, 401)
            assert err["code"] == "invalid_api_key"
        # Auth comes before parsing: a bad body without a key is still a 401.
        assert post(srv, "/v1/chat/completions", b"{bad").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key
        good = client_for(srv, api_key="s3cret")
        assert [m.id for m in good.models.list().data] == [model_name]
        with pytest.raises(openai.AuthenticationError):
            client_for(srv, api_key="nope").models.list()


def test_cors_preflight(session: Session) -> None:
    with serving(session, cors_origins=["http://localhost:3000"], api_key="k") as srv:
        r = httpx.options(
            srv.url + "/v1/chat/completions",
            headers={
                "Origin": "http://localhost:3000",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = httpx.options(
            srv.url + "/v1/chat/completions",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in r.headers


def test_server_still_serves_after_all_that(
    client: openai.OpenAI, server: ServerThread, model_name: str
) -> None:
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    reply = client.chat.completions.create(
        model=model_name, messages=MSG, max_tokens=2, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    metrics = httpx.get(server.url + "/metrics").text
    assert 'localinfer_http_errors_total{status="400",code="invalid_request"}' in metrics
