"""Which bodies the answer routes prepare on the event loop (answer_route.prepares_inline): small
ones, when no image URL can be fetched; the rest in a worker thread. Both paths answer alike."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
from starlette.requests import Request

from localinfer.server import ServerThread, answer_route, create_app
from localinfer.server.answer_route import INLINE_BODY_BYTES, prepares_inline
from tests.test_server_support import make_session


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_small_bodies_inline_large_or_unsized_ones_in_a_thread() -> None:
    state = SimpleNamespace(image_fetch=None)
    assert prepares_inline(_request({"content-length": "120"}), state)  # type: ignore[arg-type]
    at_limit = {"content-length": str(INLINE_BODY_BYTES)}
    assert prepares_inline(_request(at_limit), state)  # type: ignore[arg-type]
    over = {"content-length": str(INLINE_BODY_BYTES + 1)}
    assert not prepares_inline(_request(over), state)  # type: ignore[arg-type]
    assert not prepares_inline(_request({}), state)  # type: ignore[arg-type]  (chunked upload)
    assert not prepares_inline(_request({"content-length": "x"}), state)  # type: ignore[arg-type]


def test_a_server_that_fetches_image_urls_prepares_every_body_in_a_thread() -> None:
    state = SimpleNamespace(image_fetch=object())
    assert not prepares_inline(_request({"content-length": "120"}), state)  # type: ignore[arg-type]


def test_both_paths_give_the_same_answer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []
    real = answer_route.prepares_inline

    def spy(request, state):  # type: ignore[no-untyped-def]
        seen.append(real(request, state))
        return seen[-1]

    monkeypatch.setattr(answer_route, "prepares_inline", spy)
    prompt = "The capital of France is"
    padded = prompt + " " * (INLINE_BODY_BYTES + 10)  # trailing spaces: a large body
    with ServerThread(create_app(make_session())) as server:
        answers = []
        for text in (prompt, padded):
            body = {"prompt": text, "max_tokens": 6, "temperature": 0}
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            answers.append(r.json()["choices"][0]["text"])
    assert seen == [True, False]
    assert all(answers)  # each path answered
