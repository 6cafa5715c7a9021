"""A model that cannot take chat turns is refused a chat, clearly, instead of being fed another
family's turn markers: a catalog base model (gemma3-270m), or a file without a template whose
vocabulary has no turn tokens. `generate` sends a base model its prompt as is."""

from __future__ import annotations

import argparse

import pytest

from localinfer.catalog import load_catalog
from localinfer.commands.generate import _prompt
from localinfer.engine.types import SamplingParams
from localinfer.errors import UnsupportedModelError
from localinfer.loading.chat_template import ChatTemplate
from localinfer.session import open_session


def test_no_built_in_template_fits_a_vocabulary_without_turn_tokens() -> None:
    assert ChatTemplate.fallback(set().__contains__) is None
    assert ChatTemplate.fallback({"<|im_start|>"}.__contains__) is not None


def test_the_catalog_says_gemma3_270m_is_a_base_model() -> None:
    entry = load_catalog().get("gemma3-270m")
    assert entry.base_model and "instruction-tuned" not in entry.description.replace(
        "not instruction-tuned", ""
    )
    assert not load_catalog().get("smollm2-135m").base_model


@pytest.fixture(scope="module")
def session():
    s = open_session(backend="llamacpp", slots=1, ctx=256)
    yield s
    s.close()


def args(**over) -> argparse.Namespace:
    base = {"suffix": None, "raw": False, "system": None, "prompt": "The sky is",
            "thinking": None, "thinking_budget": None}  # fmt: skip
    return argparse.Namespace(**{**base, **over})


def test_a_base_model_is_refused_a_chat_and_generate_sends_it_text(session, capsys) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    chat_ids = session.chat_prompt_ids(messages)
    session.base_model = True
    try:
        with pytest.raises(UnsupportedModelError, match="base model.*generate --raw"):
            session.chat_prompt_ids(messages)
        ids, _, _ = _prompt(session, args(), SamplingParams())
        assert ids == session.raw_prompt_ids("The sky is") and ids != chat_ids
        assert "is a base model: the prompt is sent as is" in capsys.readouterr().err
        with pytest.raises(UnsupportedModelError):  # a system prompt asks for turns
            _prompt(session, args(system="Be brief."), SamplingParams())
    finally:
        session.base_model = False


def test_a_file_without_template_or_turn_tokens_is_refused_a_chat(session) -> None:
    template = session.model.chat_template
    session.model.chat_template = None
    try:
        with pytest.raises(UnsupportedModelError, match="ships no chat template"):
            session.chat_prompt_ids([{"role": "user", "content": "Hi"}])
    finally:
        session.model.chat_template = template
