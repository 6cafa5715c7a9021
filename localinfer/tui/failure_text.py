"""How the chat words a failure: one clause for the error, and what to do next."""

from __future__ import annotations

from localinfer.errors import (
    LocalinferError,
    ModelFileError,
    OutOfMemoryBudgetError,
    UnknownModelError,
)


def load_hint(exc: BaseException) -> str:
    """What to do next after a failed model load."""
    if isinstance(exc, OutOfMemoryBudgetError):
        return "pick a smaller model (Ctrl+L) or lower the context, slots or quantization (Ctrl+S)"
    if isinstance(exc, (UnknownModelError, ModelFileError)):
        return "pick another model (Ctrl+L)"
    return "pick another model (Ctrl+L) or change the backend or quantization (Ctrl+S)"


def error_text(exc: BaseException) -> str:
    """One clause, without a final full stop (the UI adds what to do next after it)."""
    if isinstance(exc, LocalinferError):
        return str(exc).rstrip(". ")
    return f"unexpected {type(exc).__name__}: {exc}".rstrip(". ")
