"""The benchmark's prompts: the shipped set (short, medium and long chat prompts) or a user's
JSONL file.

Each line is ``{"id": ..., "size": ..., "messages": [{"role": ..., "content": ...}]}``; a line
with only ``{"prompt": "..."}`` is one user message. The shipped set has four of each size: about
10, 75 and 400 tokens with the SmolLM2 tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from localinfer.errors import InvalidParameterError

SIZES = ("short", "medium", "long")


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    size: str  # short | medium | long | custom
    messages: tuple[dict[str, str], ...]


def load_prompts(path: str | Path | None = None, sizes: tuple[str, ...] = ()) -> list[BenchPrompt]:
    """The prompts of `path` (default: the shipped set), only those of `sizes` when given."""
    if path is None:
        text = resources.files("localinfer").joinpath("data/bench_prompts.jsonl").read_text("utf-8")
        origin = "bench_prompts.jsonl"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidParameterError(f"--prompts {path}: {exc.strerror}") from None
        origin = str(path)
    prompts = [
        _parse_line(line, origin, n)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if sizes:
        prompts = [p for p in prompts if p.size in sizes]
    if not prompts:
        which = f" of size {', '.join(sizes)}" if sizes else ""
        raise InvalidParameterError(f"{origin}: no prompts{which}")
    return prompts


def _parse_line(line: str, origin: str, n: int) -> BenchPrompt:
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidParameterError(f"{origin}:{n}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{origin}:{n}: expected a JSON object")
    if "messages" in data:
        messages = data["messages"]
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages
        )  # fmt: skip
        if not ok:
            raise InvalidParameterError(
                f"{origin}:{n}: 'messages' must be a list of {{role, content}} strings"
            )
    elif isinstance(data.get("prompt"), str):
        messages = [{"role": "user", "content": data["prompt"]}]
    else:
        raise InvalidParameterError(f"{origin}:{n}: needs 'messages' or 'prompt'")
    return BenchPrompt(
        id=str(data.get("id", f"line-{n}")),
        size=str(data.get("size", "custom")),
        messages=tuple({"role": m["role"], "content": m["content"]} for m in messages),
    )
