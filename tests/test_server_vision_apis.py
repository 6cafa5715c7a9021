# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""Images through every API of a real server (issue #37), with the official ``openai`` and
``anthropic`` clients, on the tiny Gemma 3 and its projector (tests/vision_model.py): OpenAI chat
``image_url`` parts, Anthropic ``image`` blocks and Responses ``input_image`` parts give the same
greedy tokens for the same image; bad images are 400s naming each API's own field; image URLs
are refused by default, fetched under ``--allow-image-urls`` (from this machine only with
``=private``), never for a model that reads no images. (OpenAI chat's answer is llama.cpp's own:
tests/test_server_vision.py.)"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from localinfer.server import ServerThread, create_app  # noqa: E402
from localinfer.server.image_fetch import ImageFetch  # noqa: E402
from localinfer.session import Session, open_session  # noqa: E402
from tests.image_files import data_url, png_bytes, png_claiming  # noqa: E402
from tests.image_server import Served, body, image_server, redirect  # noqa: E402
from tests.vision_model import (  # noqa: E402
    random_image,
    vlm,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.llamacpp

PNG = png_bytes(random_image(5, (40, 24)))
OTHER = png_bytes(random_image(9, (40, 24)))
TOKENS = 8
MODEL = "tiny-gemma3-vision-F32"


@pytest.fixture(scope="module")
def session(vlm: tuple[Path, Path]) -> Iterator[Session]:
    with open_session(str(vlm[0]), slots=2, ctx=256, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def images() -> Iterator[Served]:
    routes = {"/cat.png": body(PNG, Content_Type="image/png"), "/moved": redirect("/cat.png")}
    with image_server(routes) as served:
        yield served


def serve(session: Session, fetch: ImageFetch | None) -> Iterator[str]:
    with ServerThread(create_app(session, image_fetch=fetch)) as server:
        yield server.url


@pytest.fixture(scope="module")
def url(session: Session) -> Iterator[str]:
    yield from serve(session, None)  # image URLs refused: the default


@pytest.fixture(scope="module")
def fetching(session: Session) -> Iterator[str]:
    yield from serve(session, ImageFetch(allow_private=True))  # --allow-image-urls=private


@pytest.fixture(scope="module")
def public(session: Session) -> Iterator[str]:
    yield from serve(session, ImageFetch())  # --allow-image-urls


# Each API's answer for "What is <image>? Say it.": (text, prompt tokens).
def ask_openai(url: str, image_url: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    content = [
        {"type": "text", "text": "What is "},
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": "? Say it."},
    ]
    done = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=TOKENS,
        temperature=0,
    )  # fmt: skip
    return done.choices[0].message.content, done.usage.prompt_tokens


def anthropic_image(source: dict[str, Any]) -> list[dict[str, Any]]:
    content = [
        {"type": "text", "text": "What is "},
        {"type": "image", "source": source},
        {"type": "text", "text": "? Say it."},
    ]
    return [{"role": "user", "content": content}]


def ask_anthropic(url: str, source: dict[str, Any]) -> tuple[str, int]:
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    messages = anthropic_image(source)
    done = client.messages.create(
        model=MODEL, messages=messages, max_tokens=TOKENS, extra_body={"temperature": 0}
    )
    counted = client.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    assert counted == done.usage.input_tokens  # count_tokens reads (and fetches) it the same
    return done.content[0].text, done.usage.input_tokens


def ask_responses(url: str, image_url: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    content = [
        {"type": "input_text", "text": "What is "},
        {"type": "input_image", "image_url": image_url, "detail": "auto"},
        {"type": "input_text", "text": "? Say it."},
    ]
    done = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=TOKENS,
        temperature=0, store=False,
    )  # fmt: skip
    return done.output_text, done.usage.input_tokens


def inline(png: bytes = PNG) -> dict[str, Any]:
    return {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}


def test_every_api_gives_the_same_tokens_for_the_same_image(url: str) -> None:
    expected = ask_openai(url, data_url(PNG))
    assert expected[1] > 16 + 10  # the image's 16 tokens are in the prompt
    assert ask_anthropic(url, inline()) == expected
    assert ask_responses(url, data_url(PNG)) == expected
    # Another image gives other tokens (this one from the first), the same through each API.
    other = ask_openai(url, data_url(OTHER))
    assert other[0] != expected[0] and other[0][:1] != expected[0][:1]
    assert ask_anthropic(url, inline(OTHER)) == other == ask_responses(url, data_url(OTHER))


def test_image_urls_fetched_under_allow_image_urls(fetching: str, images: Served) -> None:
    expected = ask_openai(fetching, data_url(PNG))
    before = len(images.requests)
    assert ask_openai(fetching, images.url("/moved")) == expected
    assert ask_anthropic(fetching, {"type": "url", "url": images.url("/cat.png")}) == expected
    assert ask_responses(fetching, images.url("/cat.png")) == expected
    # OpenAI's two hops, then Anthropic's create and count_tokens, then Responses'
    fetched = [path for path, _ in images.requests[before:]]
    assert fetched == ["/moved", "/cat.png", "/cat.png", "/cat.png", "/cat.png"]


def openai_refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    error = refused.value.body
    return error["message"], error["param"]


def anthropic_refusal(url: str, messages: list[dict[str, Any]]) -> str:
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, messages=messages, max_tokens=2)
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    return refused.value.body["error"]["message"]


def test_remote_urls_are_refused_by_default(url: str, images: Served) -> None:
    before = len(images.requests)
    remote = images.url("/cat.png")
    message, param = openai_refusal(lambda: ask_openai(url, remote))
    assert param == "messages[0].content[1].image_url.url"
    assert "remote image URLs are not fetched" in message and "--allow-image-urls" in message
    message, param = openai_refusal(lambda: ask_responses(url, remote))
    assert param == "input[0].content[1].image_url"
    assert message.startswith(param + ": remote image URLs are not fetched")
    message = anthropic_refusal(url, anthropic_image({"type": "url", "url": remote}))
    assert message.startswith("messages[0].content[1].source.url: remote image URLs are not")
    assert len(images.requests) == before


def test_public_only_fetches_nothing_from_this_machine(public: str, images: Served) -> None:
    before = len(images.requests)
    message, param = openai_refusal(lambda: ask_openai(public, images.url("/cat.png")))
    assert param == "messages[0].content[1].image_url.url"
    assert "resolves to 127.0.0.1, a loopback address" in message
    message = anthropic_refusal(public, anthropic_image({"type": "url", "url": images.url("/x")}))
    assert message.startswith("messages[0].content[1].source.url: 127.0.0.1 resolves to")
    message, param = openai_refusal(lambda: ask_responses(public, images.url("/moved")))
    assert param == "input[0].content[1].image_url" and "a loopback address" in message
    assert len(images.requests) == before


@pytest.mark.parametrize(
    ("source", "field", "says"),
    [
        (inline(b"hello, not an image"), "source.data", "not an image localinfer reads"),
        (inline(PNG[:70]), "source.data", "a broken or truncated image"),
        (inline(png_claiming(0, 0)), "source.data", "not an image"),
        (inline(png_claiming(50_000, 50_000)), "source.data", "larger than localinfer reads"),
        ({"type": "base64", "media_type": "image/png", "data": "%%%"}, "source.data", "base64"),
        ({"type": "file", "file_id": "file_1"}, "source.type", "'file' image sources are not"),
        ({"type": "base64", "media_type": "image/bmp", "data": "Qk0="}, "media_type", "image/png"),
    ],
)
def test_bad_anthropic_images(url: str, source: dict[str, Any], field: str, says: str) -> None:
    message = anthropic_refusal(url, anthropic_image(source))
    assert "messages[0].content[1]" in message and field in message and says in message


def test_images_where_anthropic_takes_none(url: str) -> None:
    image = {"type": "image", "source": inline()}
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [image]},
        {"role": "user", "content": "Well?"},
    ]
    message = anthropic_refusal(url, turns)
    assert message.startswith("messages[1].content[0]: image blocks are not supported in an")
    call = {"type": "tool_use", "id": "t1", "name": "look", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
    turns = [
        turns[0],
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    assert "messages[2].content[0].content[0]: image blocks" in anthropic_refusal(url, turns)


@pytest.mark.parametrize(
    ("part", "field", "says"),
    [
        ({"image_url": data_url(b"hello")}, "image_url", "not an image localinfer reads"),
        ({"image_url": data_url(PNG[:70])}, "image_url", "a broken or truncated image"),
        ({"image_url": "data:image/png;base64,%%%"}, "image_url", "not valid base64"),
        ({"file_id": "file-123"}, "file_id", "images by file_id are not supported"),
        ({}, "image_url", "an input_image part needs its image_url"),
    ],
)
def test_bad_responses_images(url: str, part: dict[str, Any], field: str, says: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    content = [{"type": "input_text", "text": "What is "}, {"type": "input_image", **part}]
    message, param = openai_refusal(
        lambda: client.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=2
        )
    )
    assert param == f"input[0].content[1].{field}" and says in message


def test_no_fetch_for_a_model_that_reads_no_images(vlm: tuple[Path, Path], images: Served) -> None:
    before = len(images.requests)
    fetch = ImageFetch(allow_private=True)
    messages = anthropic_image({"type": "url", "url": images.url("/cat.png")})
    with (
        open_session(str(vlm[0]), slots=1, ctx=256, threads=1, mmproj="none") as plain,
        ServerThread(create_app(plain, image_fetch=fetch)) as srv,
    ):
        answer = {"messages": messages, "max_tokens": 2}
        refused = httpx.post(srv.url + "/v1/messages", json=answer)
    assert refused.status_code == 404 and "--backend llamacpp" in refused.text
    assert len(images.requests) == before
