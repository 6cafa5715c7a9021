"""Typed errors: every failure a user can cause has a class here and a one-line message.

The CLI prints ``str(error)`` and exits non-zero; the server maps ``http_status``/``code`` to
OpenAI's error JSON. Nothing user-facing should surface as a bare traceback.
"""

from __future__ import annotations


class LocalinferError(Exception):
    """Base class: a clear, user-facing failure.

    A subclass names its HTTP status and error code in its class line, ``class
    QueueFullError(LocalinferError, http_status=503, code="server_busy")``; what it leaves out it
    inherits.
    """

    http_status = 500
    code = "internal_error"

    def __init_subclass__(
        cls, *, http_status: int | None = None, code: str | None = None, **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        if http_status is not None:
            cls.http_status = http_status
        if code is not None:
            cls.code = code


class UnknownModelError(LocalinferError, http_status=404, code="model_not_found"):
    """A name that is no catalog entry, local file or cached repository."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        hint = f" Did you mean: {', '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(
            f"unknown model '{name}': not a catalog name, local file or cached repo.{hint}"
        )


class ModelFileError(LocalinferError, http_status=500, code="model_file_error"):
    """A model file is missing, truncated or malformed."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class UnsupportedModelError(LocalinferError, http_status=400, code="unsupported_model"):
    """A model file or directory in a form or architecture localinfer does not run."""


class ContextOverflowError(LocalinferError, http_status=400, code="context_length_exceeded"):
    """A prompt (or prompt plus answer) longer than the context: refused, never truncated."""

    def __init__(self, requested: int, limit: int, what: str = "the prompt") -> None:
        self.requested = requested
        self.limit = limit
        # OpenAI's own opening words: clients that trim a conversation and retry (litellm's
        # ContextWindowExceededError, LangChain's trimming) recognise the error by them.
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, your request "
            f"resulted in {requested} tokens ({what}). Shorten it or raise --ctx; nothing was "
            "truncated."
        )


class InvalidParameterError(LocalinferError, http_status=400, code="invalid_parameter"):
    """A setting or request parameter out of range or inconsistent with the others."""


class QueueFullError(LocalinferError, http_status=503, code="server_busy"):
    """Every slot and every queue place is taken; retry later."""


class OutOfMemoryBudgetError(LocalinferError, http_status=507, code="insufficient_memory"):
    """The model, its KV cache and overhead do not fit the memory available."""


class BackendUnavailableError(LocalinferError, http_status=500, code="backend_unavailable"):
    """The backend asked for is not installed or cannot run on this machine."""
