"""Thinking formats read from real chat templates (tools/thinking.py): which models think, whether
the prompt opened the reasoning block, and thinking turned off where the template can."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.loading.chat_template import ChatTemplate
from localinfer.tools.thinking import (
    Thinking,
    detect_thinking,
    reasoning_spec,
    template_switch,
)

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
USER = [{"role": "user", "content": "What is 2+2?"}]
THINKERS = {  # template -> the prompt opens the block itself
    "Qwen-Qwen3-0.6B": False,
    "HuggingFaceTB-SmolLM3-3B": False,
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": True,
    "Qwen-QwQ-32B": True,
}
OTHERS = ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "google-gemma-2-2b-it"]


def source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def prompt(name: str, thinking: Thinking) -> str:
    fmt = detect_thinking(source(name))
    template = ChatTemplate(source(name), bos_token="<s>", eos_token="</s>")
    return template.render(USER, add_generation_prompt=True, **template_switch(fmt, thinking))


def spec_for(name: str, thinking: Thinking):
    fmt = detect_thinking(source(name))
    return reasoning_spec(fmt, prompt(name, thinking), thinking, lambda s: [len(s)])


@pytest.mark.parametrize(("name", "opened"), sorted(THINKERS.items()))
def test_thinking_models_split_their_answer(name: str, opened: bool) -> None:
    spec = spec_for(name, Thinking())
    assert spec is not None and spec.starts_inside is opened and spec.budget is None


@pytest.mark.parametrize("name", sorted(THINKERS))
def test_thinking_off_closes_the_block_in_the_prompt(name: str) -> None:
    assert spec_for(name, Thinking(enabled=False)) is None
    assert prompt(name, Thinking(enabled=False)).rstrip().endswith("</think>")


@pytest.mark.parametrize("name", OTHERS)
def test_other_models_are_untouched(name: str) -> None:
    assert detect_thinking(source(name)) is None
    assert spec_for(name, Thinking(enabled=False)) is None


def test_off_without_a_switch_is_a_budget_of_zero() -> None:
    fmt = detect_thinking("{{ messages[0].content }}{% if x %}</think>{% endif %}")
    assert fmt is not None and fmt.toggle is None
    spec = reasoning_spec(fmt, "prompt", Thinking(enabled=False), lambda s: [1, 2])
    assert spec is not None and spec.budget == 0 and spec.end_ids == (1, 2)


def test_a_budget_carries_the_closing_ids() -> None:
    spec = spec_for("Qwen-Qwen3-0.6B", Thinking(budget=64))
    assert spec.budget == 64 and spec.end_ids == (len("</think>\n\n"),)


def test_the_catalog_says_which_models_think() -> None:
    from localinfer.catalog import load_catalog

    catalog = load_catalog()
    thinkers = {name for name in catalog.names() if catalog.get(name).thinks}
    assert {"qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-30b-a3b"} <= thinkers
    assert "smollm2-135m" not in thinkers and "gemma3-4b" not in thinkers
