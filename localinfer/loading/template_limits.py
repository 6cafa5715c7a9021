"""Bounds on what an untrusted chat template may do while it renders.

Jinja2's sandbox keeps a template away from Python internals, but not from running for ever or
filling memory: ``{% for i in range(100000) %}{% for j in range(100000) %}`` loops 10^10 times,
and ``{% set ns.s = ns.s ~ ns.s %}`` in a loop doubles a string each time. ``BoundedSandbox``
gives each render a ``RenderBudget`` (held in a ContextVar, so renders in several server threads
never share one) and:

- every loop iteration and every ``range()`` item counts against ``max_iterations``: each ``for``
  iterable is wrapped at compile time (``bound_loops``), ``range`` is replaced;
- every sandboxed operation (attribute and item access, call, intercepted operator) counts
  against ``max_steps``, with a wall-clock check as a backstop;
- every string or list the template builds (``~``, ``+``, ``*``, ``%``, padding, ``join``,
  ``replace``, the output itself) is sized before it is built and must stay under a limit that
  grows with the size of the input (messages, tools).

Any excess raises ``TemplateLimitExceeded`` with a one-line reason.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

ITER_GLOBAL = "_bounded_iter"
CONCAT_GLOBAL = "_bounded_concat"


class TemplateLimitExceeded(Exception):
    """A render went past its budget; the message is the one-line reason."""


@dataclass(slots=True, frozen=True)
class Limits:
    # A real template walks the messages once or twice (plus tools and content parts): a long
    # agent session is a few thousand iterations and some tens of thousands of steps.
    max_iterations: int = 200_000
    max_steps: int = 2_000_000
    max_seconds: float = 10.0
    base_chars: int = 4_000_000
    chars_per_input_char: int = 4

    def max_chars(self, input_chars: int) -> int:
        return self.base_chars + self.chars_per_input_char * input_chars


DEFAULT_LIMITS = Limits()


class RenderBudget:
    """What one render (or one compile: Jinja folds constant expressions then) has used."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, input_chars: int = 0) -> None:
        self.limits = limits
        self.max_chars = limits.max_chars(input_chars)
        self.iterations = 0
        self.steps = 0
        self.output_chars = 0
        self._deadline = time.monotonic() + limits.max_seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise TemplateLimitExceeded(f"more than {self.limits.max_steps} operations")
        if not self.steps & 1023 and time.monotonic() > self._deadline:
            raise TemplateLimitExceeded(f"rendering took more than {self.limits.max_seconds} s")

    def iterate(self, n: int = 1) -> None:
        self.iterations += n
        if self.iterations > self.limits.max_iterations:
            raise TemplateLimitExceeded(
                f"more than {self.limits.max_iterations} loop iterations in one render"
            )
        self.step()

    def size(self, n: int, what: str = "a string", unit: str = "characters") -> None:
        """Refuse to build something of ``n`` characters (items, bytes)."""
        if n > self.max_chars:
            raise TemplateLimitExceeded(f"{what} of {n} {unit} (limit {self.max_chars})")

    def output(self, n: int) -> None:
        self.output_chars += n
        self.size(self.output_chars, "output")
        self.step()


_ACTIVE: ContextVar[RenderBudget | None] = ContextVar("template_render_budget", default=None)


def _budget() -> RenderBudget:
    # Outside a ChatTemplate render (someone using the environment directly) sizes are still
    # bounded; counts start afresh each time.
    return _ACTIVE.get() or RenderBudget()


