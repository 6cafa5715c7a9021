"""A conversation as a Markdown file (F8): YAML front matter with the model, the chat's settings
and the answers' timing figures, then the turns.

The front matter is written here rather than by a YAML library (none is a dependency): strings
are JSON strings, which YAML reads as double-quoted scalars, with the characters YAML does not
allow unescaped escaped as well; numbers, booleans and null are YAML's own.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from localinfer.context_fit import outside_count, window_start
from localinfer.conversations import ChatMessage, Conversation
from localinfer.tui.settings import ChatSettings

# The figures each answer is saved with (StatsSnapshot.saved_figures), in the order shown.
FIGURES = (
    "ttft_s", "answer_ttft_s", "decode_tok_s", "prompt_tokens", "cached_tokens",
    "completion_tokens", "reasoning_tokens",
)  # fmt: skip
# Escaped: what YAML does not allow printed (DEL, C1 controls, BOM, non-characters, lone
# surrogates) and what it reads as a line break inside quotes, folding it (NEL, LS, PS).
_NOT_YAML = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


def yaml_scalar(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    quoted = json.dumps(str(value), ensure_ascii=False)
    return _NOT_YAML.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _mapping(values: Mapping[str, Any], indent: str) -> Iterator[str]:
    for key, value in values.items():
        yield f"{indent}{key}: {yaml_scalar(value)}"


def timing_summary(messages: list[ChatMessage]) -> dict[str, Any]:
    """The answers' figures: totals and means, and each answer's own."""
    answers = [m.stats for m in messages if m.role == "assistant"]
    measured = [a for a in answers if a]
    out: dict[str, Any] = {"answers": len(answers)}
    out["completion_tokens"] = int(sum(a.get("completion_tokens", 0) for a in measured))
    for name, key in (("mean_ttft_s", "ttft_s"), ("mean_decode_tok_s", "decode_tok_s")):
        values = [a[key] for a in measured if key in a]
        out[name] = round(sum(values) / len(values), 4) if values else None
    out["per_answer"] = [{k: a[k] for k in FIGURES if k in a} for a in answers]
    return out


def front_matter(conversation: Conversation, settings: ChatSettings, exported: str) -> str:
    head = {
        "title": conversation.title,
        "conversation": conversation.id,
        "model": conversation.model,
        "created": conversation.created,
        "updated": conversation.updated,
        "exported": exported,
    }
    if conversation.branched_from:
        head["branched_from"] = conversation.branched_from
    start = window_start(conversation.messages, conversation.context_start)
    if start:
        head["context_start"] = start  # the messages before it are outside the model's context
    head["system_prompt"] = conversation.system_prompt
    lines = ["---", *_mapping(head, ""), "settings:", *_mapping(asdict(settings), "  ")]
    timing = timing_summary(conversation.messages)
    per_answer = timing.pop("per_answer")
    lines += [
        "timing:",
        *_mapping(timing, "  "),
        "  per_answer:" + (" []" if not per_answer else ""),
    ]
    for figures in per_answer:
        flow = ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in figures.items())
        lines.append(f"    - {{{flow}}}")
    return "\n".join([*lines, "---"]) + "\n"


def _turn(message: ChatMessage) -> str:
    if message.role == "user":
        return f"## You\n\n{message.content}\n"
    if message.role == "system":
        return f"## Note\n\n{message.content}\n"
    reasoning = ""
    if message.reasoning:
        reasoning = (
            f"<details><summary>Reasoning</summary>\n\n{message.reasoning}\n\n</details>\n\n"
        )
    return f"## Assistant\n\n{reasoning}{message.content}\n"


def conversation_markdown(
    conversation: Conversation, settings: ChatSettings, exported: str | None = None
) -> str:
    """The whole file: front matter, the title, then each turn under a heading."""
    exported = exported or datetime.now(timezone.utc).isoformat(timespec="seconds")  # noqa: UP017
    parts = [front_matter(conversation, settings, exported), f"# {conversation.title or 'Chat'}\n"]
    if conversation.system_prompt:
        parts.append(f"## System prompt\n\n{conversation.system_prompt}\n")
    messages = conversation.messages
    start = window_start(messages, conversation.context_start)
    parts += [_turn(m) for m in messages[:start]]
    if start:
        outside = outside_count(messages, start)
        parts.append(f"*— {outside} earlier messages are outside the model's context —*\n")
    parts += [_turn(m) for m in messages[start:]]
    return "\n".join(parts)


def default_export_path(conversation: Conversation, folder: Path | None = None) -> Path:
    """``<title-words>-<id>.md`` in ``folder`` (the current directory by default)."""
    slug = re.sub(r"[^a-z0-9]+", "-", conversation.title.lower()).strip("-")[:40].strip("-")
    name = f"{slug or 'chat'}-{conversation.id}.md"
    return (folder if folder is not None else Path.cwd()) / name


def write_export(path: Path, text: str) -> Path:
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
