"""Embedding requests in the engine: a batch of inputs is one prefill-only job.

    handle = engine.embed(EmbeddingRequest([ids_a, ids_b], pooling="mean"))
    result = handle.result()        # result.vectors: [2, hidden] float32, unit rows

Design: jobs wait in the engine's queue (they count against ``max_queue`` with the generation
requests) and run on the engine thread after each scheduler step's decode/prefill forward, with
what that step's ``prefill_chunk`` budget left after prompt prefills (at least one token). So a
running stream advances every step while a large job is embedded, as it does beside a long
prompt's chunked prefill, and its tokens are the same as without the job: the job runs in the
runner's scratch KV (an ``EmbeddingPass``), never in a slot, so no slot is taken and no cached
prefix is evicted. A job's inputs are grouped into passes by length (``plan_embedding_passes``:
a pass holds at most one slot's worth of cells), which run one after another; the vectors come
back in input order.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from localinfer.backends.base import (
    POOLINGS,
    EmbeddingPass,
    EmbeddingRunner,
    Pooling,
    plan_embedding_passes,
)
from localinfer.errors import ContextOverflowError, InvalidParameterError, LocalinferError

log = logging.getLogger(__name__)


class EmbeddingError(LocalinferError, http_status=500, code="embedding_failed"):
    """An embedding job failed in the runner, or was aborted before it finished."""


@dataclass(slots=True)
class EmbeddingRequest:
    """Token ids to embed (each input its own vector). ``request_id`` is assigned when empty."""

    inputs: list[list[int]]
    pooling: Pooling = "mean"
    request_id: str = ""


@dataclass(slots=True, frozen=True)
class EmbeddingResult:
    request_id: str
    vectors: np.ndarray  # [inputs, hidden] float32, each row of unit L2 norm, input order
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
    if request.pooling not in POOLINGS:
        raise InvalidParameterError(
            f"pooling: {request.pooling!r} is not one of {', '.join(POOLINGS)}"
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


class EmbeddingQueue:
    """Embedding jobs, first come first served; the engine thread runs them piece by piece."""

    def __init__(self, max_cells: int) -> None:
        self._max_cells = max_cells
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

    def step(self, runner: object, budget: int) -> int:
        """Run up to ``budget`` tokens of the first job; returns how many ran. ``runner`` is an
        EmbeddingRunner (Engine.embed checked it before queueing)."""
        job = self._head()
        if job is None:
            return 0
        try:
            if job.running is None:
                assert isinstance(runner, EmbeddingRunner)
                group = job.passes[job.next_pass]
                inputs = [job.request.inputs[i] for i in group]
                job.running = runner.start_embedding(inputs, job.request.pooling)
            ran = job.running.feed(budget)
            if job.running.done:
                self._pass_done(job)
        except Exception as exc:  # noqa: BLE001 - only this job fails; the engine goes on
            log.exception("embedding %s failed", job.request.request_id)
            self._end(job, None, f"{type(exc).__name__}: {exc}")
            return 0
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
