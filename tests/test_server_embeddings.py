# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""/v1/embeddings with the official openai client against a real server on the embedded model:
every input form, float and base64 (the SDK's default, decoded by the SDK), usage, shortened
vectors, the errors (more dimensions than the model's, empty, too many, too long), the schema,
and a stream that keeps its tokens while embeddings are served."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import openai
import pytest

from localinfer.server import ServerThread
from localinfer.server.embedding_routes import MAX_INPUTS
from localinfer.session import Session
from tests.test_server_support import (  # noqa: F401 - fixtures: the embedded model's server
    client,
    model_name,
    server,
    session,
)

TEXTS = ["The cat sat on the mat.", "A dog lay on the rug.", "Stock markets fell today."]


def vectors_of(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_each_input_form(client: openai.OpenAI, session: Session, model_name: str) -> None:
    expected = session.embed(TEXTS).vectors
    ids = [session.raw_prompt_ids(t) for t in TEXTS]
    one = client.embeddings.create(model=model_name, input=TEXTS[0])
    many = client.embeddings.create(model=model_name, input=TEXTS)
    one_ids = client.embeddings.create(model=model_name, input=ids[1])
    many_ids = client.embeddings.create(model=model_name, input=ids)
    assert one.object == "list" and one.model == model_name
    assert [d.index for d in many.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in many.data)
    np.testing.assert_allclose(vectors_of(one)[0], expected[0], atol=1e-6)
    np.testing.assert_allclose(vectors_of(many), expected, atol=1e-6)
    np.testing.assert_allclose(vectors_of(one_ids)[0], expected[1], atol=1e-6)
    np.testing.assert_allclose(vectors_of(many_ids), expected, atol=1e-6)
    counts = [len(x) for x in ids]
    assert (one.usage.prompt_tokens, one.usage.total_tokens) == (counts[0], counts[0])
    assert many.usage.prompt_tokens == many.usage.total_tokens == sum(counts)
    assert many_ids.usage.prompt_tokens == sum(counts)


def test_float_and_base64_agree(client: openai.OpenAI, model_name: str) -> None:
    # No encoding_format: the SDK asks for base64 and decodes it itself.
    decoded = vectors_of(client.embeddings.create(model=model_name, input=TEXTS))
    floats = vectors_of(
        client.embeddings.create(model=model_name, input=TEXTS, encoding_format="float")
    )
    raw = client.embeddings.create(model=model_name, input=TEXTS, encoding_format="base64")
    mine = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in raw.data])
    assert floats.shape == (3, 576)
    np.testing.assert_array_equal(decoded, floats)
    np.testing.assert_array_equal(mine, floats)
    np.testing.assert_allclose(np.linalg.norm(floats, axis=1), 1.0, rtol=1e-5)


def test_dimensions_shorten_as_openai_does(client: openai.OpenAI, model_name: str) -> None:
    """Any length up to the width: the first components, renormalised to unit length, as
    OpenAI's text-embedding-3 models give them (the embedded model declares no Matryoshka)."""
    full = vectors_of(client.embeddings.create(model=model_name, input=TEXTS))
    for n in (1, 64, 575):
        cut = vectors_of(client.embeddings.create(model=model_name, input=TEXTS, dimensions=n))
        assert cut.shape == (3, n)
        np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-5)
        head = full[:, :n] / np.linalg.norm(full[:, :n], axis=1, keepdims=True)
        np.testing.assert_allclose(cut, head, atol=1e-5)
    # Its own full length shortens nothing; a JSON Schema integer may be written 64.0.
    same = client.embeddings.create(model=model_name, input=TEXTS, dimensions=576)
    np.testing.assert_array_equal(vectors_of(same), full)
    reply = httpx.post(
        str(client.base_url) + "embeddings",
        json={"model": model_name, "input": TEXTS[0], "dimensions": 64.0},
    )
    assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 64


def test_more_dimensions_than_the_model_has_is_a_404(
    client: openai.OpenAI, model_name: str
) -> None:
    """No vector of that length exists for this model (another may be wider): the model
    cannot give it, as a model without FIM tokens cannot fill in the middle."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model=model_name, input="x", dimensions=577)
    body = caught.value.body
    assert (body["param"], body["code"]) == ("dimensions", "unsupported_model")
    assert body["message"].startswith(f"model '{model_name}' cannot give vectors that long")
    assert "577 is more than the 576 dimensions" in body["message"]


@pytest.mark.parametrize(
    ("given", "message", "code"),
    [
        ([], "input: empty", "invalid_parameter"),
        (["ok", ""], "input[1]: empty", "invalid_parameter"),
        ([[1, 2], []], "input[1]: empty", "invalid_parameter"),
        (["x"] * (MAX_INPUTS + 1), f"input: {MAX_INPUTS + 1} inputs; at most", "invalid_parameter"),
        (["fine", "word " * 600], "input[1]: 601 tokens, more than the context holds (512)",
         "context_length_exceeded"),
        ([[5, 10**9]], "input[0]: token id 1000000000 is outside the vocabulary",
         "invalid_parameter"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_input(
    client: openai.OpenAI, model_name: str, given: object, message: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model_name, input=given)  # type: ignore[arg-type]
    body = caught.value.body
    assert body["message"].startswith(message), body
    assert (body["param"], body["code"]) == ("input", code)


def test_bad_body_and_unknown_model(server: ServerThread, model_name: str) -> None:
    url = server.url + "/v1/embeddings"
    wrong = httpx.post(url, json={"model": model_name, "input": "x", "encoding_format": "int8"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "encoding_format"
    mixed = httpx.post(url, json={"model": model_name, "input": ["a", 3]})
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "input"
    other = httpx.post(url, json={"model": "gpt-4", "input": "x"})
    assert other.status_code == 404 and other.json()["error"]["param"] == "model"


def test_route_in_the_openapi_schema(server: ServerThread) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    body = schema["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
    ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    fields = schema["components"]["schemas"][ref]["properties"]
    assert {"input", "model", "encoding_format", "dimensions"} <= set(fields)


def test_stream_keeps_its_tokens_while_embeddings_are_served(
    client: openai.OpenAI, model_name: str
) -> None:
    """A greedy streamed chat answer is the same with embedding requests served beside it."""
    messages = [{"role": "user", "content": "Name three colours."}]
    ask = {"model": model_name, "messages": messages, "max_tokens": 24, "temperature": 0}
    alone = client.chat.completions.create(**ask).choices[0].message.content
    stream = client.chat.completions.create(**ask, stream=True)
    pieces = [next(iter(stream))]  # the stream has started
    done: list[np.ndarray] = []

    def embed() -> None:
        for _ in range(3):
            done.append(vectors_of(client.embeddings.create(model=model_name, input=TEXTS)))

    worker = threading.Thread(target=embed)
    worker.start()
    pieces += list(stream)
    worker.join()
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == alone
    assert len(done) == 3 and all(np.array_equal(v, done[0]) for v in done)
