"""The kept turns' KV survives a cut (#39), on the embedded model with the llama.cpp and torch
runners: a conversation fills the slot, the oldest turns are left out (context_fit, as the chat
does), and the next request prefills only what is new.

With chunk reuse (the chat's default, ``--cut-kv shift``) the kept turns are moved into place:
the engine reports them cached. Without it (``--cut-kv prefill``) only the shared beginning (the
template's opening) is cached and the kept turns are computed again, exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localinfer.context_fit import fit_with_room
from localinfer.engine import Request, SamplingParams
from localinfer.session import open_session
from localinfer.tui.settings import CHAT_CHUNK_REUSE

# A 512-token slot: six turns (481 tokens) fill it, and the cut keeps 325 of them (the chat's fit
# with a 64-token answer reserve): as many kept turns as the claim needs (> 300), at half the
# prefill work of a 1024-token slot.
CTX = 512
ANSWER_RESERVE = 64
QUESTION = "Tell me one more thing about the mill by the river and the hills around it."


def conversation(turns: int) -> list[dict[str, str]]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: what grows on hill {i}? " * 3})
        out.append({"role": "assistant", "content": f"On hill {i} grow oaks and wild thyme. " * 3})
    return out


def final_metrics(session: Any, ids: list[int], request_id: str) -> Any:
    params = SamplingParams(max_tokens=2, temperature=0.0)
    events = list(session.engine.submit(Request(ids, params, request_id)))
    assert events[-1].finish_reason in ("stop", "length"), events[-1]
    return events[-1].metrics


# llama.cpp's half takes about a minute on 2 cores (scripts/test --all runs it); torch's shows
# the same in the default run.
@pytest.fixture(scope="module", params=[pytest.param("llamacpp", marks=pytest.mark.slow), "torch"])
def sessions(request: pytest.FixtureRequest) -> Iterator[dict[int, Any]]:
    """Two sessions on ``request.param``: with the chat's chunk reuse, and without."""
    opened = {
        n: open_session(backend=request.param, ctx=CTX, slots=1, threads=1, cache_reuse=n)
        for n in (CHAT_CHUNK_REUSE, 0)
    }
    yield opened
    for session in opened.values():
        session.close()


def cut_and_ask(session: Any) -> tuple[Any, int, int]:
    """Fill the slot with a conversation, then send it cut (the chat's fit) with a new question:
    the request's metrics, the kept turns' tokens and the new question's tokens."""
    before = conversation(6)
    count = session.chat_prompt_ids
    assert len(count(before)) < CTX
    final_metrics(session, count(before), "before")
    after = [*before, {"role": "user", "content": QUESTION}]
    fit = fit_with_room(after, lambda m: len(count(m)), CTX, ANSWER_RESERVE, "drop-oldest")
    assert 0 < fit.dropped < len(after) - 1
    kept = len(count(fit.messages[:-1])) - len(count([]))  # the kept turns, rendered
    question = len(count(fit.messages)) - len(count(fit.messages[:-1]))
    return final_metrics(session, count(fit.messages), "after"), kept, question


def test_the_kept_turns_are_not_prefilled_again_after_a_cut(sessions: dict[int, Any]) -> None:
    metrics, kept, question = cut_and_ask(sessions[CHAT_CHUNK_REUSE])
    prefilled = metrics.prompt_tokens - metrics.cached_tokens
    assert kept > 300
    assert metrics.cached_tokens >= kept - 8, (metrics, kept)
    assert prefilled <= question + 8, (metrics, question)


def test_re_prefill_computes_the_kept_turns_again(sessions: dict[int, Any]) -> None:
    metrics, kept, _ = cut_and_ask(sessions[0])
    assert metrics.cached_tokens < 64, metrics  # the template's opening at most
    assert metrics.prompt_tokens - metrics.cached_tokens >= kept
