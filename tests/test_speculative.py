"""Speculative decoding in the engine on deterministic numpy models: greedy parity with plain
decoding (n-gram and draft proposers, single and batched), KV rollback, adaptive k, the busy
switch-off, metrics, and the proposer/controller units. Steps are driven by hand."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest

from localinfer.backends.base import MemoryReport, RunnerInfo, SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine.speculative import (
    AdaptiveK,
    DraftProposer,
    NgramIndex,
    NgramProposer,
    SpecConfig,
    Speculator,
    check_shared_tokenizer,
)
from localinfer.engine.speculative.adaptive import best_k, expected_tokens
from localinfer.engine.speculative.draft import DraftItem
from localinfer.errors import InvalidParameterError
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


# -- units ---------------------------------------------------------------------------------------


def test_ngram_lookup_prefers_the_longest_and_latest_match() -> None:
    p = NgramProposer(n_max=3, n_min=1)
    assert p.propose([1, 2, 3, 9, 9, 1, 2, 3], k=3) == (9, 9, 1)
    # "2 3" occurs twice earlier; the latest wins.
    assert p.propose([2, 3, 5, 6, 2, 3, 7, 8, 4, 2, 3], k=2) == (7, 8)
    # The 3-gram "7 2 3" beats the more recent 1-gram "3".
    assert p.propose([7, 2, 3, 4, 4, 3, 5, 7, 2, 3], k=2) == (4, 4)
    assert p.propose([1, 2, 3, 4], k=4) == ()
    # A match that runs into the end of the context goes on with the tokens just proposed:
    # a run or a loop is proposed k ahead, not only up to its period.
    assert p.propose([5, 5, 5], k=4) == (5, 5, 5, 5)
    assert p.propose([1, 2, 3, 9, 9, 1, 2, 3], k=7) == (9, 9, 1, 2, 3, 9, 9)
    assert p.propose([4, 1, 2, 1, 2], k=5) == (1, 2, 1, 2, 1)
    assert NgramProposer(n_max=3, n_min=2).propose([1, 2, 3, 1], k=2) == ()  # 1-gram too short
    assert p.propose([1, 2, 1], k=0) == ()


def _brute_force_lookup(tokens: list[int], k: int, n_max: int, n_min: int):
    """The definition: the latest earlier start of the longest matching suffix, copied on
    (past the context's end from the proposal itself)."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        for s in range(length - n - 1, -1, -1):
            if tokens[s : s + n] == suffix:
                ext = tokens + []
                for i in range(k):
                    ext.append(ext[s + n + i])
                return tuple(ext[length:]), n
    return (), 0


def test_ngram_index_matches_the_definition_and_grows_incrementally() -> None:
    rng = np.random.default_rng(3)
    for trial in range(60):
        vocab = int(rng.integers(2, 9))  # small vocabularies: many repeats
        tokens = rng.integers(0, vocab, size=int(rng.integers(1, 80))).tolist()
        n_min = int(rng.integers(1, 4))
        n_max = n_min + int(rng.integers(0, 3))
        k = int(rng.integers(1, 12))
        grown = NgramIndex(n_max, n_min)
        for end in range(1, len(tokens) + 1):
            grown.sync(tokens[:end])  # a slot's context, one token more each step
            want = _brute_force_lookup(tokens[:end], k, n_max, n_min)
            assert grown.lookup(k) == want, (trial, end)
        assert NgramProposer(n_max, n_min).lookup(tokens, k) == want
    # A context that does not continue the indexed one (a new request) rebuilds the index.
    index = NgramIndex(3, 1)
    index.sync([5, 6, 7, 5, 6])
    assert index.lookup(2) == ((7, 5), 2)
    index.sync([1, 2, 1])
    assert index.lookup(2) == ((2, 1), 1)


def _controller(step_cost: float, **config: object) -> AdaptiveK:
    """A controller with no margin over plain decoding unless one is given."""
    return AdaptiveK(SpecConfig(**{"min_gain": 1.0, **config}), step_cost)  # type: ignore[arg-type]


def test_adaptive_k_follows_the_acceptance_rate() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert best_k(0.9, 8, 0.05) == 8
    assert best_k(0.02, 8, 0.05) == 0
    assert 0 < best_k(0.6, 8, 0.2) < 8
    ctl = _controller(0.05, k_max=6, prior_acceptance=0.9, probe_every=4)
    assert ctl.tentative and ctl.next_k() >= 4  # the prior pays for a long first try
    for _ in range(10):
        ctl.update(proposed=6, accepted=6)
    assert ctl.next_k() == 6 and ctl.acceptance > 0.95 and not ctl.tentative
    while (k := ctl.next_k()) > 0:  # the text stops being predictable
        ctl.update(proposed=k, accepted=0)
    ks = [ctl.next_k() for _ in range(3)]  # paused: the 4th paused step probes
    assert ks == [0, 0, ctl.probe_k] and ctl.probe_k == 6 and ctl.probing
    with pytest.raises(ValueError):
        ctl.update(2, 3)


def test_a_fixed_verification_cost_never_pays_for_one_token() -> None:
    """llama.cpp on a CPU: a 2-token forward costs ~2 steps, each further token ~0.5."""
    assert best_k(0.99, 16, 0.5, fixed_cost=0.7) == 16
    assert best_k(0.8, 16, 0.5, fixed_cost=0.7) == 0
    for a in (0.5, 0.9, 0.99):
        assert best_k(a, 16, 0.5, fixed_cost=0.7) != 1
    # A promised gain below the margin is not worth the risk of a cost model that is off.
    assert best_k(0.5, 8, 0.2) > 0 and best_k(0.5, 8, 0.2, min_gain=1.3) == 0
    # The probe of a paused slot is the prior's k, not 1 (which could only lose there).
    assert _controller(0.5, k_max=16, verify_fixed=0.7).probe_k > 1
    # A draft as slow as the target: no k pays even at the prior's acceptance, so no probes.
    slow = _controller(0.95, k_max=16, probe_every=2)
    slow.update(4, 0)
    assert slow.probe_k == 0
    assert [slow.next_k() for _ in range(40)] == [0] * 40 and not slow.probing


def test_failed_probes_back_off_and_a_full_probe_restarts_from_the_prior() -> None:
    ctl = _controller(0.3, k_max=8, prior_acceptance=0.9, verify_fixed=0.5, probe_every=4)
    while (k := ctl.next_k()) > 0:  # free text: every try fails until the slot pauses
        ctl.update(k, 0)
    assert not ctl.tentative

    def steps_to_probe() -> int:
        for n in range(1, 200):
            if ctl.next_k() > 0:
                assert ctl.probing and ctl.tentative
                return n
        raise AssertionError("never probed")

    waits = []
    for _ in range(4):  # failed probes: 4, 8, 16, 32 steps apart, then capped at 8 x 4
        waits.append(steps_to_probe() + (1 if not waits else 0))  # the pausing step counted
        ctl.update(ctl.probe_k, 0)
    assert waits == [4, 8, 16, 32]
    assert steps_to_probe() == 32
    ctl.defer_probe()  # nothing to verify this step: the probe waits one step, no more
    assert steps_to_probe() == 1
    ctl.update(ctl.probe_k, ctl.probe_k)  # copying started: back to the prior at once
    assert ctl.acceptance >= 0.9 and ctl.next_k() > 0 and not ctl.probing
    while (k := ctl.next_k()) > 0:
        ctl.update(k, 0)
    assert steps_to_probe() == 3  # the backoff was reset too (4 steps with the pausing one)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        SpecConfig(prior_acceptance=1.0)
    with pytest.raises(ValueError):
        SpecConfig(k_max=0)
    with pytest.raises(ValueError):
        SpecConfig(verify_fixed=-0.1)
    with pytest.raises(ValueError):
        SpecConfig(ngram_min=3, ngram_max=2)
    with pytest.raises(ValueError):
        SpecConfig(max_busy_slots=0)


class _Tok:
    def __init__(self, n: int, flip: int | None = None) -> None:
        self.vocab_size, self.flip = n, flip

    def token_bytes(self, i: int) -> bytes:
        return b"X" if i == self.flip else str(i).encode()


def test_draft_tokenizer_must_match_the_target() -> None:
    check_shared_tokenizer(_Tok(1000), _Tok(1000))
    with pytest.raises(InvalidParameterError, match="vocabularies differ"):
        check_shared_tokenizer(_Tok(1000), _Tok(999), names=("big", "small"))
    for flip in (0, 500, 999):
        with pytest.raises(InvalidParameterError, match=f"token {flip}"):
            check_shared_tokenizer(_Tok(1000), _Tok(1000, flip=flip))


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


def test_draft_choice_and_default_settings() -> None:
    from types import SimpleNamespace

    from localinfer.speculation import NGRAM, default_spec_config, draft_source

    assert draft_source(None, "tiny", None) is None
    assert draft_source(" off ", "tiny", None) is None
    assert draft_source("NGram", "tiny", None) == NGRAM
    assert draft_source("some-draft.gguf", "tiny", None) == "some-draft.gguf"
    assert draft_source("auto", "tiny", SimpleNamespace(draft="small")) == "small"
    with pytest.raises(InvalidParameterError, match="no recommended draft"):
        draft_source("auto", "tiny", None)
    with pytest.raises(InvalidParameterError, match="no recommended draft"):
        draft_source("auto", "tiny", SimpleNamespace(draft=None))

    llama = default_spec_config("llamacpp", "cpu")
    torch_cpu = default_spec_config("torch", "cpu")
    # llama.cpp on a CPU pays much more for each extra verified token than memory-bound torch.
    assert llama.verify_cost > torch_cpu.verify_cost and llama.verify_fixed > 0
    # torch on GGUF blocks reads fewer bytes per step: an extra token weighs more than on fp32.
    blocks = default_spec_config("torch", "cpu", weights="Q4_1")
    assert torch_cpu.verify_cost < blocks.verify_cost < llama.verify_cost
    assert blocks.max_busy_slots == 1  # its batched decode is cheap (backends/torch/profile.py)
    drafted = default_spec_config("llamacpp", "cpu", with_draft=True)
    assert llama.draft_cost == 0 < drafted.draft_cost
    gpu = default_spec_config("torch", "cuda", weights="Q4_1")
    assert gpu.verify_cost < torch_cpu.verify_cost and gpu.verify_fixed == 0


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
