"""Typed errors: every failure a user can cause has a class here and a one-line message.

The CLI prints ``str(error)`` and exits non-zero; the server maps ``http_status``/``code`` to
OpenAI's error JSON. Nothing user-facing should surface as a bare traceback.
"""

from __future__ import annotations


class LocalinferError(Exception):
    """Base class: a clear, user-facing failure."""

    http_status = 500
    code = "internal_error"


class UnknownModelError(LocalinferError):
    http_status = 404
    code = "model_not_found"

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        hint = f" Did you mean: {', '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(
            f"unknown model '{name}': not a catalog name, local file or cached repo.{hint}"
        )


class ModelFileError(LocalinferError):
    """A model file is missing, truncated or malformed."""

    http_status = 500
    code = "model_file_error"

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class UnsupportedModelError(LocalinferError):
    http_status = 400
    code = "unsupported_model"


class ContextOverflowError(LocalinferError):
    http_status = 400
    code = "context_length_exceeded"

    def __init__(self, requested: int, limit: int, what: str = "prompt") -> None:
        self.requested = requested
        self.limit = limit
        super().__init__(
            f"{what} needs {requested} tokens but the context holds {limit}; "
            "shorten it or raise --ctx (nothing was truncated)"
        )


class InvalidParameterError(LocalinferError):
    http_status = 400
    code = "invalid_parameter"


class QueueFullError(LocalinferError):
    http_status = 503
    code = "server_busy"


class OutOfMemoryBudgetError(LocalinferError):
    http_status = 507
    code = "insufficient_memory"


class BackendUnavailableError(LocalinferError):
    http_status = 500
    code = "backend_unavailable"
