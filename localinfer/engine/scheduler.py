"""Small-slot continuous batching: one ``step()`` = admit, plan a ragged batch, forward, sample.

Each step:

1. requests whose abort was asked leave (queue or slot) and finish with ``"abort"``;
2. waiting requests take idle slots (first come, first served), so a slot freed by the previous
   step is refilled now;
3. one ragged batch is planned: every decoding slot feeds its one sampled token, and prefilling
   slots share a per-step prompt-token budget (``prefill_chunk``) in admission order, so a long
   prompt is prefilled over several steps *in the same forward* as the running streams' decodes
   and never freezes them;
4. one ``Runner.forward``; a slot whose whole pending input was fed samples its next token;
5. finished requests (stop, length, error) emit their last event and free their slot.

Only the engine thread calls ``step``; ``add`` and ``request_abort`` may come from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from localinfer.backends.base import Runner, SlotWork
from localinfer.engine.metrics import MetricsRecorder
from localinfer.engine.sequence import Sequence
from localinfer.engine.slots import SlotTable
from localinfer.engine.types import EngineMetrics, FinishReason, StreamEvent, TokenLogprob
from localinfer.errors import QueueFullError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StepReport:
    """What one step did (tests assert admission and interleaving on these)."""

    step: int
    admitted: list[str] = field(default_factory=list)
    decoded: list[str] = field(default_factory=list)  # requests that fed one decode token
    prefilled: dict[str, int] = field(default_factory=dict)  # request -> prompt tokens fed
    sampled: list[str] = field(default_factory=list)  # requests that got a new token
    finished: dict[str, str] = field(default_factory=dict)  # request -> finish reason

    @property
    def batch_tokens(self) -> int:
        return len(self.decoded) + sum(self.prefilled.values())


@dataclass(slots=True)
class _Planned:
    seq: Sequence
    work: SlotWork
    is_decode: bool


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
        on_finish: Callable[[Sequence], None] | None = None,
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
        self._token_text = token_text
        self._metrics = metrics
        self._on_finish = on_finish
        self._lock = threading.Lock()  # guards `waiting` and the metrics counters
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: prefill budget goes first-come
        self._step_no = 0

    # -- any thread ------------------------------------------------------------------------

    def add_all(self, seqs: list[Sequence]) -> None:
        """Queue requests all or none (QueueFullError when they do not all fit)."""
        with self._lock:
            if len(self.waiting) + len(seqs) > self.max_queue:
                raise QueueFullError(
                    f"engine is busy: {len(self.waiting)} requests already waiting "
                    f"(queue limit {self.max_queue}); retry later"
                )
            self.waiting.extend(seqs)

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def snapshot(self) -> EngineMetrics:
        with self._lock:
            return self._metrics.snapshot(
                slots_total=len(self.slots),
                slots_busy=len(self.running),
                queue_depth=len(self.waiting),
                kv_cells_used=self.slots.cells_used(),
                kv_cells_total=len(self.slots) * self.max_ctx,
            )

    # -- engine thread ---------------------------------------------------------------------

    def step(self) -> StepReport:
        report = StepReport(step=self._step_no)
        self._drop_aborted(report)
        self._admit(report)
        planned = self._plan(report)
        if planned:
            outputs = self._forward(planned)
            for item, out in zip(planned, outputs, strict=True):
                self._after_forward(item, out, report)
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
                seq = self.waiting.popleft()
            slot, shared = self.slots.choose(seq.prompt_ids, match_prefix=self.prefix_reuse)
            # At least the last prompt token is always fed: its logits give the first token.
            reuse = min(shared, seq.prompt_len - 1) if self.prefix_reuse else 0
            if len(slot.cached) > reuse:
                self.runner.truncate(slot.index, reuse)
                del slot.cached[reuse:]
            slot.seq = seq
            seq.slot = slot.index
            seq.cached_prompt_tokens = reuse
            seq.timing.admitted = self._metrics.clock()
            self.running.append(seq)
            report.admitted.append(seq.request_id)

    def _plan(self, report: StepReport) -> list[_Planned]:
        decodes: list[_Planned] = []
        prefills: list[_Planned] = []
        budget = self.prefill_chunk
        for seq in self.running:
            slot = self.slots.slots[seq.slot]  # type: ignore[index]
            start = len(slot.cached)
            pending = len(seq.tokens) - start
            if seq.num_output > 0:
                # Decoding: exactly the last sampled token is not in the cache yet.
                assert pending == 1, f"{seq.request_id}: {pending} tokens pending while decoding"
                work = SlotWork(slot.index, (seq.tokens[start],), start)
                decodes.append(_Planned(seq, work, is_decode=True))
                report.decoded.append(seq.request_id)
            elif budget > 0:
                n = min(pending, budget)
                budget -= n
                work = SlotWork(slot.index, tuple(seq.tokens[start : start + n]), start)
                prefills.append(_Planned(seq, work, is_decode=False))
                report.prefilled[seq.request_id] = n
        return decodes + prefills

    def _forward(self, planned: list[_Planned]) -> list[np.ndarray | Exception]:
        batch = [p.work for p in planned]
        try:
            return list(self.runner.forward(batch))
        except Exception as exc:  # noqa: BLE001 - isolate the request that caused it
            if len(batch) == 1:
                return [exc]
            log.warning("batched forward failed (%s); retrying slot by slot", exc)
        outputs: list[np.ndarray | Exception] = []
        for work in batch:
            try:
                self._resync(work.slot, work.start_pos)
                outputs.append(self.runner.forward([work])[0])
            except Exception as exc:  # noqa: BLE001
                outputs.append(exc)
        return outputs

    def _resync(self, slot: int, length: int) -> None:
        """After a failed forward, put the runner's slot back to the length the engine expects."""
        have = self.runner.slot_length(slot)
        if have > length:
            self.runner.truncate(slot, length)
        elif have < length:
            raise RuntimeError(f"slot {slot} lost cached tokens ({have} < {length})")

    def _after_forward(
        self, item: _Planned, out: np.ndarray | Exception, report: StepReport
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
            reason = self._sample_and_emit(seq, out[-1])
        except Exception as exc:  # noqa: BLE001 - bad logits or a bug: only this request fails
            log.exception("request %s failed while sampling", seq.request_id)
            reason = "error"
            self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
        report.sampled.append(seq.request_id)
        if reason is not None:
            report.finished[seq.request_id] = reason

    def _sample_and_emit(self, seq: Sequence, logits: np.ndarray) -> FinishReason | None:
        sampled = seq.sampler.sample(logits)
        token = sampled.token_id
        seq.tokens.append(token)
        now = self._metrics.clock()
        if seq.timing.first_token is None:
            seq.timing.first_token = now
        seq.timing.last_token = now
        logprobs: tuple[TokenLogprob, ...] = ()
        if sampled.logprob is not None:
            top = tuple((t, self._token_text(t), lp) for t, lp in sampled.top)
            logprobs = (TokenLogprob(token, self._token_text(token), sampled.logprob, top),)
        reason: FinishReason | None = None
        text = ""
        if token in seq.stop_ids:
            reason = "stop"  # a stop/eos token's own text is never shown
        else:
            step = seq.detokenizer.add(token)
            text = step.text
            if step.stopped:
                reason = "stop"
        if reason is None and seq.num_output >= seq.params.max_tokens:
            reason = "length"
        if reason is None and len(seq.tokens) > self.max_ctx:
            reason = "length"  # the context is full: the new token cannot be fed back
        if reason is None:
            # Metrics so far ride along on every event, so a UI can show live TTFT and tok/s.
            event = StreamEvent(
                seq.request_id, text, (token,), logprobs=logprobs, metrics=seq.metrics()
            )
            self._emit(seq, event)
        else:
            self._finish(seq, reason, text=text, token_ids=(token,), logprobs=logprobs)
        return reason

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        *,
        error: str | None = None,
        text: str = "",
        token_ids: tuple[int, ...] = (),
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        if seq.finished:
            return
        seq.finish_reason = reason
        seq.error = error
        if reason in ("length", "stop"):
            # A stop string already dropped the held text; otherwise release it now.
            text += seq.detokenizer.finish()
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
            try:
                self.runner.release(slot.index)
            except Exception:  # noqa: BLE001 - the next admission truncates again anyway
                log.exception("releasing slot %d failed", slot.index)
            slot.cached.clear()

    def _emit(self, seq: Sequence, event: StreamEvent) -> None:
        try:
            seq.sink(event)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the engine
            log.exception("event sink of request %s failed; aborting it", seq.request_id)
            seq.abort_requested = True
