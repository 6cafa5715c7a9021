"""Small-slot continuous batching: one ``step()`` = admit, plan a ragged batch, forward, sample.

Each step:

1. requests whose abort was asked leave (queue or slot) and finish with ``"abort"``;
2. waiting requests take idle slots (first come, first served), so a slot freed by the previous
   step is refilled now. With ``prefix_reuse`` a finished slot keeps its KV, and a request starts
   from the longest prefix of its prompt held by its slot, another slot (copied; or it waits
   while a busy slot prefills it) or a KV tier (restored), and prefills the rest (kv.placement).
   The last prompt token is always fed again: its logits give the first new token.
   With ``cache_reuse`` N, cached chunks of N+ tokens found later in the prompt are moved into
   place rather than prefilled (``kv.chunk_reuse``: an approximation, off by default);
3. one ragged batch is planned: every decoding slot feeds its one sampled token, and prefilling
   slots share a per-step prompt-token budget (``prefill_chunk``) in admission order, so a long
   prompt is prefilled over several steps in the same forward as the decodes (``batch_plan``);
4. one ``Runner.forward`` (slot by slot when it fails: ``forward_fallback``); a slot whose
   pending input was all fed takes its next token, drawn by the runner or on the host
   (``runner_sampling``);
5. finished requests (stop, length, error) emit their last event and free their slot;
6. a waiting embedding job runs some tokens in the runner's scratch KV: what the prefill budget
   left, or beside decoding streams a paced slice (``embedding.EmbeddingPacer``).

With a :class:`~localinfer.engine.speculative.Speculator`, a decoding slot may feed its last
token plus k proposed tokens (``logits="all"``) in the same ragged forward; verification keeps a
prefix of the proposals plus the target's own next token, and the slot's KV is truncated back
past the last kept proposal. Greedy output is token-identical to decoding without it.

Only the engine thread calls ``step``; ``add`` and ``request_abort`` may come from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import numpy as np

from localinfer.backends.base import Runner
from localinfer.engine.batch_plan import PlannedWork, plan_batch, speculation_candidates
from localinfer.engine.embedding import EmbeddingJob, EmbeddingQueue
from localinfer.engine.forward_fallback import forward_each_isolated
from localinfer.engine.kv.placement import SlotPlacer
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.store import KVStore
from localinfer.engine.metrics import MetricsRecorder, Occupancy
from localinfer.engine.runner_sampling import RunnerSamplingPolicy, drawn_token
from localinfer.engine.sampler import SampledToken
from localinfer.engine.sequence import Sequence
from localinfer.engine.slots import Slot, SlotTable, empty_slot
from localinfer.engine.speculative import Proposal, Speculator
from localinfer.engine.types import (
    EngineMetrics,
    FinishReason,
    StepReport,
    StreamEvent,
    TokenLogprob,
)
from localinfer.errors import QueueFullError

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        runner: Runner,
        *,
        token_text: Callable[[int], str],
        metrics: MetricsRecorder,
        max_queue: int = 64,
        prefill_chunk: int = 256,
        prefix_reuse: bool = False,
        cache_reuse: int = 0,
        on_finish: Callable[[Sequence], None] | None = None,
        speculator: Speculator | None = None,
        kv_stores: Seq[KVStore] = (),
        sampling: RunnerSamplingPolicy | None = None,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.runner = runner
        self.max_ctx = runner.info.max_ctx
        self.slots = SlotTable(runner.info.slots)
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.prefix_reuse = prefix_reuse
        self.cache_reuse = cache_reuse  # min chunk length (kv.chunk_reuse); 0: prefix reuse only
        self.placer = SlotPlacer(runner, self.slots, kv_stores, prefix_reuse=prefix_reuse,
                                 cache_reuse=cache_reuse, prefill_chunk=prefill_chunk)  # fmt: skip
        # The RAM tier's holdings stay visible after transfers turned off (a failed one).
        self._ram_stores = [s for s in kv_stores if isinstance(s, RamKVStore)]
        self._token_text = token_text
        self._metrics = metrics
        self._on_finish = on_finish
        self.speculator, self.sampling = speculator, sampling  # sampling: engine/runner_sampling
        self._lock = threading.Lock()  # guards `waiting` and the metrics counters
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: prefill budget goes first-come
        # Embedding jobs: prefill-only, in the runner's scratch KV, never in a slot (embedding.py)
        self.embeddings = EmbeddingQueue(max_cells=self.max_ctx)
        self._step_no = 0

    # -- any thread ------------------------------------------------------------------------

    def add_all(self, seqs: list[Sequence]) -> None:
        """Queue requests all or none (QueueFullError when they do not all fit). Free slots
        count first: with N slots and ``max_queue`` Q, N + Q requests fit at once, even before
        the engine thread places any. A request is in ``waiting`` or in a slot, never between
        (``_admit`` moves it under the lock), so the count is exact whatever that thread does."""
        with self._lock:
            free = len(self.slots) - len(self.slots.busy())
            if self._queued() + len(seqs) > free + self.max_queue:
                raise QueueFullError(self._full_message(free, len(seqs)))
            self.waiting.extend(seqs)

    def _full_message(self, free: int, asked: int) -> str:  # waiting: beyond the free slots
        also = f"; {asked} requests asked at once" if asked > 1 else ""
        return (f"engine is busy: {len(self.slots) - free} of {len(self.slots)} slots taken and "
                f"{max(0, self._queued() - free)} requests waiting for one (queue limit "
                f"{self.max_queue}){also}; retry later")  # fmt: skip

    def add_embedding(self, job: EmbeddingJob) -> None:
        """Queue an embedding job (QueueFullError when the queue is full). The job running
        takes no queue place, as a request in a slot takes none."""
        with self._lock:
            if self.embeddings.depth() and self._queued() >= self.max_queue:
                raise QueueFullError(
                    f"engine is busy: {self._queued()} requests already waiting "
                    f"(queue limit {self.max_queue}); retry later"
                )
            self.embeddings.add(job)

    def _queued(self) -> int:
        """Requests holding a queue place: generation waiting for a slot, embedding jobs
        waiting behind the running one."""
        return len(self.waiting) + max(0, self.embeddings.depth() - 1)

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running) or self.embeddings.has_work()

    def snapshot(self) -> EngineMetrics:
        with self._lock:
            held = Occupancy(
                slots_total=len(self.slots),
                slots_busy=len(self.running),
                # Embedding jobs hold no slot: running or waiting, they show here.
                queue_depth=len(self.waiting) + self.embeddings.depth(),
                kv_cells_used=self.slots.cells_used(),
                kv_cells_total=len(self.slots) * self.max_ctx,
                kv_ram_bytes=sum(s.nbytes() for s in self._ram_stores),
            )
            return self._metrics.snapshot(held)

    # -- engine thread ---------------------------------------------------------------------

    def step(self) -> StepReport:
        report = StepReport(step=self._step_no)
        self._drop_aborted(report)
        self._admit(report)
        planned = self._plan(report)
        if planned:
            started = time.perf_counter()
            outputs = forward_each_isolated(self.runner, planned)
            if self.speculator is not None and self.speculator.measuring:
                plain = all(p.is_decode and p.proposal is None for p in planned)
                self.speculator.observe_forward(time.perf_counter() - started, plain)
            for item, out in zip(planned, outputs, strict=True):
                self._after_forward(item, out, report)
        if self.embeddings.has_work():
            # Prompts first; beside decoding streams the job is paced (embedding.EmbeddingPacer).
            left = self.prefill_chunk - sum(report.prefilled.values())
            report.embedded = self.embeddings.step(self.runner, left, bool(report.decoded))
        self._step_no += 1
        with self._lock:
            self._metrics.steps = self._step_no
        return report

    def fail_all(self, reason: FinishReason, error: str | None) -> None:
        """Finish every queued and running request (engine shutdown or an engine bug)."""
        with self._lock:
            waiting, self.waiting = list(self.waiting), deque()
        for seq in waiting + list(self.running):
            self._finish(seq, reason, error=error)
        self.embeddings.fail_all(error or reason)

    def _drop_aborted(self, report: StepReport) -> None:
        with self._lock:
            aborted = [s for s in self.waiting if s.abort_requested]
            if aborted:
                self.waiting = deque(s for s in self.waiting if not s.abort_requested)
        aborted += [s for s in self.running if s.abort_requested]
        for seq in aborted:
            self._finish(seq, "abort")
            report.finished[seq.request_id] = "abort"

    def _admit(self, report: StepReport) -> None:
        while True:
            with self._lock:
                if not self.waiting or not self.slots.free():
                    return
                seq = self.waiting[0]
            # Only this thread takes from `waiting` or changes slots, so the choice (which may
            # ask the KV tiers) needs no lock; add_all meanwhile only appends.
            # At least the last prompt token is always fed: its logits give the first token.
            placement = self.placer.place(seq.prompt_ids, limit=seq.prompt_len - 1)
            if placement is None:
                return  # a busy slot is prefilling this prompt's beginning: copy it then
            with self._lock:
                assert self.waiting[0] is seq
                self.waiting.popleft()
                # Taken in the same breath as the pop, so add_all never sees the request in
                # neither place (and a free slot twice).
                slot = placement.slot
                slot.seq = seq
                seq.slot = slot.index
            try:
                failures = self.placer.failures
                reuse, source = self.placer.prepare(placement, seq.prompt_ids)
            except Exception as exc:  # noqa: BLE001 - the runner cannot even empty the slot
                log.exception("preparing slot %d for %s failed", slot.index, seq.request_id)
                self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
                report.finished[seq.request_id] = "error"
                continue
            if self.speculator is not None:
                self.speculator.start(slot.index)
            seq.cached_prompt_tokens = reuse
            seq.timing.admitted = self._metrics.clock()
            self.running.append(seq)
            report.admitted.append(seq.request_id)
            with self._lock:
                self._metrics.kv_transfer_failures += self.placer.failures - failures
                if reuse:
                    self._metrics.reused_by_source[source] += reuse
            if reuse:
                report.reused[seq.request_id] = reuse
                report.reuse_source[seq.request_id] = source

    def _plan(self, report: StepReport) -> list[PlannedWork]:
        decoding = [seq for seq in self.running if seq.num_output > 0]
        proposals: dict[int, Proposal] = {}
        if self.speculator is not None and decoding:
            candidates = speculation_candidates(decoding, self.max_ctx)
            proposals = self.speculator.propose(candidates, busy=len(decoding))
        planned = plan_batch(self.running, self.slots, self.prefill_chunk, proposals, self.sampling)
        for item in planned:
            rid = item.seq.request_id
            if not item.is_decode:
                report.prefilled[rid] = len(item.work.tokens)
                continue
            report.decoded.append(rid)
            if item.proposal is not None:
                report.proposed[rid] = item.proposal.k
        return planned

    def _after_forward(
        self, item: PlannedWork, out: np.ndarray | Exception, report: StepReport
    ) -> None:
        seq = item.seq
        if isinstance(out, Exception):
            self._finish(seq, "error", error=f"{type(out).__name__}: {out}")
            report.finished[seq.request_id] = "error"
            return
        slot = self.slots.slots[item.work.slot]
        slot.cached.extend(item.work.tokens)
        if len(slot.cached) < len(seq.tokens):
            return  # prompt not fully prefilled yet: these logits mean nothing
        try:
            if item.proposal is None:
                reason = self._emit_token(seq, drawn_token(seq, item.work.sample, out))
                if item.is_decode:
                    self._count_decode(proposed=0, accepted=0, emitted=1)
            else:
                reason = self._verify_and_emit(item, slot, out, report)
        except Exception as exc:  # noqa: BLE001 - bad logits or a bug: only this request fails
            log.exception("request %s failed while sampling", seq.request_id)
            reason = "error"
            self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
        report.sampled.append(seq.request_id)
        if reason is not None:
            report.finished[seq.request_id] = reason

    def _verify_and_emit(
        self, item: PlannedWork, slot: Slot, logits: np.ndarray, report: StepReport
    ) -> FinishReason | None:
        """Keep the verified prefix of the proposal, roll the KV back, emit the tokens."""
        seq, proposal = item.seq, item.proposal
        assert proposal is not None and self.speculator is not None
        verdict = self.speculator.verify(slot.index, seq.sampler, proposal, logits)
        # The cache holds [last, x1..xk]; keep [last, x1..x_accepted]. The final emitted token
        # (correction or bonus) is pending, like any freshly sampled token.
        keep = item.work.start_pos + 1 + verdict.accepted
        if len(slot.cached) > keep:
            self.runner.truncate(slot.index, keep)
            del slot.cached[keep:]
        report.accepted[seq.request_id] = verdict.accepted
        reason: FinishReason | None = None
        emitted = 0
        for sampled in verdict.tokens:
            emitted += 1
            reason = self._emit_token(seq, sampled)
            if reason is not None:
                break
        self._count_decode(proposed=proposal.k, accepted=verdict.accepted, emitted=emitted)
        return reason

    def _count_decode(self, *, proposed: int, accepted: int, emitted: int) -> None:
        with self._lock:
            m = self._metrics
            m.decode_forwards += 1
            m.decode_tokens += emitted
            if proposed:
                m.spec_verifications += 1
                m.spec_proposed += proposed
                m.spec_accepted += accepted

    def _emit_token(self, seq: Sequence, sampled: SampledToken) -> FinishReason | None:
        token = sampled.token_id
        appended = seq.append_token(token, self._metrics.clock(), self.max_ctx)
        logprobs = self._logprobs(sampled)
        reason, text, reasoning = appended.finish_reason, appended.text, appended.reasoning
        if reason is None:
            # Metrics so far ride along on every event, so a UI can show live TTFT and tok/s.
            event = StreamEvent(seq.request_id, text, (token,), logprobs=logprobs,
                                metrics=seq.metrics(), reasoning=reasoning)  # fmt: skip
            self._emit(seq, event)
        else:
            self._finish(seq, reason, text=text, token_ids=(token,), logprobs=logprobs,
                         reasoning=reasoning)  # fmt: skip
        return reason

    def _logprobs(self, sampled: SampledToken) -> tuple[TokenLogprob, ...]:
        if sampled.logprob is None:
            return ()
        top = tuple((t, self._token_text(t), lp) for t, lp in sampled.top)
        text = self._token_text(sampled.token_id)
        return (TokenLogprob(sampled.token_id, text, sampled.logprob, top),)

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        *,
        error: str | None = None,
        text: str = "",
        token_ids: tuple[int, ...] = (),
        logprobs: tuple[TokenLogprob, ...] = (),
        reasoning: str = "",
    ) -> None:
        if seq.finished:
            return
        seq.finish_reason = reason
        seq.error = error
        held = seq.detokenizer.finish() if reason in ("length", "stop") else ""  # held-back text
        more_reasoning, text = seq.release_held(text, held)
        reasoning += more_reasoning
        seq.timing.finished = self._metrics.clock()
        if seq.slot is not None:
            self._free_slot(seq, failed=reason == "error")
        if seq in self.running:
            self.running.remove(seq)
        metrics = seq.metrics()
        with self._lock:
            self._metrics.record_finished(metrics, reason)
        event = StreamEvent(
            seq.request_id,
            text,
            token_ids,
            finish_reason=reason,
            error=error,
            logprobs=logprobs,
            metrics=metrics,
            stop_sequence=seq.detokenizer.matched_stop if reason == "stop" else None,
            reasoning=reasoning,
        )
        self._emit(seq, event)
        if self._on_finish is not None:
            self._on_finish(seq)

    def _free_slot(self, seq: Sequence, failed: bool) -> None:
        slot = self.slots.slots[seq.slot]  # type: ignore[index]
        slot.seq = None
        slot.released_at_step = self._step_no
        seq.slot = None
        if failed or not self.prefix_reuse:
            # Without prefix reuse an idle slot's cache is worthless; after a failure its
            # contents are suspect. Either way, start it empty.
            empty_slot(self.runner, slot)

    def _emit(self, seq: Sequence, event: StreamEvent) -> None:
        try:
            seq.sink(event)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the engine
            log.exception("event sink of request %s failed; aborting it", seq.request_id)
            seq.abort_requested = True
