"""Value objects that cross the engine's public seam (TUI, server, CLI, benchmarks read these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localinfer.backends.base import PromptImage
from localinfer.engine.constraint import ConstraintSource
from localinfer.engine.reasoning import ReasoningSpec

FinishReason = Literal["stop", "length", "abort", "error"]


class SamplingParams(BaseModel):
    """Per-request sampling; validated at the edge so the engine never sees a bad value."""

    # NaN fails every bound, so without allow_inf_nan=False it read "less than or equal to 5".
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=5.0)  # 0 means greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # 0 means off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Seen logits are divided by it in float32: below 0.01 a 100-logit overflows or the divisor
    # rounds to zero, so the floor is where the arithmetic stays finite, not a taste.
    repetition_penalty: float = Field(default=1.0, ge=0.01, le=10.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logprobs: int | None = Field(default=None, ge=0, le=20)  # top-N alternatives per token

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_tuple(cls, value: object) -> object:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        return value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class Request:
    """A tokenized request. ``request_id`` is assigned by the engine when empty.

    ``constraint`` (e.g. localinfer.constraints.CompiledConstraint) restricts every sampled token
    to what it allows; each sequence starts its own state from it, so a Request can be submitted
    again. A constrained request ends with "stop" once its constraint is finished, and never
    speculates."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    constraint: ConstraintSource | None = None
    # A thinking model's reasoning, split from the answer (engine/reasoning.py); None: the
    # output is all answer. A constraint then starts when the reasoning ends.
    reasoning: ReasoningSpec | None = None
    # The prompt's images (runner.vision's ImagePrompt): their positions in prompt_ids hold
    # placeholder ids (backends/prompt_images.py), fed to the runner as the images.
    images: tuple[PromptImage, ...] = ()


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    token_id: int
    text: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (token_id, text, logprob) alternatives


@dataclass(slots=True, frozen=True)
class RequestMetrics:
    """Timings of one request, in seconds (None until known)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    queued_s: float | None = None
    ttft_s: float | None = None  # submit -> first token
    tpot_s: float | None = None  # mean time per output token after the first
    decode_tps: float | None = None
    prefill_tps: float | None = None
    reasoning_tokens: int = 0  # of completion_tokens, those inside the reasoning


@dataclass(slots=True, frozen=True)
class StreamEvent:
    """One increment of a streamed answer. The last event has ``finish_reason`` set."""

    request_id: str
    text: str  # new text since the previous event (UTF-8 safe, never a partial stop string)
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    metrics: RequestMetrics | None = None
    stop_sequence: str | None = None  # the stop string that ended the answer ("stop" only)
    reasoning: str = ""  # new reasoning text (a thinking request's; ``text`` is the answer's)


@dataclass(slots=True, frozen=True)
class EngineMetrics:
    """Engine-wide snapshot (one place computes these; TUI, server and bench read them)."""

    slots_total: int
    slots_busy: int
    queue_depth: int
    kv_cells_used: int
    kv_cells_total: int
    requests_finished: int
    prompt_tokens_total: int
    completion_tokens_total: int
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    # Speculative decoding and prefix reuse fill these when enabled.
    spec_proposed: int = 0  # speculative tokens fed to the target for verification
    spec_accepted: int = 0  # of those, kept
    spec_verifications: int = 0  # slot decode steps that verified at least one proposal
    spec_acceptance_rate: float | None = None  # spec_accepted / spec_proposed
    spec_mean_accepted: float | None = None  # proposals kept per verification
    # Tokens emitted per slot decode step (1.0 without speculation): the speed-up's upper bound.
    tokens_per_target_forward: float | None = None
    cached_prompt_tokens_total: int = 0
    prefix_hits: int = 0  # finished requests that reused at least one cached prompt token
    # cached_prompt_tokens_total / prompt_tokens_total: the share of prompt tokens not prefilled
    prefix_hit_rate: float | None = None
    # Prompt tokens not prefilled, by where their KV came from (counted at admission): "slot"
    # (the slot's own cells), "copy" (another slot's), "ram" / "disk" (a KV tier, issue #24).
    reused_tokens_by_source: dict[str, int] = field(default_factory=dict)
    kv_transfer_failures: int = 0  # copies and restores that fell back to a cold prefill
    kv_ram_bytes: int = 0  # what the host-RAM KV tier holds now


@dataclass(slots=True)
class StepReport:
    """What one engine step did (tests assert admission and interleaving on these)."""

    step: int
    admitted: list[str] = field(default_factory=list)
    decoded: list[str] = field(default_factory=list)  # requests that fed one decode token
    proposed: dict[str, int] = field(default_factory=dict)  # request -> speculative tokens fed
    accepted: dict[str, int] = field(default_factory=dict)  # request -> proposals kept
    prefilled: dict[str, int] = field(default_factory=dict)  # request -> prompt tokens fed
    reused: dict[str, int] = field(default_factory=dict)  # request -> prompt tokens from cache
    # request -> where the reused tokens came from: "slot" | "copy" | "ram" | "disk"
    reuse_source: dict[str, str] = field(default_factory=dict)
    sampled: list[str] = field(default_factory=list)  # requests that got a new token
    finished: dict[str, str] = field(default_factory=dict)  # request -> finish reason
    embedded: int = 0  # tokens of embedding jobs run after the forward

    @property
    def batch_tokens(self) -> int:
        return len(self.decoded) + sum(self.proposed.values()) + sum(self.prefilled.values())
