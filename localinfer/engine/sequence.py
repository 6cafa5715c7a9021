"""The state of one request inside the engine, from submission to its last event."""

from __future__ import annotations

from collections.abc import Callable

from localinfer.engine.detokenizer import Detokenizer
from localinfer.engine.metrics import RequestTiming
from localinfer.engine.sampler import TokenSampler
from localinfer.engine.types import FinishReason, Request, RequestMetrics, StreamEvent

EventSink = Callable[[StreamEvent], None]


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
