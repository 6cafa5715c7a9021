# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Fill-in-the-middle over HTTP (#21): the requests Continue sends, against a real server with a
tiny random model whose vocabulary has Qwen's FIM tokens.

* ``/v1/completions`` with ``prompt`` + ``suffix`` (Continue's OpenAI-compatible providers), sent
  with the official ``openai`` client, whole and streamed;
* ``/v1/fim/completions`` (Mistral's FIM API, Continue's ``fim/completions``), sent as Continue
  sends it with httpx, answered as chat completions, whole and streamed;

each equal to the engine's own greedy answer on the same ``fim_prompt_ids``. Two growing requests
share the prompt's beginning in the prefix cache, and a model without FIM tokens (the embedded
SmolLM2) is a 404 naming a catalog model that has them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from localinfer.engine import Request, SamplingParams
from localinfer.fim import FIM_EXAMPLE_MODEL, fim_prompt_ids, fim_stop_ids
from localinfer.server import ServerThread
from localinfer.server.capability import CODE
from localinfer.session import Session, open_session
from tests.test_fim import PREFIX, SUFFIX, write_fim_model
from tests.test_server_support import (  # noqa: F401 - fixtures: the embedded model's server
    client_for,
    server,
    serving,
    session,
    sse_lines,
)

MAX = 12
# Continue's stop words for Qwen-Coder templates, and a text one ("\n\n": end of a block).
CONTINUE_STOP = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>",
                 "\n\n"]  # fmt: skip


