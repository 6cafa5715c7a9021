"""Chat templates: the embedded model's ChatML, HF-compatible rendering, and the sandbox."""

from __future__ import annotations

import datetime

import pytest
from pydantic import BaseModel

from localinfer.loading.chat_template import ChatTemplate, ChatTemplateError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def embedded():
    return load_model(embedded_model_path())


def test_embedded_template_renders_chatml(embedded):
    prompt = embedded.chat_template.render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    assert prompt == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_embedded_template_keeps_a_given_system_prompt(embedded):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    prompt = embedded.chat_template.render(messages, add_generation_prompt=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )


def test_embedded_prompt_token_ids(embedded):
    prompt = embedded.chat_template.render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = embedded.tokenizer.encode(prompt)
    # <|im_start|>=1 and <|im_end|>=2 are single special tokens; 198 is "\n".
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198,
        1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198,
        1, 520, 9531, 198,
    ]  # fmt: skip
    assert embedded.tokenizer.decode(ids) == prompt


def test_chatml_fallback():
    t = ChatTemplate.chatml()
    assert t.render([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.eos_token == "<|im_end|>"


def test_hf_environment_conventions():
    src = (
        "{% for m in messages %}\n"
        "  {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "  {% generation %}[{{ m.role }}]{% endgeneration %}{{ m.content | tojson }}\n"
        "{% endfor %}\n"
        "{{ bos_token }}|{{ eos_token }}|{{ extra_flag }}|{{ tools | tojson }}"
    )
    t = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    out = t.render(
        [{"role": "user", "content": "héllo"}, {"role": "skip", "content": "no"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
        extra_flag=True,
    )
    # trim_blocks + lstrip_blocks: block lines leave no blank lines or indentation behind;
    # tojson keeps non-ASCII as HF's does.
    assert out == ('[user]"héllo"\n<s>|</s>|True|[{"type": "function", "function": {"name": "f"}}]')


def test_strftime_now_and_raise_exception():
    year = str(datetime.datetime.now().year)
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]) == year
    t = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}ok"
    )
    assert t.render([{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        t.render([{"role": "assistant", "content": ""}])


def test_pydantic_messages_are_accepted():
    class Msg(BaseModel):
        role: str
        content: str

    out = ChatTemplate.chatml().render(
        [Msg(role="user", content="hi")], add_generation_prompt=False
    )
    assert out == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__.os }}",
        "{{ lipsum.__globals__['os'].popen('id').read() }}",
        "{{ [].__class__.__base__.__subclasses__() }}",
        "{{ self.__init__.__globals__ }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{% set d = {} %}{{ d.update(a=1) }}",
        "{{ range(10 ** 9) | list }}",
    ],
)
def test_sandbox_refuses(source):
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert info.value.__cause__ is None
    assert "\n" not in str(info.value)


def test_syntax_error_is_a_chat_template_error():
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate("{% for m in messages %}")


def test_undefined_variable_renders_empty_like_hf():
    assert ChatTemplate("[{{ not_given }}]").render([]) == "[]"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ not_given.attr }}").render([])


def test_fallback_picks_gemma_turns_for_gemma_vocabularies():
    vocab = {"<start_of_turn>", "<end_of_turn>"}
    t = ChatTemplate.fallback(vocab.__contains__, bos_token="<bos>", eos_token="<eos>")
    out = t.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi "},
            {"role": "assistant", "content": "Hello!"},
        ]
    )
    assert out == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>model\n"
    )
    chatml = ChatTemplate.fallback({"<|im_start|>"}.__contains__)
    assert chatml.source == ChatTemplate.chatml().source