@contextmanager
def active_budget(budget: RenderBudget) -> Iterator[RenderBudget]:
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def text_size(value: Any, depth: int = 0) -> int:
    """Characters of text in a render context (messages, tools): the output limit grows with it."""
    if isinstance(value, str):
        return len(value)
    if depth > 64:
        return 0
    if isinstance(value, dict):
        return sum(text_size(k, depth + 1) + text_size(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(text_size(v, depth + 1) for v in value)
    return 0


# -- loops and range ---------------------------------------------------------------------------


def bounded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.iterate()
        yield item


class BoundedRange:
    """``range`` whose items count as loop iterations wherever they are consumed."""

    def __init__(self, *args: int) -> None:
        self._range = range(*args)
        _budget().size(len(self._range), "a range", "items")

    def __len__(self) -> int:
        return len(self._range)

    def __iter__(self) -> Iterator[int]:
        return bounded_iter(self._range)

    def __reversed__(self) -> Iterator[int]:
        return bounded_iter(reversed(self._range))

    def __getitem__(self, index: Any) -> Any:
        item = self._range[index]
        return BoundedRange(item.start, item.stop, item.step) if isinstance(item, range) else item

    def __contains__(self, value: object) -> bool:
        return value in self._range

    def __repr__(self) -> str:
        return repr(self._range)


def bounded_concat(*parts: Any) -> str:
    """Jinja's ``~``: sized before joining."""
    texts = [str(p) for p in parts]
    budget = _budget()
    budget.size(sum(map(len, texts)))
    budget.step()
    return "".join(texts)


class _BoundLoops(NodeTransformer):
    """Compile ``{% for x in SEQ %}`` as ``for x in _bounded_iter(SEQ)`` and ``a ~ b`` as
    ``_bounded_concat(a, b)``; the sandbox's hooks see neither otherwise."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _call(ITER_GLOBAL, [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _call(CONCAT_GLOBAL, list(node.nodes), node.lineno)


def _call(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.Name(name, "load", lineno=lineno), args, [], None, None, lineno=lineno)


def bound_loops(tree: nodes.Template, env: Any) -> nodes.Template:
    tree = _BoundLoops().visit(tree)
    tree.set_environment(env)
    return tree


# -- operators, string methods and filters that size their result from an argument -------------

_PRINTF_WIDTH = re.compile(r"%[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*?:[^{}]*?(\d+)[^{}]*\}")


def _check_printf(fmt: str, args: Any) -> None:
    budget = _budget()
    values = args if isinstance(args, tuple) else (args,)
    for width, precision in _PRINTF_WIDTH.findall(fmt):
        for n in (width, precision):
            if n == "*":
                for v in values:
                    if isinstance(v, int):
                        budget.size(abs(v), "a formatted field")
            elif n:
                budget.size(int(n), "a formatted field")


def _check_format(fmt: str) -> None:
    for n in _FORMAT_WIDTH.findall(fmt):
        _budget().size(int(n), "a formatted field")


def check_binop(operator: str, left: Any, right: Any) -> None:
    budget = _budget()
    budget.step()
    seqs = str | list | tuple
    if operator == "*":
        if isinstance(right, seqs) and isinstance(left, int):
            left, right = right, left
        if isinstance(left, seqs) and isinstance(right, int):
            budget.size(len(left) * right, *_kind(left))
    elif operator == "+":
        if isinstance(left, seqs) and isinstance(right, seqs):
            budget.size(len(left) + len(right), *_kind(left))
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            budget.size(left.bit_length() * right // 8, "a number", "bytes")
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, right)


def _kind(value: Any) -> tuple[str, str]:
    return ("a string", "characters") if isinstance(value, str) else ("a list", "items")


def _join_size(sep: str, items: list[Any]) -> int:
    return sum(len(str(x)) for x in items) + len(sep) * max(len(items) - 1, 0)


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Size what a ``str`` method will build; returns the (possibly materialised) args."""
    _budget().step()
    target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(target, "__self__", None)
    if not isinstance(owner, str):
        return args
    name = getattr(target, "__name__", "")
    budget = _budget()
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        budget.size(args[0])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            budget.size(len(owner) * max(size, 1))
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        old, new = args[0], args[1]
        if isinstance(new, str):
            hits = owner.count(old)
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                hits = min(hits, args[2])
            budget.size(len(owner) + hits * max(len(new) - len(old), 0))
    elif name == "join" and args:
        items = list(bounded_iter(args[0]))
        budget.size(_join_size(owner, items))
        args = (items, *args[1:])
    elif name in ("format", "format_map"):
        _check_format(owner)
    return args


def _skip_pass_arg(args: tuple[Any, ...]) -> int:
    """Index of a filter's value: filters marked pass_context/pass_eval_context get that first."""
    return 1 if args and isinstance(args[0], Context | EvalContext) else 0


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _guard_center(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    width = _arg(args, kwargs, 1, "width", 80)
    if isinstance(width, int):
        _budget().size(width)


def _guard_indent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    text, width = str(args[0]), _arg(args, kwargs, 1, "width", 4)
    pad = width if isinstance(width, int) else len(str(width))
    _budget().size(len(text) + max(pad, 0) * (text.count("\n") + 1))


def _guard_wordwrap(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    text, width = str(args[0]), _arg(args, kwargs, 1, "width", 79)
    wrap = _arg(args, kwargs, 3, "wrapstring", None) or "\n"
    if isinstance(width, int):
        _budget().size(len(text) + (len(text) // max(width, 1) + 1) * len(str(wrap)))


def _guard_replace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    text = str(args[0])
    old, new = str(_arg(args, kwargs, 1, "old", "")), str(_arg(args, kwargs, 2, "new", ""))
    _budget().size(len(text) + text.count(old) * max(len(new) - len(old), 0))


def _guard_format(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _check_printf(str(args[0]), tuple(args[1:]))


def _guard_slice(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    slices = _arg(args, kwargs, 1, "slices", 1)
    if isinstance(slices, int):
        _budget().iterate(max(slices, 0))


def _guard_tojson(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    indent = _arg(args, kwargs, 2, "indent", None)
    if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
        raise TemplateLimitExceeded("tojson indent wider than 64")


_FILTER_GUARDS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], None]] = {
    "center": _guard_center,
    "indent": _guard_indent,
    "wordwrap": _guard_wordwrap,
    "replace": _guard_replace,
    "format": _guard_format,
    "slice": _guard_slice,
    "tojson": _guard_tojson,
}


def _guarded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    guard = _FILTER_GUARDS.get(name)

    @functools.wraps(fn)  # keeps jinja's pass_context/pass_eval_context marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.step()
        skip = _skip_pass_arg(args)
        if guard is not None and len(args) > skip:
            guard(args[skip:], kwargs)
        if name == "join" and len(args) > skip:
            # materialise (counted) and size before the join is built
            items = list(bounded_iter(args[skip]))
            sep = _arg(args[skip:], kwargs, 1, "d", "")
            budget.size(_join_size(str(sep), items))
            args = (*args[:skip], items, *args[skip + 1 :])
        return fn(*args, **kwargs)

    return wrapper


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every render bounded by the active RenderBudget."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["range"] = BoundedRange
        self.globals[ITER_GLOBAL] = bounded_iter
        self.globals[CONCAT_GLOBAL] = bounded_concat
        self.globals.pop("lipsum", None)  # lipsum(n=10**9): no chat template needs it
        self.filters = {name: _guarded_filter(name, fn) for name, fn in self.filters.items()}

    def guard_filter(self, name: str) -> None:
        """Wrap a filter added after construction (tojson here)."""
        self.filters[name] = _guarded_filter(name, self.filters[name])

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().step()
        return super().getitem(obj, argument)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        args = check_call(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)
