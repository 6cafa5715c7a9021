"""What the user can change in the chat: sampling (next message) and model set-up (reload)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # imported when first used: `localinfer chat` starts loading before it
    from localinfer.engine.types import SamplingParams

SpeculativeMode = Literal["off", "ngram", "draft"]
SPECULATIVE_MODES: tuple[str, ...] = ("off", "ngram", "draft")
BACKENDS: tuple[str, ...] = ("auto", "llamacpp", "torch", "mlx")
QUANTS: tuple[str, ...] = ("file", "Q8_0", "Q4_1", "Q4_0", "int8", "int4", "bf16", "fp32")
# A conversation past the context (#39, localinfer/context_fit.py), and the kept turns' KV after a
# cut: "shift" moves it into place (llama.cpp shifts positions, torch/MLX turn the keys: an
# approximation), "prefill" computes it again (exact).
OVERFLOW_POLICIES: tuple[str, ...] = ("drop-oldest", "summarize", "stop")
CUT_KV_MODES: tuple[str, ...] = ("shift", "prefill")
# The engine's --cache-reuse for the chat when cuts shift the KV: a cut's kept turns are one
# cached run of hundreds of tokens; 64 keeps short coincidental matches from moving.
CHAT_CHUNK_REUSE = 64

# Changing any of these rebuilds the runner (and its KV cache); the rest apply to the next message.
RELOAD_FIELDS = frozenset({"model", "ctx", "slots", "quant", "backend", "speculative", "draft"})


@dataclass(slots=True, frozen=True)
class ChatSettings:
    model: str | None = None  # None: the embedded default model
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    ctx: int = 2048
    slots: int = 1
    threads: int | None = None  # None: the backend's default (physical cores)
    quant: str | None = None  # None: keep the file's own
    backend: str | None = None  # None: pick for this machine
    speculative: SpeculativeMode = "off"
    draft: str | None = None  # draft model for speculative == "draft"
    # A thinking model's (tools/thinking.py; no effect on one that does not think): whether it
    # reasons before it answers, and at most how many reasoning tokens (None: no cap).
    thinking: bool = True
    thinking_budget: int | None = None
    context_overflow: str = "drop-oldest"  # one of OVERFLOW_POLICIES
    cut_kv: str = "shift"  # one of CUT_KV_MODES

    @property
    def chunk_reuse(self) -> int:
        """The engine's cache reuse (min chunk; 0: off) these settings load with."""
        shifts = self.cut_kv == "shift" and self.context_overflow != "stop"
        return CHAT_CHUNK_REUSE if shifts else 0

    def sampling_params(self, stop: tuple[str, ...] = ()) -> SamplingParams:
        """Raises pydantic's ValidationError when out of range (the settings form checks)."""
        from localinfer.engine.types import SamplingParams

        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop,
        )

    def validated(self) -> ChatSettings:
        """Self, or InvalidParameterError naming what is out of range."""
        from pydantic import ValidationError

        from localinfer.errors import InvalidParameterError

        try:
            self.sampling_params()
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidParameterError(f"{first['loc'][0]}: {first['msg']}") from None
        budget = self.thinking_budget
        if budget is not None and budget < 0:
            raise InvalidParameterError(f"thinking budget: must be >= 0, got {budget}")
        return self

    def reload_needed(self, other: ChatSettings) -> bool:
        """True when going from ``self`` to ``other`` needs the model (or its cache) rebuilt."""
        fields_differ = any(getattr(self, f) != getattr(other, f) for f in RELOAD_FIELDS)
        return fields_differ or self.chunk_reuse != other.chunk_reuse

    def changed(self, **updates: Any) -> ChatSettings:
        return replace(self, **updates)

    def describe(self) -> str:
        spec = self.speculative if self.speculative != "draft" else f"draft:{self.draft}"
        return (
            f"temp {self.temperature:g} · top_p {self.top_p:g} · max {self.max_tokens} · "
            f"ctx {self.ctx} · slots {self.slots} · quant {self.quant or 'file'} · "
            f"{self.backend or 'auto'} · spec {spec}{self._thinking_words()}"
            f"{self._overflow_words()}"
        )

    def _overflow_words(self) -> str:
        """The overflow settings where they are not the default."""
        words = (
            "" if self.context_overflow == "drop-oldest" else f" · overflow {self.context_overflow}"
        )
        return words + (" · cut re-prefills" if self.cut_kv == "prefill" else "")

    def _thinking_words(self) -> str:
        """The thinking settings where they are not the default (a model that does not think
        ignores them, and the summary stays as it was)."""
        if not self.thinking:
            return " · thinking off"
        if self.thinking_budget is not None:
            return f" · thinking ≤ {self.thinking_budget} tok"
        return ""


def field_names() -> list[str]:
    return [f.name for f in fields(ChatSettings)]
