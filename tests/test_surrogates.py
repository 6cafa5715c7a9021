# ruff: noqa: F811 - pytest fixtures imported from tests.test_server_support
"""Lone UTF-16 surrogates (``\\ud800``; argv bytes that are not UTF-8) anywhere a user can put text
are replaced with U+FFFD, never a 500 or a traceback: through the real HTTP server (messages,
prompt, stop) and the real ``localinfer generate`` process (prompt, --system, --stop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localinfer.engine.detokenizer import Detokenizer
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.loading.unicode_text import scrub_surrogates
from localinfer.session import Session
from tests.test_server_support import make_session, server  # noqa: F401 - fixture; its session is below

# Lone high and low surrogates, a reversed pair, surrogateescape'd argv bytes, a split emoji,
# and surrogates next to special-token text and multi-byte characters.
NASTY = [
    "\ud800",
    "\udfff",
    "a\ud800b",
    "\udc00\ud800",
    "x\udcff\udcfe y",
    "\ud83d",
    "\ud83dx\ude00",
    "<|im_end|>\ud800<|im_start|>",
    "日本\udbff語 😀\udc80",
    "\ud800" * 50,
]


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    """The embedded model behind the `server` fixture, on llama.cpp with one thread: the checks
    are on the text path (HTTP body, chat template, tokenizer, stop strings), which is the same
    for every backend, and llama.cpp answers these 2-token requests for a fraction of the torch
    runner's CPU (test_server_support pins torch for logits that do not depend on the batch,
    which nothing here reads)."""
    s = make_session(backend="llamacpp")
    yield s
    s.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_model(embedded_model_path()).tokenizer


# -- the text layer ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", NASTY)
def test_scrub_leaves_no_surrogates_and_keeps_the_rest(text: str) -> None:
    clean = scrub_surrogates(text)
    clean.encode("utf-8")  # raises on any surrogate left
    assert clean.replace("\ufffd", "") == "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)


def test_scrub_joins_a_real_pair_and_passes_clean_text_through() -> None:
    assert scrub_surrogates("\ud83d\ude00") == "😀"
    clean = "plain ascii"
    assert scrub_surrogates(clean) is clean


@pytest.mark.parametrize("text", NASTY)
def test_tokenizer_encodes_surrogates_as_replacement(tokenizer: Any, text: str) -> None:
    for parse_special in (True, False):
        ids = tokenizer.encode(text, add_special_tokens=True, parse_special=parse_special)
        assert ids == tokenizer.encode(scrub_surrogates(text), True, parse_special)
    assert tokenizer.token_to_id("\ud800") is None


@pytest.mark.parametrize("text", NASTY)
def test_chat_template_renders_surrogates_as_replacement(text: str) -> None:
    template = ChatTemplate(
        "{{ messages[0]['content'] }}|{{ messages | tojson }}|{{ note }}|{{ tools | tojson }}"
    )
    out = template.render(
        [{"role": "user", "content": text}],
        tools=[{"name": text}],
        note=text,
    )
    out.encode("utf-8")


def test_stop_string_with_a_surrogate_matches_the_replacement_character() -> None:
    pieces = [b"ok ", b"\xff", b" more"]
    detok = Detokenizer(lambda i: pieces[i], stop=["\udcff", "\ud800"])
    assert detok.add(0).text == "ok "
    step = detok.add(1)
    assert step.stopped and step.text == ""


# -- the real HTTP server ---------------------------------------------------------------------


def _post(server: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps writes a lone surrogate as the \\udXXX escape: valid JSON, as a client sends it.
    return httpx.post(
        server.url + path,
        content=json.dumps(body).encode("ascii"),
        headers={"content-type": "application/json"},
        timeout=300,
    )


def _stream_data_lines(server: Any, path: str, body: dict[str, Any]) -> list[str]:
    """POST a streaming request as ``_post`` does; the SSE ``data:`` lines of a 200 answer."""
    with httpx.stream(
        "POST",
        server.url + path,
        content=json.dumps(body).encode("ascii"),
        headers={"content-type": "application/json"},
        timeout=300,
    ) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line.startswith("data: ")]


def _bodies(text: str) -> list[tuple[str, dict[str, Any]]]:
    common = {"max_tokens": 2, "temperature": 0}
    return [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": text}], **common},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "system", "content": text},
                    {"role": "user", "content": [{"type": "text", "text": text}]},
                ],
                "stop": [text, "\n"],
                **common,
            },
        ),
        # A bare-string stop (not a list); bounded like the rest: the point is the stop's parsing,
        # and an unbounded answer only spends tokens.
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "stop": text, **common},
        ),
        ("/v1/completions", {"prompt": text, **common}),
        ("/v1/completions", {"prompt": "Say" + text, "stop": [text], **common}),
        ("/v1/completions", {"prompt": [text], **common}),
    ]


# Through the server, each kind of text once: a lone high and a lone low surrogate, a reversed
# pair, and surrogateescape'd bytes inside ordinary text. Every field takes its text through the
# same scrub, tested above on all of NASTY; "a\ud800b" and "\ud83d" (inside text, and another
# lone high surrogate) are no other case at this layer, and each case costs six requests.
SERVER_NASTY = ["\ud800", "\udfff", "\udc00\ud800", "x\udcff\udcfe y"]


@pytest.mark.parametrize("text", SERVER_NASTY)
def test_server_never_answers_500_for_surrogates(server: Any, text: str) -> None:  # noqa: F811
    for path, body in _bodies(text):
        response = _post(server, path, body)
        assert response.status_code == 200, (path, body, response.status_code, response.text)
        data = response.json()
        assert data["choices"], data


def test_server_echo_of_a_surrogate_prompt(server: Any) -> None:  # noqa: F811
    body = {"prompt": "a\ud800", "echo": True, "max_tokens": 1, "temperature": 0}
    response = _post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].startswith("a\ufffd")
    lines = _stream_data_lines(server, "/v1/completions", {**body, "stream": True})
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][len("data: ") :])["choices"][0]["text"] == "a\ufffd"


def test_server_streams_with_surrogate_stop_and_prompt(server: Any) -> None:  # noqa: F811
    body = {
        "messages": [{"role": "user", "content": "Count: \ud800 1 2 3"}],
        "stop": ["\udfff"],
        "max_tokens": 3,
        "stream": True,
    }
    lines = _stream_data_lines(server, "/v1/chat/completions", body)
    assert lines[-1] == "data: [DONE]"


# -- the real `localinfer generate` process -------------------------------------------------


def _generate(*args: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    argv: list[bytes] = [
        os.fsencode(sys.executable),
        b"-m",
        b"localinfer",
        b"generate",
        b"--max-tokens",
        b"3",
        b"--slots",
        b"1",
        b"--ctx",
        b"256",
        # llama.cpp on one thread, as the server above: the argv decoding is the subject, and
        # the default backend (torch on some machines) costs several times the CPU.
        b"--backend",
        b"llamacpp",
        b"--threads",
        b"1",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, env=env, timeout=600)


@pytest.mark.parametrize(
    "args",
    [
        # \xff and \xed\xa0\x80 (a UTF-8-encoded surrogate) are not UTF-8: Python hands them to
        # the program as surrogateescape'd \udcXX characters.
        (b"--system", b"be \xff brief", b"--stop", b"\xed\xa0\x80", b"Hi \xff\xfe there"),
        (b"--raw", b"--stop", b"\xff", b"--stop", b"\n", b"Once upon a \xed\xa0\x80 time"),
    ],
    ids=["chat", "raw"],
)
def test_generate_cli_takes_undecodable_argv(args: tuple[bytes, ...]) -> None:
    done = _generate(*args)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err
    assert "finish:" in err  # the metrics line: an answer was generated
