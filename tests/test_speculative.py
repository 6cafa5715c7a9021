"""Speculative decoding in the engine on deterministic numpy models: greedy parity with plain
decoding (n-gram and draft proposers, single and batched), KV rollback, adaptive k, the busy
switch-off, metrics, and a draft model's failures and cost. Steps are driven by hand. The
proposer/controller units on their own: test_speculative_units.py."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest

from localinfer.backends.base import MemoryReport, RunnerInfo, SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine.speculative import (
    DraftProposer,
    SpecConfig,
    Speculator,
)
from localinfer.engine.speculative.draft import DraftItem
from tests.test_engine_model import ByteTokenizer, CellRunner, HashRunner


class MarkovRunner(CellRunner):
    """Next-token logits depend on the last two tokens only (a random order-2 Markov chain over
    a small vocabulary), so greedy output falls into cycles that n-gram lookup predicts, while
    a different ``seed`` gives a draft model that agrees only sometimes. Honours ``logits="all"``
    and enforces the protocol like a real runner."""

    def __init__(self, vocab_size: int = 12, slots: int = 4, max_ctx: int = 256, seed: int = 0):
        # A slot's cells: the tokens fed.
        super().__init__(RunnerInfo("numpy-markov", "cpu", "float32", slots, max_ctx, 256, "fp32"))
        self.vocab = vocab_size
        rng = np.random.default_rng(seed)
        table = rng.standard_normal((vocab_size, vocab_size, 256)).astype(np.float32) * 3
        table[..., vocab_size:] = -30.0  # only the small vocabulary is ever generated
        table[..., 0] -= 8.0  # token 0 is eos: keep generations long
        self._table = table  # [prev2, prev1, 256]

    def _step(self, cells: list[int], token: int) -> np.ndarray:
        cells.append(token)
        a = cells[-2] % self.vocab if len(cells) > 1 else 1
        return self._table[a, token % self.vocab]

    def memory(self) -> MemoryReport:
        return MemoryReport(0, 0, 0, "cpu")

    def close(self) -> None:
        pass


# Draft costs as configured, not measured: these tests need speculation to run every time.
FIXED_COSTS = dict(max_busy_slots=4, measure_draft_cost=False)


PROMPTS = [[3, 4, 5, 6, 7], list(range(1, 23)) * 2, [9], [5, 6, 5, 6, 11, 12]]


LENGTHS = [40, 25, 60, 33]


def run(engine: Engine, prompts=PROMPTS, lengths=LENGTHS, **params: object):
    handles = [
        engine.submit(Request(list(p), SamplingParams(max_tokens=n, **params)))  # type: ignore[arg-type]
        for p, n in zip(prompts, lengths, strict=True)
    ]
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    return [h.result() for h in handles], reports


def engine_for(runner, speculator=None, **kw) -> Engine:
    return Engine(runner, ByteTokenizer(), background=False, speculator=speculator, **kw)


def ids(results) -> list[list[int]]:
    return [list(r.token_ids) for r in results]


@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize("runner_cls", [MarkovRunner, HashRunner])
def test_ngram_greedy_output_is_identical_to_plain_decoding(slots: int, runner_cls) -> None:
    plain, _ = run(engine_for(runner_cls(slots=slots), prefill_chunk=8))
    runner = runner_cls(slots=slots)
    # 1-grams on the random HashRunner: proposals happen and are mostly rejected (rollback).
    # (A 1-token match is then also a full-length one, which a slot without evidence needs.)
    n = 1 if runner_cls is HashRunner else 2
    config = SpecConfig(max_busy_slots=slots, ngram_min=n, ngram_max=max(n, 4 if n == 2 else 1))
    engine = engine_for(runner, Speculator(config), prefill_chunk=8)
    spec, reports = run(engine)
    assert ids(spec) == ids(plain)
    assert [r.finish_reason for r in spec] == [r.finish_reason for r in plain]
    m = engine.metrics()
    assert m.spec_proposed > 0
    if runner_cls is MarkovRunner:
        # Cycles are predictable: most proposals pass and steps emit several tokens each.
        assert m.spec_acceptance_rate is not None and m.spec_acceptance_rate > 0.5
        assert m.tokens_per_target_forward is not None and m.tokens_per_target_forward > 1.5
        assert sum(1 for r in reports if r.accepted and max(r.accepted.values()) >= 3) > 0
        assert len(reports) < len(run(engine_for(MarkovRunner(slots=slots)))[1])
    else:
        assert m.spec_acceptance_rate is not None and m.spec_acceptance_rate < 0.5
    # Several slots verified in one ragged forward.
    if slots > 1:
        assert any(sum(1 for w in b if w.logits == "all") >= 2 for b in runner.batches)
    # The runner's KV always matches what the engine believes it holds (no stale proposals).
    for slot in engine._scheduler.slots.slots:
        assert runner.slot_length(slot.index) == len(slot.cached)


@pytest.mark.parametrize("draft_seed", [0, 7])
@pytest.mark.parametrize("slots", [1, 4])
def test_draft_model_greedy_output_is_identical_to_plain_decoding(
    draft_seed: int, slots: int
) -> None:
    plain, _ = run(engine_for(MarkovRunner(slots=slots)))
    draft = DraftProposer(MarkovRunner(slots=slots, seed=draft_seed), vocab_size=256)
    engine = engine_for(MarkovRunner(slots=slots), Speculator(SpecConfig(**FIXED_COSTS), draft))
    spec, _ = run(engine)
    assert ids(spec) == ids(plain)
    m = engine.metrics()
    assert m.spec_proposed > 0 and draft.forwards > 0
    if draft_seed == 0:  # the draft is the target itself: everything is accepted
        assert m.spec_acceptance_rate == 1.0
    else:
        assert m.spec_acceptance_rate is not None and m.spec_acceptance_rate < 0.9


def test_stop_token_and_max_tokens_inside_an_accepted_run() -> None:
    # A stop id the greedy run reaches mid-way, and odd max_tokens: both must cut exactly
    # where plain decoding cuts even when a verification emits several tokens at once.
    plain, _ = run(engine_for(MarkovRunner(slots=2)), prompts=[[3, 4, 5]], lengths=[50])
    stop = plain[0].token_ids[17]
    first = list(plain[0].token_ids).index(stop)
    for n in (7, 13, 50):
        params = dict(stop_token_ids=(stop,))
        a, _ = run(engine_for(MarkovRunner()), [[3, 4, 5]], [n], **params)
        engine = engine_for(MarkovRunner(), Speculator(SpecConfig(k_max=8)))
        b, _ = run(engine, [[3, 4, 5]], [n], **params)
        assert ids(a) == ids(b)
        assert len(b[0].token_ids) == min(n, first + 1)


def test_prefix_reuse_keeps_a_consistent_cache_after_speculation() -> None:
    runner = MarkovRunner(slots=1)
    engine = engine_for(runner, Speculator(), prefix_reuse=True)
    first, _ = run(engine, [[3, 4, 5]], [30])
    follow = [3, 4, 5, *first[0].token_ids, 8, 9]
    second, _ = run(engine, [follow], [20])
    cold, _ = run(engine_for(MarkovRunner(slots=1)), [follow], [20])
    assert ids(second) == ids(cold)
    assert second[0].metrics is not None and second[0].metrics.cached_tokens > 3


def test_speculation_switches_off_when_the_batch_is_busy() -> None:
    engine = engine_for(MarkovRunner(slots=4), Speculator(SpecConfig(max_busy_slots=2)))
    handles = [engine.submit(Request(p, SamplingParams(max_tokens=30))) for p in PROMPTS]
    reports = [engine.step() for _ in range(6)]
    busy = [r for r in reports if len(r.decoded) > 2]
    assert busy and all(not r.proposed for r in busy)
    for h in handles[1:]:
        h.abort()
    while engine.has_work():
        reports.append(engine.step())
    assert any(r.proposed for r in reports[6:])  # alone again: speculation resumes


class AlwaysRunner(HashRunner):
    """A draft model that always proposes ``token``."""

    def __init__(self, token: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.token = token

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        out = super().forward(batch)
        for x in out:
            x[:, self.token] = 100.0
        return out


def test_a_proposed_token_that_breaks_the_runner_does_not_fail_the_request() -> None:
    # Token 13 poisons the target once the prompt is in, and the draft proposes nothing else.
    # The request must end exactly as without speculation.
    prompt = [5, 3, 4, 9]

    def once(speculator: Speculator | None):
        runner = HashRunner(slots=1)
        engine = engine_for(runner, speculator)
        h = engine.submit(Request(prompt, SamplingParams(max_tokens=12)))
        engine.step()  # prefill, while the poison is off
        runner.fail_on_token = 13
        while engine.has_work():
            engine.step()
        return h.result(), engine.metrics()

    draft = DraftProposer(AlwaysRunner(13, slots=1), 256)
    (plain, _), (spec, m) = once(None), once(Speculator(draft=draft))
    assert draft.forwards > 0 and m.spec_proposed == 0  # proposed, but never verified
    assert spec.finish_reason == plain.finish_reason == "length"
    assert list(spec.token_ids) == list(plain.token_ids)


def test_sampled_requests_run_and_are_reproducible_with_a_seed() -> None:
    def once(draft: bool):
        d = DraftProposer(MarkovRunner(seed=3), 256) if draft else None
        engine = engine_for(MarkovRunner(), Speculator(SpecConfig(**FIXED_COSTS), d))
        res, _ = run(engine, temperature=0.8, top_k=10, seed=5)
        return ids(res), engine.metrics()

    for draft in (False, True):
        a, m = once(draft)
        b, _ = once(draft)
        assert a == b
        assert [len(x) for x in a] == LENGTHS
        assert m.spec_proposed > 0


def test_metrics_report_acceptance_and_tokens_per_forward() -> None:
    engine = engine_for(MarkovRunner(slots=1), Speculator())
    res, reports = run(engine, [[3, 4, 5]], [64])
    m = engine.metrics()
    assert m.spec_proposed == sum(sum(r.proposed.values()) for r in reports)
    assert m.spec_accepted == sum(sum(r.accepted.values()) for r in reports)
    assert m.spec_acceptance_rate == pytest.approx(m.spec_accepted / m.spec_proposed)
    assert m.spec_mean_accepted == pytest.approx(m.spec_accepted / m.spec_verifications)
    decode_steps = sum(1 for r in reports if r.decoded)
    assert m.tokens_per_target_forward == pytest.approx((64 - 1) / decode_steps)
    plain = engine_for(MarkovRunner(slots=1))
    run(plain, [[3, 4, 5]], [64])
    assert plain.metrics().tokens_per_target_forward == 1.0
    assert plain.metrics().spec_acceptance_rate is None


def test_a_failing_draft_model_only_turns_speculation_off() -> None:
    class Broken(MarkovRunner):
        def forward(self, batch):
            raise RuntimeError("draft exploded")

    plain, _ = run(engine_for(MarkovRunner()))
    draft = DraftProposer(Broken(), 256)
    engine = engine_for(MarkovRunner(), Speculator(SpecConfig(**FIXED_COSTS), draft))
    spec, _ = run(engine)
    assert ids(spec) == ids(plain)
    assert engine.metrics().spec_proposed == 0


class _Timed(MarkovRunner):
    """A MarkovRunner whose forwards take ``seconds`` (a stand-in for a slow or fast model)."""

    def __init__(self, seconds: float, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.seconds = seconds

    def forward(self, batch):
        time.sleep(self.seconds)
        return super().forward(batch)


def test_a_draft_measured_slower_than_it_pays_stops_being_asked() -> None:
    """The configured draft cost is a guess; the measured one decides. A draft model whose step
    takes 20x a target step can never pay, whatever it was configured as: after the first few
    proposals the slot decodes plainly (probing now and then). A cheap draft keeps drafting."""
    prompts, lengths = [[1, 2, 3, 4, 5]], [150]

    def drafted(draft_seconds: float) -> tuple[int, float]:
        proposer = DraftProposer(_Timed(draft_seconds, seed=0), 256)  # = target: all accepted
        spec = Speculator(SpecConfig(verify_cost=0.05, draft_cost=0.01), proposer)
        engine = engine_for(_Timed(0.002), spec)
        plain, _ = run(engine_for(MarkovRunner()), prompts, lengths)
        got, _ = run(engine, prompts, lengths)
        assert ids(got) == ids(plain)
        return engine.metrics().spec_proposed, spec.draft_cost

    slow_proposed, slow_cost = drafted(0.04)
    fast_proposed, fast_cost = drafted(0.0)
    assert slow_cost > 5 and fast_cost < 1
    assert fast_proposed >= 120  # nearly every token came from a proposal
    assert slow_proposed < fast_proposed / 2


def test_draft_reset_forgets_every_cached_context() -> None:
    proposer = DraftProposer(MarkovRunner(seed=0), 256)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    got = proposer.propose([DraftItem(1, [1, 2, 3, 4], 3, params, np.random.default_rng(0))])
    assert len(got[1].tokens) == 3
    assert proposer.cached[1] and proposer.runner.slot_length(1) == len(proposer.cached[1])
    proposer.reset()
    assert all(not c for c in proposer.cached) and proposer.runner.slot_length(1) == 0
