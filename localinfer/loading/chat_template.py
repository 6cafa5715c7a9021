"""Chat templates: a model's Jinja template turns messages into the prompt text it was trained on.

Templates come from model files, so they are untrusted: they render in Jinja2's
ImmutableSandboxedEnvironment, and any attempt to reach Python internals (``__class__``,
``__globals__``, ...) raises ChatTemplateError instead of quietly rendering nothing. Loops,
operations and the sizes of the strings a render builds are bounded (template_limits.py): a
template that would run for ever or fill memory raises ChatTemplateLimitError, at load time when
a trial render of one user message shows it, else when the messages that trigger it arrive. The
environment otherwise follows Hugging Face's ``apply_chat_template`` (trim_blocks, lstrip_blocks,
loopcontrols, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII, and the
``{% generation %}`` tag), so templates written for transformers render the same here.

Tokenize the rendered text with ``add_special_tokens=False``: templates write BOS themselves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension

from localinfer.errors import LocalinferError
from localinfer.loading.template_limits import (
    BoundedSandbox,
    RenderBudget,
    TemplateLimitExceeded,
    active_budget,
    bound_loops,
    text_size,
)
from localinfer.loading.unicode_text import scrub_surrogates

if TYPE_CHECKING:
    from localinfer.loading.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The ChatML layout (Qwen, SmolLM, many fine-tunes), used when a model ships no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma's turn format (system text joins the first user turn), for Gemma files without a template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class ChatTemplateError(LocalinferError):
    """A chat template failed to compile or render, or the sandbox refused what it tried."""

    http_status = 400
    code = "chat_template_error"


class ChatTemplateLimitError(ChatTemplateError):
    """A chat template went past the sandbox's limits on loops, operations, time or size."""

    code = "chat_template_limit"


class _TemplateRaised(TemplateError):
    """``raise_exception(msg)`` inside a template: the template rejected the messages."""


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks in
    transformers; for inference it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _StrictSandbox(BoundedSandbox):
    """The stock sandbox renders a blocked attribute as an empty Undefined, which hides the
    attempt; here it is an error at once."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed"
        )


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> _StrictSandbox:
    env = _StrictSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.guard_filter("tojson")
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _plain(value: Any) -> Any:
    """Messages/tools as plain dicts and lists (pydantic models and tuples welcome), with lone
    surrogates in any string (key or value) replaced: the rendered prompt is always valid text."""
    if isinstance(value, str):
        return scrub_surrogates(value)
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str, bos_token: str | None = "", eos_token: str | None = "") -> None:
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        env = _environment()
        try:
            # Jinja folds constant expressions while compiling: bounded like a render.
            with active_budget(RenderBudget()):
                self._template = env.from_string(bound_loops(env.parse(source), env))
        except TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"chat template has a syntax error (line {exc.lineno}): {exc.message}"
            ) from None
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template refused by the sandbox: {exc}") from None
        except TemplateLimitExceeded as exc:
            raise ChatTemplateLimitError(f"chat template refused: {exc}") from None
        except Exception as exc:  # untrusted code, folded at compile time
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        self._trial_render()

    def _trial_render(self) -> None:
        """Render one user turn now, so a template that runs away on any input is refused at
        load time rather than on the first request. Other failures wait for real messages: many
        templates reject some conversations on purpose (raise_exception)."""
        try:
            self.render([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
        except ChatTemplateLimitError:
            raise
        except ChatTemplateError:
            pass

    @classmethod
    def chatml(cls, bos_token: str = "", eos_token: str = "<|im_end|>") -> ChatTemplate:
        """The ChatML fallback for models without a template."""
        return cls(CHATML_TEMPLATE, bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def fallback(
        cls, has_token: Callable[[str], bool], bos_token: str = "", eos_token: str = ""
    ) -> ChatTemplate | None:
        """A built-in template for a model that ships none, chosen by its special tokens:
        Gemma turns when the vocabulary has <start_of_turn>, ChatML when it has <|im_start|>;
        None when it has neither. Another family's turn markers would reach such a model as
        plain text it was never trained on, so the chat refuses it instead (session.py)."""
        if has_token("<start_of_turn>") and not has_token("<|im_start|>"):
            return cls(GEMMA_TEMPLATE, bos_token=bos_token, eos_token=eos_token)
        if has_token("<|im_start|>"):
            return cls.chatml(bos_token=bos_token, eos_token=eos_token or "<|im_end|>")
        return None

    @classmethod
    def for_model(
        cls, source: object, tokenizer: Tokenizer, bos_token: str, eos_token: str, origin: object
    ) -> ChatTemplate | None:
        """The template a model file ships (``source``), or the built-in fallback when it ships
        none (None when no built-in one fits its vocabulary); a broken or runaway template
        raises with ``origin`` (the file) named."""
        if not (isinstance(source, str) and source.strip()):
            log.info("%s has no chat template; using a built-in one if its tokens fit", origin)
            return cls.fallback(
                lambda t: tokenizer.token_to_id(t) is not None,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        try:
            return cls(source, bos_token=bos_token, eos_token=eos_token)
        except ChatTemplateError as exc:  # say whose template it is
            raise type(exc)(f"{origin}: {exc}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages`` (``[{"role": ..., "content": ...}, ...]``).

        ``extra`` reaches the template as variables (``enable_thinking=False`` for Qwen 3,
        ``documents=[...]``, ...). Raises ChatTemplateError, never a raw Jinja error."""
        context: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **{k: _plain(v) for k, v in extra.items()},
            "messages": _plain(list(messages)),
            "tools": _plain(list(tools)) if tools else None,
            "add_generation_prompt": add_generation_prompt,
        }
        budget = RenderBudget(input_chars=text_size(context))
        try:
            with active_budget(budget):
                chunks = []
                for chunk in self._template.generate(**context):
                    budget.output(len(chunk))
                    chunks.append(chunk)
                return "".join(chunks)
        except TemplateLimitExceeded as exc:
            raise ChatTemplateLimitError(f"chat template refused: {exc}") from None
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template refused by the sandbox: {exc}") from None
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from None
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
        except Exception as exc:  # untrusted code: any failure is the template's, reported
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars, bos={self.bos_token!r})"
