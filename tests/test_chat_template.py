"""Chat templates: the embedded model's ChatML, HF-compatible rendering, and the sandbox."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel

from localinfer.loading.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    ChatTemplateLimitError,
    _GenerationTag,
    _raise_exception,
    _strftime_now,
    _tojson,
)
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


pytestmark = pytest.mark.usefixtures("session_cache")


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


# -- bounds: runaway templates are refused, real ones render unchanged -----------------------

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
CHATML_TAIL = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


@pytest.mark.parametrize(
    "source, words",
    [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "loop iterations",
        ),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}"
            "{% endfor %}",
            "loop iterations",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "a string of",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "a string of",
        ),
        ("{{ 'x' * 10000000000 }}", "a string of 10000000000"),
        ("{% set l = [1] * 1000000000 %}", "a list of"),
        ("{{ 2 ** 100000000 }}", "a number of"),
        ("{{ 'x' | center(10000000000) }}", "a string of"),
        ("{% set w = 10000000000 %}{{ 'x' | indent(w, true) }}", "a string of"),
        ("{% set w = 10000000000 %}{{ 'x'.ljust(w) }}", "a string of"),
        ("{{ '%0999999999d' % 1 }}", "formatted field"),
        ("{{ '{:>999999999}'.format(1) }}", "formatted field"),
        ("{{ '%0999999999d' | format(1) }}", "formatted field"),
        ("{{ ('x' * 100000).join(range(100000)) }}", "a string of"),
        ("{{ range(100000) | join('x' * 100000) }}", "a string of"),
        ("{% set n = 1000000000 %}{{ [1, 2] | slice(n) | list }}", "loop iterations"),
        ("{{ 'ab' | replace('', 'x' * 1000) | replace('', 'y' * 1000) | replace('', 'z') }}", ""),
        ("{{ range(1000000000) | list | length }}", "a range of"),
        ("{{ messages | tojson(indent=1000000000) }}", "indent"),
    ],
)
def test_runaway_template_is_refused_at_load(source, words):
    with pytest.raises(ChatTemplateLimitError) as info:
        ChatTemplate(source)
    err = str(info.value)
    assert err.startswith("chat template refused: ") and words in err
    assert "\n" not in err and info.value.__cause__ is None


def test_runaway_on_some_inputs_is_refused_at_render_and_the_template_still_works():
    t = ChatTemplate(
        "{% if messages | length > 1 %}{% for a in messages %}{% for b in messages %}"
        "{% for c in messages %}{% endfor %}{% endfor %}{% endfor %}{% endif %}" + CHATML_TAIL
    )
    one = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateLimitError, match="loop iterations"):
        t.render(one * 1000)  # 10^9 empty iterations
    assert t.render(one) == "<|im_start|>user\nx<|im_end|>\n"  # each render has its own budget


def test_output_limit_grows_with_the_input():
    big = "y" * 3_000_000
    t = ChatTemplate("{{ messages[0]['content'] * 2 }}")
    assert len(t.render([{"role": "user", "content": big}])) == 6_000_000  # 2x a long input: fine
    with pytest.raises(ChatTemplateLimitError, match="a string of"):
        ChatTemplate("{{ messages[0]['content'] * 20 }}").render([{"role": "user", "content": big}])


def test_a_long_loop_within_the_limits_renders():
    out = ChatTemplate("{% for i in range(100000) %}.{% endfor %}").render([])
    assert out == "." * 100000


def test_recursion_is_an_error_not_a_crash():
    t = ChatTemplate("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}")
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        t.render([])


def _stock_environment() -> ImmutableSandboxedEnvironment:
    """Jinja2's own sandbox with the same conventions and no limits: the reference."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hello"}],
    "system and turns": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris?"},
    ],
    "tool call": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call1abcd",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call1abcd", "name": "get_weather", "content": "sunny"},
    ],
    "401 turns": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20}
        for i in range(401)
    ],
}


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.jinja")), ids=lambda p: p.stem)
def test_real_templates_render_as_in_the_stock_sandbox(path):
    source = path.read_text()
    ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    ref = _stock_environment().from_string(source)
    for name, messages in CONVERSATIONS.items():
        for tools in (None, TOOLS):
            context = {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": True,
            }
            try:
                want = ref.render(**context)
            except Exception:
                with pytest.raises(ChatTemplateError):
                    ours.render(messages, tools=tools)
                continue
            assert ours.render(messages, tools=tools) == want, (name, tools is not None)