@pytest.fixture(scope="module")
def fim_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = write_fim_model(tmp_path_factory.mktemp("fim") / "tiny-fim")
    s = open_session(str(root), slots=2, ctx=1024, threads=1, prefix_reuse=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def fim_server(fim_session: Session) -> Iterator[ServerThread]:
    with serving(fim_session) as srv:
        yield srv


def direct(session: Session, prefix: str, suffix: str, stop: tuple[str, ...] = ()) -> object:
    """The engine's greedy answer on the FIM prompt, with the format's stop tokens."""
    tok = session.tokenizer
    params = SamplingParams(max_tokens=MAX, stop=stop, stop_token_ids=fim_stop_ids(tok))
    return session.engine.generate(Request(fim_prompt_ids(tok, prefix, suffix), params))


def test_completions_with_suffix_as_the_openai_client_sends_it(
    fim_session: Session, fim_server: ServerThread
) -> None:
    want = direct(fim_session, PREFIX, SUFFIX)
    client = client_for(fim_server)
    name = fim_session.model.name
    reply = client.completions.create(
        model=name, prompt=PREFIX, suffix=SUFFIX, max_tokens=MAX, temperature=0
    )
    choice = reply.choices[0]
    assert (choice.text, choice.finish_reason) == (want.text, want.finish_reason)
    n_prompt = len(fim_prompt_ids(fim_session.tokenizer, PREFIX, SUFFIX))
    assert reply.usage.prompt_tokens == n_prompt
    assert reply.usage.completion_tokens == len(want.token_ids)
    stream = client.completions.create(
        model=name, prompt=PREFIX, suffix=SUFFIX, max_tokens=MAX, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def continue_body(model: str, prefix: str, suffix: str, stream: bool) -> dict:
    """What Continue's OpenAI adapter posts to ``fim/completions`` (fimStream)."""
    return {
        "model": model,
        "prompt": prefix,
        "suffix": suffix,
        "max_tokens": MAX,
        "temperature": 0,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "stop": CONTINUE_STOP,
        "stream": stream,
    }


def test_fim_route_answers_continue_like_mistral(
    fim_session: Session, fim_server: ServerThread
) -> None:
    want = direct(fim_session, PREFIX, SUFFIX, stop=tuple(CONTINUE_STOP))
    url = fim_server.url + "/v1/fim/completions"
    name = fim_session.model.name
    with httpx.stream("POST", url, json=continue_body(name, PREFIX, SUFFIX, True)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        payloads = sse_lines(r)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    # Continue yields chunk.choices[0].delta.content of every chunk
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == want.finish_reason
    whole = httpx.post(url, json=continue_body(name, PREFIX, SUFFIX, False), timeout=120).json()
    assert whole["object"] == "chat.completion"
    message = whole["choices"][0]["message"]
    assert (message["role"], message["content"]) == ("assistant", want.text)
    assert whole["choices"][0]["finish_reason"] == want.finish_reason
    n_prompt = len(fim_prompt_ids(fim_session.tokenizer, PREFIX, SUFFIX))
    assert whole["usage"]["prompt_tokens"] == n_prompt


def test_a_prompt_without_suffix_is_a_fim_request_at_the_end(
    fim_session: Session, fim_server: ServerThread
) -> None:
    want = direct(fim_session, PREFIX, "")
    body = {"prompt": PREFIX, "max_tokens": MAX, "temperature": 0, "random_seed": 7}
    reply = httpx.post(fim_server.url + "/v1/fim/completions", json=body, timeout=120).json()
    assert reply["choices"][0]["message"]["content"] == want.text
    n_prompt = len(fim_prompt_ids(fim_session.tokenizer, PREFIX, ""))
    assert reply["usage"]["prompt_tokens"] == n_prompt
    client = client_for(fim_server)
    text = client.completions.create(
        model=fim_session.model.name, prompt=PREFIX, suffix="", max_tokens=MAX, temperature=0
    )
    assert text.choices[0].text == want.text and text.usage.prompt_tokens == n_prompt


def test_growing_requests_reuse_the_cached_prefix(
    fim_session: Session, fim_server: ServerThread
) -> None:
    # A user typing: the text above the cursor grows by a line, the text below stays.
    lines = [f"    total = total + {i}  # step {i}\n" for i in range(12)]
    before = "def steps(total):\n" + "".join(lines[:8])
    after = before + lines[8]
    client = client_for(fim_server)
    usages = []
    for prefix in (before, after):
        reply = client.completions.create(
            model=fim_session.model.name, prompt=prefix, suffix=SUFFIX, max_tokens=2, temperature=0
        )
        usages.append(reply.usage)
    first, second = (fim_prompt_ids(fim_session.tokenizer, p, SUFFIX) for p in (before, after))
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    cached = usages[1].prompt_tokens_details.cached_tokens
    assert usages[1].prompt_tokens == len(second)
    # the marker and the prefix typed so far (but a token the new line merges with)
    assert cached == shared >= len(fim_session.tokenizer.encode(before))


def test_fim_errors_name_their_field(fim_session: Session, fim_server: ServerThread) -> None:
    url = fim_server.url
    reply = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "suffix": "x"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"
    assert "needs the prompt as text" in reply.json()["error"]["message"]
    reply = httpx.post(url + "/v1/fim/completions", json={"suffix": "x"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"


def test_a_model_without_fim_tokens_is_a_404_naming_one_with_them(server: ServerThread) -> None:
    """As OpenAI answers a model that does not serve an endpoint: 404, naming the model, what
    it lacks and a model that has it (the body is fine: a FIM model would answer it)."""
    client = client_for(server)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="smollm2-135m", prompt="def f(", suffix=")", max_tokens=4)
    error = caught.value.body
    assert isinstance(error, dict) and (error["param"], error["code"]) == ("model", CODE)
    assert error["message"].startswith("model 'smollm2-135m' cannot fill in the middle: its vocab")
    assert FIM_EXAMPLE_MODEL in error["message"]
    reply = httpx.post(server.url + "/v1/fim/completions", json={"prompt": "def f(", "suffix": ""})
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "model"
    assert FIM_EXAMPLE_MODEL in reply.json()["error"]["message"]


def test_the_fim_route_is_in_the_openapi_schema(fim_server: ServerThread) -> None:
    schema = httpx.get(fim_server.url + "/openapi.json").json()
    route = schema["paths"]["/v1/fim/completions"]["post"]
    ref = route["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert {"prompt", "suffix", "max_tokens", "stop", "stream"} <= set(body["properties"])
    assert body["required"] == ["prompt"]
    completion = schema["components"]["schemas"]["CompletionRequest"]
    assert "suffix" in completion["properties"]
