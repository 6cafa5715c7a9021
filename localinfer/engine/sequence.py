"""The state of one request inside the engine, from submission to its last event."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.backends.base import RunnerSampling
from localinfer.engine.detokenizer import Detokenizer
from localinfer.engine.metrics import RequestTiming
from localinfer.engine.reasoning import ReasoningSplitter
from localinfer.engine.sampler import TokenSampler
from localinfer.engine.types import FinishReason, Request, RequestMetrics, StreamEvent

EventSink = Callable[[StreamEvent], None]


@dataclass(slots=True, frozen=True)
class AppendedToken:
    """What one sampled token added to a request."""

    text: str  # new text to show (empty for a stop token, or while the detokenizer holds it)
    finish_reason: FinishReason | None  # "stop" or "length" when this token ends the request
    reasoning: str = ""  # new reasoning text (a thinking request's)


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
        # Drawn inside the runner (engine/runner_sampling.py), decided at the first token.
        self.runner_sampling: RunnerSampling | None = None
        self.sampling_decided = False
        self.abort_requested = False  # set from any thread; the engine thread acts on it
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        spec = request.reasoning
        self.reasoning = None if spec is None else ReasoningSplitter(spec)
        self.thinking_budget = None if spec is None else spec.budget
        self.reasoning_tokens = 0  # output tokens inside the reasoning
        if self.reasoning is not None:
            sampler.defer_constraint()  # reasoning is free text; the constraint starts after
            if self.thinking_budget == 0 and self.reasoning.in_reasoning:
                sampler.force(request.reasoning.end_ids)  # opened by the prompt: close it now

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
        m = self.timing.metrics(self.prompt_len, self.num_output, self.cached_prompt_tokens)
        if self.reasoning is None:
            return m
        return dataclasses.replace(m, reasoning_tokens=self.reasoning_tokens)

    def split(self, text: str, token_in_reasoning: bool) -> tuple[str, str]:
        """``text`` as (reasoning, answer). Counts a token that came inside the reasoning
        block; forces the closing tag once the budget's count is reached (the tokens after the
        opening tag: a budget of N gives exactly N before the tag); starts the constraint when
        the answer begins, forcing the header that opens it first where the format has one
        (harmony's final channel)."""
        splitter = self.reasoning
        if splitter is None:
            return "", text
        reasoning, answer = splitter.feed(text)
        if token_in_reasoning:
            self.reasoning_tokens += 1
        spec = self.request.reasoning
        if splitter.answering:
            self.sampler.start_constraint()
        elif splitter.closed:
            if self.sampler.waiting and not self.sampler.forcing and spec is not None:
                self.sampler.force(spec.header_ids)
        elif (
            splitter.in_reasoning
            and self.thinking_budget is not None
            and self.reasoning_tokens >= self.thinking_budget
            and not self.sampler.forcing
        ):
            self.sampler.force(spec.end_ids)  # type: ignore[union-attr]
        return reasoning, answer

    def release_held(self, text: str, held: str) -> tuple[str, str]:
        """At the end: ``text`` (the last token's answer text, already split) and ``held`` (the
        detokenizer's last text) with whatever the splitter held, as (reasoning, answer)."""
        if self.reasoning is None:
            return "", text + held
        reasoning, answer = self.reasoning.feed(held)
        last_reasoning, last_answer = self.reasoning.finish()
        return reasoning + last_reasoning, text + answer + last_answer

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
        in_reasoning = self.reasoning is not None and self.reasoning.in_reasoning
        step = self.detokenizer.add(token)
        reasoning, text = self.split(step.text, in_reasoning)
        if step.stopped:
            return AppendedToken(text, "stop", reasoning)
        constraint = self.sampler.constraint
        if constraint is not None and constraint.is_finished():
            # Nothing may follow (a closed JSON object, a fully matched regex): the answer is
            # whole without waiting for an end-of-sequence token.
            return AppendedToken(text, "stop", reasoning)
        if self.num_output >= self.params.max_tokens:
            return AppendedToken(text, "length", reasoning)
        if len(self.tokens) > max_ctx:
            # The context is full: the new token cannot be fed back.
            return AppendedToken(text, "length", reasoning)
        return AppendedToken(text, None, reasoning)
