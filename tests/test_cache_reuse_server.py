"""--cache-reuse over HTTP and on the command line: an editor's fill-in-the-middle requests while
lines are typed in the middle of a file, against servers with cache reuse on (N = 16) and off, on
a tiny random model whose vocabulary has Qwen's FIM tokens.

- With it on, ``usage.prompt_tokens_details.cached_tokens`` counts the moved suffix (whole and
  streamed), and answers are well formed; with it off, only the shared prefix is cached.
- ``serve --help`` states the approximation; a negative N is refused before anything loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from localinfer.cli import main
from localinfer.engine.slots import shared_prefix
from localinfer.fim import fim_prompt_ids
from localinfer.server import ServerThread
from localinfer.session import Session, open_session
from tests.test_fim import write_fim_model
from tests.test_server_support import client_for, serving, sse_lines

HEAD = "def total(items):\n    result = 0\n"
LINES = ["    for item in items:\n", "        result += item.price\n", "    # done\n"]
TAIL = "    return result\n\n\nprint(total([]))  # nothing yet\n\n# end of the example file\n"


Servers = dict[int, tuple[Session, ServerThread]]  # by --cache-reuse N


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = write_fim_model(tmp_path_factory.mktemp("fim") / "tiny-fim")
    kw: dict = dict(slots=2, ctx=512, threads=1)
    with (
        open_session(str(root), **kw) as off,
        open_session(str(root), cache_reuse=16, **kw) as on,
        serving(off) as off_server,
        serving(on) as on_server,
    ):
        yield {0: (off, off_server), 16: (on, on_server)}


def usage_streamed(server: ServerThread, model: str, prefix: str) -> dict:
    body = {
        "model": model,
        "prompt": prefix,
        "suffix": TAIL,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(p) for p in sse_lines(r) if p != "[DONE]"]
    return chunks[-1]["usage"]


def test_usage_counts_the_moved_suffix_as_cached(servers: Servers) -> None:
    prefixes = [HEAD + "".join(LINES[:i]) for i in range(len(LINES) + 1)]
    for n, (session, server) in servers.items():
        client: openai.OpenAI = client_for(server)
        name = session.model.name
        prompts = [fim_prompt_ids(session.tokenizer, p, TAIL) for p in prefixes]
        for i, prefix in enumerate(prefixes):
            if i % 2:
                usage = usage_streamed(server, name, prefix)
            else:
                reply = client.completions.create(
                    model=name, prompt=prefix, suffix=TAIL, max_tokens=6, temperature=0
                )
                assert reply.choices[0].finish_reason in ("length", "stop")
                usage = reply.usage.model_dump()
            assert usage["prompt_tokens"] == len(prompts[i])
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            if i == 0:
                assert cached == 0
                continue
            keep = shared_prefix(prompts[i - 1], prompts[i])
            if n == 0:
                assert cached == keep
            else:
                # The suffix section (marker + tail tokens) was moved, not prefilled; at most
                # its last token and the middle marker are fed.
                suffix_ids = fim_prompt_ids(session.tokenizer, "", TAIL)
                assert cached >= keep + len(suffix_ids) - 3
                assert cached <= len(prompts[i]) - 1


def test_serve_help_states_the_approximation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--cache-reuse N" in text
    assert "approximation" in text and "computed without the new text before it" in text


def test_a_negative_cache_reuse_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--cache-reuse", "-1", "--port", "0"]) == 1
    assert "--cache-reuse must be >= 0" in capsys.readouterr().err
