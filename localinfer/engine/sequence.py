"""The state of one request inside the engine, from submission to its last event."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localinfer.engine.detokenizer import Detokenizer
from localinfer.engine.metrics import RequestTiming
from localinfer.engine.sampler import TokenSampler
from localinfer.engine.types import FinishReason, Request, RequestMetrics, StreamEvent

EventSink = Callable[[StreamEvent], None]


@dataclass(slots=True, frozen=True)
class AppendedToken:
    """What one sampled token added to a request."""

    text: str  # new text to show (empty for a stop token, or while the detokenizer holds it)
    finish_reason: FinishReason | None  # "stop" or "length" when this token ends the request


class Sequence:
    """One request: its tokens (prompt then output), sampler, detokenizer, timings and sink.

    ``tokens`` is prompt + output. The tokens whose KV the runner holds are the slot's
    ``cached`` list; ``tokens[len(slot.cached):]`` is what the next forward must feed (the whole
    rest of the prompt while prefilling, the one sampled token while decoding).
    """

    def __init__(
        self,
        request: Request,
        *,
        sampler: TokenSampler,
        detokenizer: Detokenizer,
        timing: RequestTiming,
        sink: EventSink,
        stop_ids: frozenset[int],
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.params = request.params
        self.prompt_len = len(request.prompt_ids)
        self.tokens: list[int] = list(request.prompt_ids)
        self.sampler = sampler
        self.detokenizer = detokenizer
        self.timing = timing
        self.sink = sink
        self.stop_ids = stop_ids  # eos (unless ignore_eos) + the request's stop_token_ids
        self.slot: int | None = None
        self.cached_prompt_tokens = 0  # prompt tokens reused from the slot's cache
        self.abort_requested = False  # set from any thread; the engine thread acts on it
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_len]

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def metrics(self) -> RequestMetrics:
        return self.timing.metrics(self.prompt_len, self.num_output, self.cached_prompt_tokens)

    def append_token(self, token: int, now: float, max_ctx: int) -> AppendedToken:
        """Add a sampled token (at clock time ``now``): its text, and whether it ends the
        request by a stop token or string, a finished constraint, ``max_tokens``, or a full
        context."""
        self.tokens.append(token)
        if self.timing.first_token is None:
            self.timing.first_token = now
        self.timing.last_token = now
        if token in self.stop_ids:
            return AppendedToken("", "stop")  # a stop/eos token's own text is never shown
        step = self.detokenizer.add(token)
        if step.stopped:
            return AppendedToken(step.text, "stop")
        constraint = self.sampler.constraint
        if constraint is not None and constraint.is_finished():
            # Nothing may follow (a closed JSON object, a fully matched regex): the answer is
            # whole without waiting for an end-of-sequence token.
            return AppendedToken(step.text, "stop")
        if self.num_output >= self.params.max_tokens:
            return AppendedToken(step.text, "length")
        if len(self.tokens) > max_ctx:
            # The context is full: the new token cannot be fed back.
            return AppendedToken(step.text, "length")
        return AppendedToken(step.text, None)
