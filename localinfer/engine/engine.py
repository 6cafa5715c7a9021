"""The Engine: one thread owns the runner; callers submit requests and read event streams.

    engine = Engine(runner, tokenizer)
    for event in engine.submit(Request(prompt_ids)):      # synchronous stream
        print(event.text, end="")
    result = engine.generate(Request(prompt_ids))          # whole answer
    async for event in engine.stream(Request(ids)): ...    # asyncio

``Engine(..., background=False)`` starts no thread: ``engine.step()`` then runs exactly one
scheduler step in the caller's thread, so tests can assert admission and interleaving by step
counts. Iterating a handle in that mode steps the engine itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from collections.abc import Sequence as Seq
from typing import Protocol

from localinfer.backends.base import EmbeddingRunner, Runner
from localinfer.engine.arrivals import Arrivals, gather_arrivals
from localinfer.engine.detokenizer import Detokenizer
from localinfer.engine.embedding import (
    EmbeddingHandle,
    EmbeddingJob,
    EmbeddingRequest,
    check_embedding_request,
)
from localinfer.engine.event_channel import EventChannel
from localinfer.engine.handle import GenerationResult, RequestHandle
from localinfer.engine.kv.store import KVStore
from localinfer.engine.metrics import Clock, MetricsRecorder, RequestTiming
from localinfer.engine.request_checks import check_request, text_ids
from localinfer.engine.runner_sampling import RunnerSamplingPolicy
from localinfer.engine.sampler import TokenSampler
from localinfer.engine.scheduler import Scheduler, StepReport
from localinfer.engine.sequence import EventSink, Sequence
from localinfer.engine.speculative import Speculator
from localinfer.engine.thread_calls import EngineCalls, T
from localinfer.engine.types import EngineMetrics, Request, StreamEvent
from localinfer.errors import (
    InvalidParameterError,
    QueueFullError,
    UnsupportedModelError,
)
from localinfer.thread_name import ENGINE_THREAD_NAME, name_this_thread

log = logging.getLogger(__name__)


class TokenizerLike(Protocol):
    """What the engine needs from a tokenizer (localinfer.loading.tokenizer.Tokenizer fits)."""

    @property
    def eos_ids(self) -> Iterable[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class Engine:
    """Continuous batching over one Runner, owned by one thread (or by ``step()`` callers).

    ``max_queue`` bounds the requests waiting for a slot (QueueFullError beyond it);
    ``prefill_chunk`` is the prompt-token budget of one step, shared by prefilling slots;
    ``prefix_reuse`` keeps finished slots' caches and starts a new request in the idle slot whose
    cache shares the longest prefix with its prompt;
    ``cache_reuse`` N (needs ``prefix_reuse``; 0, the default, is off) also reuses cached chunks of
    N+ tokens found later in the prompt, moving their KV instead of prefilling them: an
    approximation (a moved chunk's KV was computed without the new text before it;
    kv/chunk_reuse.py);
    ``sample_in_runner`` lets a runner that can draw the tokens of requests that need nothing
    from the host (engine/runner_sampling.py); off, every token is drawn on the host;
    ``speculator`` turns on speculative decoding (n-gram or draft-model proposals, per slot);
    ``kv_stores`` are KV tiers below the slots (a RAM tier, a disk tier: issue #24; they need
    ``prefix_reuse`` and a runner whose ``kv_cache`` has ``KVTransfer``): a slot's cells a new
    request drops go to the RAM tier, and a new request starts from the longest prefix held by
    its slot, another slot (copied) or a tier (restored), whichever is longest (kv/placement.py).
    The caller keeps ownership of the runner, of a draft model's runner and of the tiers.
    """

    def __init__(
        self,
        runner: Runner,
        tokenizer: TokenizerLike,
        *,
        max_queue: int = 64,
        prefill_chunk: int = 256,
        prefix_reuse: bool = False,
        cache_reuse: int = 0,
        speculator: Speculator | None = None,
        kv_stores: Seq[KVStore] = (),
        background: bool = True,
        eos_ids: Iterable[int] | None = None,
        metrics_window: int = 256,
        clock: Clock | None = None,
        sample_in_runner: bool = True,
    ) -> None:
        if cache_reuse < 0:
            raise ValueError(f"cache_reuse must be >= 0, got {cache_reuse}")
        if cache_reuse and not prefix_reuse:
            raise ValueError("cache_reuse needs prefix_reuse: idle slots keep no cache without it")
        self.runner = runner
        self.tokenizer = tokenizer
        # Sample only ids the tokenizer knows: some models pad the embedding past the vocab.
        self.vocab_size = min(runner.info.vocab_size, getattr(tokenizer, "vocab_size", 1 << 62))
        self.max_ctx = runner.info.max_ctx
        self.eos_ids = frozenset(tokenizer.eos_ids if eos_ids is None else eos_ids)
        self._recorder = MetricsRecorder(metrics_window, clock or time.perf_counter)
        self._live: dict[str, Sequence] = {}
        self._live_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._scheduler = Scheduler(
            runner,
            token_text=self._token_text,
            metrics=self._recorder,
            max_queue=max_queue,
            prefill_chunk=prefill_chunk,
            prefix_reuse=prefix_reuse,
            cache_reuse=cache_reuse,
            speculator=speculator,
            kv_stores=kv_stores,
            on_finish=self._forget,
            # Not when the runner's vocabulary has ids the tokenizer lacks (only the host cuts it).
            sampling=RunnerSamplingPolicy(
                runner,
                enabled=sample_in_runner and self.vocab_size == runner.info.vocab_size,
                speculating=speculator is not None,
            ),
        )
        self._wake = threading.Condition()
        self._calls = EngineCalls()  # persist_prefix, flush_kv: run between two steps
        self._closed = False
        self.arrivals: Arrivals | None = None  # a server's requests still being read (arrivals.py)
        self._thread: threading.Thread | None = None
        self._direct = threading.RLock()  # _on_engine_thread's calls run outside the loop
        self._named = threading.Event()
        if background:
            self._thread = threading.Thread(
                target=self._loop, name="localinfer-engine", daemon=True
            )
            self._thread.start()
            # A thread starts under its creator's kernel name (the loader's, say) until it renames
            # itself; waiting for that means no one ever sees the engine under another name.
            self._named.wait()

    # -- public API ------------------------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Queue a request; raises QueueFullError, ContextOverflowError or InvalidParameterError
        before any compute. Iterate the handle for its events."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: Iterable[Request]) -> list[RequestHandle]:
        """Queue several requests at once, all or none: they are admitted at the same step when
        slots allow (benchmarks, n > 1 choices)."""
        pump = None if self._thread is not None else self._pump
        handles: list[RequestHandle] = []
        items: list[tuple[Request, EventSink]] = []
        for request in requests:
            handle = RequestHandle("", abort=self.abort, pump=pump)
            handles.append(handle)
            items.append((request, handle.put))
        for handle, seq in zip(handles, self._enqueue_all(items), strict=True):
            handle.request_id = seq.request_id
        return handles

    def generate(self, request: Request) -> GenerationResult:
        """Run a request to the end and return the whole answer."""
        return self.submit(request).result()

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Async stream of a request's events; call it inside a running event loop.

        The request is validated and queued at once (errors raise here, before a server starts
        its response). Leaving the loop early (a client went away) aborts the request, which
        frees its slot at the next step."""
        events = EventChannel(asyncio.get_running_loop())  # event_channel.py: batched wake-ups
        seq = self._enqueue(request, events.post)
        return self._drain(seq, events)

    async def _drain(self, seq: Sequence, events: EventChannel) -> AsyncIterator[StreamEvent]:
        finished = False
        try:
            while not finished:
                if self._thread is None:
                    while events.empty():
                        self._pump()
                        await asyncio.sleep(0)  # let the mailbox's delivery run
                event = await events.get()
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                self.abort(seq.request_id)

    def embed(self, request: EmbeddingRequest) -> EmbeddingHandle:
        """Queue an embedding job (engine/embedding.py says how it shares the engine); raises
        QueueFullError, ContextOverflowError, InvalidParameterError or UnsupportedModelError
        before any compute. ``handle.result()`` waits for the vectors."""
        if self._closed:
            raise QueueFullError("engine is shutting down")
        if not isinstance(self.runner, EmbeddingRunner):
            raise UnsupportedModelError(
                f"the {self.runner.info.backend} runner does not compute embeddings"
            )
        check_embedding_request(request, self.vocab_size, self.max_ctx)
        request = dataclasses.replace(
            request,
            inputs=[[int(t) for t in ids] for ids in request.inputs],
            request_id=request.request_id or f"emb-{next(self._ids)}",
        )
        job: EmbeddingJob | None = None

        def abort() -> None:
            if job is not None:
                job.aborted = True
                with self._wake:
                    self._wake.notify()

        pump = None if self._thread is not None else self._pump
        handle = EmbeddingHandle(request.request_id, abort=abort, pump=pump)
        job = self._scheduler.embeddings.new_job(request, handle)
        self._scheduler.add_embedding(job)
        with self._wake:
            self._wake.notify()
        return handle

    def abort(self, request_id: str) -> bool:
        """Ask for a request to stop; it finishes with "abort" at the next step. False if the
        request is unknown or already finished."""
        with self._live_lock:
            seq = self._live.get(request_id)
        if seq is None or seq.finished:
            return False
        seq.abort_requested = True
        with self._wake:
            self._wake.notify()
        return True

    def step(self) -> StepReport:
        """Run one scheduler step in this thread (only for engines built with background=False)."""
        if self._thread is not None:
            raise RuntimeError("step() is for engines without a background thread")
        if self._closed:
            raise RuntimeError("engine is closed")
        return self._scheduler.step()

    def has_work(self) -> bool:
        return self._scheduler.has_work()

    def metrics(self) -> EngineMetrics:
        return self._scheduler.snapshot()

    def persist_prefix(self, tokens: Seq[int]) -> int:
        """Store the longest cached prefix of ``tokens`` (a slot's, or a tier's) into every KV
        tier (a chat closing a conversation), on the engine thread; returns its length or 0."""
        ids = [int(t) for t in tokens]
        return self._on_engine_thread(lambda: self._scheduler.placer.persist_prefix(ids))

    def flush_kv(self) -> int:
        """Every slot's cells into the tiers that outlive the process, RAM entries into their
        spill tier, on the engine thread (``close`` calls it); returns the entries written."""
        return self._on_engine_thread(self._scheduler.placer.flush)

    def close(self) -> None:
        """Stop the loop; requests still queued or running finish with "abort"; the slots'
        cells go to the KV tiers that outlive the process (``flush_kv``)."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._scheduler.fail_all("abort", "engine closed")
        if self._scheduler.placer.stores:
            try:
                self.flush_kv()  # the thread is gone: runs here, before the caller's runner goes
            except Exception:  # noqa: BLE001 - losing the tiers must not stop a shutdown
                log.exception("writing the KV tiers at close failed")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _enqueue(self, request: Request, sink: EventSink) -> Sequence:
        return self._enqueue_all([(request, sink)])[0]

    def _enqueue_all(self, items: list[tuple[Request, EventSink]]) -> list[Sequence]:
        """Validate and queue requests all-or-nothing, in one go (they can share a first step)."""
        if self._closed:
            raise QueueFullError("engine is shutting down")
        seqs: list[Sequence] = []
        try:
            for request, sink in items:
                seqs.append(self._make_sequence(request, sink))
            self._scheduler.add_all(seqs)
        except BaseException:
            for seq in seqs:
                self._forget(seq)
            raise
        with self._wake:
            self._wake.notify()
        return seqs

    def _make_sequence(self, request: Request, sink: EventSink) -> Sequence:
        check_request(request, self.vocab_size, self.max_ctx, self.runner)
        params = request.params
        with self._live_lock:
            # The caller's Request is left untouched (it may be submitted again).
            rid = request.request_id or f"req-{next(self._ids)}"
            if rid in self._live:
                raise InvalidParameterError(f"request id {rid!r} is in use")
            request = dataclasses.replace(
                request, prompt_ids=[int(t) for t in request.prompt_ids], request_id=rid
            )
            stop_ids = frozenset(params.stop_token_ids)
            # A constraint allows end-of-sequence only where the answer is whole: there it ends
            # the answer, ignore_eos or not.
            if not params.ignore_eos or request.constraint is not None:
                stop_ids |= self.eos_ids
            constraint = None if request.constraint is None else request.constraint.start()
            seq = Sequence(
                request,
                sampler=TokenSampler(
                    params, self.vocab_size, text_ids(request), constraint=constraint
                ),
                detokenizer=Detokenizer(self.tokenizer.token_bytes, params.stop),
                timing=RequestTiming(submitted=self._recorder.clock()),
                sink=sink,
                stop_ids=stop_ids,
            )
            self._live[seq.request_id] = seq
        return seq

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def _forget(self, seq: Sequence) -> None:
        with self._live_lock:
            if self._live.get(seq.request_id) is seq:
                del self._live[seq.request_id]

    def _pump(self) -> None:
        if not self._scheduler.has_work():
            raise RuntimeError("engine has no work but a request is still open")
        self.step()

    def _on_engine_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the runner's owner runs (the engine thread between two steps, or
        here when there is none or it has stopped) and return its result."""
        here = threading.current_thread()
        with self._wake:
            if self._thread is None or self._closed or here is self._thread:
                future = None
            else:
                future = self._calls.put(fn)
                self._wake.notify()
        if future is not None:
            return future.result()
        if self._thread is not None and here is not self._thread:
            self._thread.join()  # closed: the loop may still be inside a step; let it stop first
        with self._direct:  # callers running it here (close's flush, a late persist) take turns
            return fn()

    def _loop(self) -> None:
        name_this_thread(ENGINE_THREAD_NAME)
        self._named.set()
        while True:
            with self._wake:
                while not self._closed and not self._scheduler.has_work() and not self._calls:
                    self._wake.wait()
                closed = self._closed
            self._calls.run_all()
            if closed:
                return
            if not self._scheduler.has_work():
                continue
            s = self._scheduler  # from idle: no answer or embedding job waits on the pause
            if self.arrivals is not None and not (s.running or s.embeddings.has_work()):
                gather_arrivals(self.arrivals, self._wake, lambda: self._closed)
            try:
                self._scheduler.step()
            except Exception as exc:  # noqa: BLE001 - an engine bug must not hang every client
                log.exception("engine step failed; failing the requests in flight")
                self._scheduler.fail_all("error", f"engine error: {type(exc).__name__}: {exc}")
