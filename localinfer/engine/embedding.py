"""Embedding requests in the engine: a batch of inputs is one prefill-only job.

    handle = engine.embed(EmbeddingRequest([ids_a, ids_b], pooling="mean"))
    result = handle.result()        # result.vectors: [2, hidden] float32, unit rows

Design: jobs wait in the engine's queue (they count against ``max_queue`` with the generation
requests) and run on the engine thread after each scheduler step's decode/prefill forward. The
job runs in the runner's scratch KV (an ``EmbeddingPass``), never in a slot, so no slot is taken,
no cached prefix is evicted and a stream's tokens are the same as without the job. A job's inputs
are grouped into passes by length (``plan_embedding_passes``: a pass holds at most one slot's
worth of cells), which run one after another; the vectors come back in input order.

How much a step runs (``EmbeddingPacer``): with no stream decoding, what the step's
``prefill_chunk`` budget left after prompt prefills (at least one token: prompts go first, and
the job always advances). Beside decoding streams, slices of at least ``EMBED_SLICE_TOKENS``,
and only while the job's time stays within ``EMBED_TIME_SHARE`` of the time the engine spends on
everything else, so the streams keep most of their speed (per-step token caps alone do not: the
job's whole cost still lands between the streams' tokens).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from localinfer.backends.base import (
    EmbeddingPass,
    EmbeddingRunner,
    plan_embedding_passes,
)
from localinfer.errors import (
    ContextOverflowError,
    InvalidParameterError,
    LocalinferError,
    UnsupportedModelError,
)
from localinfer.facts.pooling import POOLINGS, RANK, PassKind

log = logging.getLogger(__name__)

# While streams decode, a job may take this share of the engine thread's time, counted against
# the time spent on everything else (the streams' forwards, sampling, events): decode then runs at
# about 1 / (1 + share) of its speed alone, 0.67x, instead of stalling while the job takes each
# step's whole prefill budget. scripts/bench-embeddings measures 0.66x on torch and llama.cpp
# (docs/measurements.md, "Embeddings beside decoding streams").
EMBED_TIME_SHARE = 0.5
# The smallest feed while streams decode (a feed runs more when its credit pays for more): small
# enough that one feed stalls a stream for a few decode steps only, large enough to be efficient:
# at 8 tokens torch's native kernels reach their 32-token rate, 4 tokens run a quarter slower
# (docs/measurements.md, "Embedding feed size").
EMBED_SLICE_TOKENS = 8


class EmbeddingError(LocalinferError, http_status=500, code="embedding_failed"):
    """An embedding job failed in the runner, or was aborted before it finished."""


@runtime_checkable
class RankRunner(Protocol):
    """A runner that scores with a reranker's head (llama.cpp's rank pooling): a pass like an
    embedding's, whose ``vectors()`` are each input's head outputs (the score first), not unit
    vectors."""

    def start_rank(self, inputs: Sequence[Sequence[int]]) -> EmbeddingPass: ...


def check_ranks(runner: object) -> None:
    """UnsupportedModelError unless ``runner`` computes rerank scores (RankRunner)."""
    if not isinstance(runner, RankRunner):
        backend = getattr(getattr(runner, "info", None), "backend", "this")
        raise UnsupportedModelError(
            f"the {backend} runner computes no rerank scores (llama.cpp's rank pooling); "
            "run the reranker with --backend llamacpp"
        )


@dataclass(slots=True)
class EmbeddingRequest:
    """Token ids to embed (each input its own vector). ``request_id`` is assigned when empty.
    ``pooling`` RANK scores each input with a reranker's head (a RankRunner's ``start_rank``):
    the result's rows are then the head's outputs, not unit vectors."""

    inputs: list[list[int]]
    pooling: PassKind = "mean"
    request_id: str = ""


@dataclass(slots=True, frozen=True)
class EmbeddingResult:
    request_id: str
    vectors: np.ndarray  # [inputs, hidden] float32, unit rows, input order (RANK: head outputs)
    prompt_tokens: int  # tokens embedded, all inputs together


class EmbeddingHandle:
    """What the caller holds for one embedding job; ``result()`` waits for it."""

    def __init__(
        self,
        request_id: str,
        *,
        abort: Callable[[], None],
        pump: Callable[[], object] | None = None,
    ) -> None:
        self.request_id = request_id
        self._abort = abort
        self._pump = pump
        self._event = threading.Event()
        self._result: EmbeddingResult | None = None
        self._error: str | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> EmbeddingResult:
        """The vectors, once the job is done; EmbeddingError when it failed or was aborted,
        TimeoutError after ``timeout`` seconds."""
        if self._pump is not None:
            while not self._event.is_set():
                self._pump()
        elif not self._event.wait(timeout):
            raise TimeoutError(f"embedding {self.request_id} not done after {timeout} s")
        if self._result is None:
            raise EmbeddingError(self._error or "embedding failed")
        return self._result

    def abort(self) -> None:
        """Stop the job: it is dropped at the next step (finished jobs are left as they are)."""
        if not self.done:
            self._abort()

    def finish(self, result: EmbeddingResult | None, error: str | None = None) -> None:
        """Called by the engine thread, once."""
        self._result, self._error = result, error
        self._event.set()


@dataclass(slots=True, eq=False)
class EmbeddingJob:
    request: EmbeddingRequest
    handle: EmbeddingHandle
    passes: list[list[int]]  # input indices per pass, in the order they run
    vectors: np.ndarray | None = None  # [inputs, hidden], filled pass by pass
    next_pass: int = 0
    running: EmbeddingPass | None = None
    aborted: bool = False
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = sum(len(ids) for ids in self.request.inputs)


def check_embedding_request(request: EmbeddingRequest, vocab_size: int, max_ctx: int) -> None:
    """Refuse a request before it queues; messages name the field as the OpenAI body does."""
    if request.pooling not in (*POOLINGS, RANK):
        raise InvalidParameterError(
            f"pooling: {request.pooling!r} is not one of {', '.join((*POOLINGS, RANK))}"
        )
    if not request.inputs:
        raise InvalidParameterError("input: nothing to embed")
    for i, ids in enumerate(request.inputs):
        if not ids:
            raise InvalidParameterError(f"input[{i}]: empty; every input needs a token")
        bad = next((t for t in ids if not 0 <= int(t) < vocab_size), None)
        if bad is not None:
            raise InvalidParameterError(
                f"input[{i}]: token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
            )
        if len(ids) > max_ctx:  # an embedding generates nothing: the input alone must fit
            raise ContextOverflowError(len(ids), max_ctx, what=f"input[{i}]")


class EmbeddingPacer:
    """How many job tokens a step may run (module docstring); keeps the time-share account.

    ``credit`` is the time the job may still take: while streams decode it grows by ``share`` x
    the time spent since the last feed ended and shrinks by each feed's own time. A feed runs
    when it is not negative, so the job starts at once and then repays what it took; it runs as
    many tokens as the credit pays for at the last feed's time per token, at least
    ``slice_tokens`` (where feeds are cheap, as on a GPU, slices grow and feeds run every step;
    where a slice costs more than a step's credit, feeds skip steps). With no stream decoding
    the account is cleared."""

    def __init__(
        self,
        share: float = EMBED_TIME_SHARE,
        slice_tokens: int = EMBED_SLICE_TOKENS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if share <= 0 or slice_tokens < 1:
            raise ValueError(f"share must be > 0 and slice_tokens >= 1: {share}, {slice_tokens}")
        self.share = share
        self.slice_tokens = slice_tokens
        self.credit = 0.0  # seconds
        self._clock = clock
        self._fed_at: float | None = None  # when the last feed ended
        self._started_at = 0.0
        self._paced = False  # whether the feed under way is charged to the account
        self._per_token: float | None = None  # seconds per token of the last paced feed

    def budget(self, left: int, decoding: bool) -> int:
        """Tokens the job may run now (0: none this step); ``left``: what the step's prefill
        budget left; ``decoding``: whether a stream decoded in this step. A non-zero budget
        starts a feed: call ``fed`` when it ends."""
        now = self._clock()
        self._paced = decoding
        if not decoding:
            self.credit = 0.0
            allowed = max(1, left)
        else:
            if self._fed_at is not None:
                self.credit += self.share * (now - self._fed_at)
            self._fed_at = now
            if self.credit < 0:
                allowed = 0
            else:
                fits = int(self.credit / self._per_token) if self._per_token else 0
                allowed = min(max(self.slice_tokens, fits), max(1, left))
        self._started_at = now
        return allowed

    def fed(self, tokens: int) -> None:
        """The feed that ``budget`` allowed has ended after running ``tokens`` (0 when it
        failed); its time is charged when streams were decoding."""
        now = self._clock()
        if self._paced:
            took = now - self._started_at
            self.credit -= took
            if tokens > 0:
                self._per_token = took / tokens
        self._fed_at = now

    def reset(self) -> None:
        """No job left: the time until the next one is not the streams' to share."""
        self.credit = 0.0
        self._fed_at = None


def _start(runner: EmbeddingRunner, inputs: list[list[int]], kind: PassKind) -> EmbeddingPass:
    if kind == RANK:
        check_ranks(runner)
        assert isinstance(runner, RankRunner)
        return runner.start_rank(inputs)
    return runner.start_embedding(inputs, kind)


class EmbeddingQueue:
    """Embedding jobs, first come first served; the engine thread runs them piece by piece."""

    def __init__(self, max_cells: int, pacer: EmbeddingPacer | None = None) -> None:
        self._max_cells = max_cells
        self.pacer = pacer or EmbeddingPacer()
        self._jobs: deque[EmbeddingJob] = deque()
        self._lock = threading.Lock()

    def new_job(self, request: EmbeddingRequest, handle: EmbeddingHandle) -> EmbeddingJob:
        lengths = [len(ids) for ids in request.inputs]
        return EmbeddingJob(request, handle, plan_embedding_passes(lengths, self._max_cells))

    def add(self, job: EmbeddingJob) -> None:
        with self._lock:
            self._jobs.append(job)

    def depth(self) -> int:
        return len(self._jobs)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def step(self, runner: object, left: int, decoding: bool) -> int:
        """Run the first job for what the pacer allows (``left``: what the step's prefill budget
        left; ``decoding``: whether a stream decoded in this step); returns the tokens run.
        ``runner`` is an EmbeddingRunner (Engine.embed checked it before queueing)."""
        job = self._head()
        if job is None:
            self.pacer.reset()
            return 0
        budget = self.pacer.budget(left, decoding)
        if budget == 0:
            return 0
        ran = 0
        try:
            if job.running is None:
                assert isinstance(runner, EmbeddingRunner)
                group = job.passes[job.next_pass]
                inputs = [job.request.inputs[i] for i in group]
                job.running = _start(runner, inputs, job.request.pooling)
            ran = job.running.feed(budget)
            if job.running.done:
                self._pass_done(job)
        except Exception as exc:  # noqa: BLE001 - only this job fails; the engine goes on
            log.exception("embedding %s failed", job.request.request_id)
            self._end(job, None, f"{type(exc).__name__}: {exc}")
            ran = 0
        self.pacer.fed(ran)
        if not self._jobs:
            self.pacer.reset()
        return ran

    def fail_all(self, error: str) -> None:
        with self._lock:
            jobs, self._jobs = list(self._jobs), deque()
        for job in jobs:
            self._close(job)
            job.handle.finish(None, error)

    def _head(self) -> EmbeddingJob | None:
        """The first job not aborted (aborted ones end here, on the engine thread)."""
        while self._jobs:
            job = self._jobs[0]
            if not job.aborted:
                return job
            self._end(job, None, "aborted")
        return None

    def _pass_done(self, job: EmbeddingJob) -> None:
        assert job.running is not None
        vectors = job.running.vectors()  # [pass inputs, hidden]
        self._close(job)
        if job.vectors is None:
            job.vectors = np.empty((len(job.request.inputs), vectors.shape[1]), np.float32)
        job.vectors[job.passes[job.next_pass]] = vectors
        job.next_pass += 1
        if job.next_pass == len(job.passes):
            result = EmbeddingResult(job.request.request_id, job.vectors, job.tokens)
            self._end(job, result, None)

    def _end(self, job: EmbeddingJob, result: EmbeddingResult | None, error: str | None) -> None:
        self._close(job)
        with self._lock:
            if job in self._jobs:
                self._jobs.remove(job)
        job.handle.finish(result, error)

    @staticmethod
    def _close(job: EmbeddingJob) -> None:
        if job.running is not None:
            try:
                job.running.close()
            except Exception:  # noqa: BLE001 - the job ends either way
                log.exception("closing an embedding pass failed")
            job.running = None
