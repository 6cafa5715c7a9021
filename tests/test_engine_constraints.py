"""Constrained decoding through the engine on deterministic numpy models and tiny torch models:
constrained and unconstrained requests batched together give each its solo tokens, answers match
their constraint (greedy and seeded sampling), a finished constraint ends the request with "stop",
a broken constraint fails only its own request, and constrained slots never speculate while
others do. Steps are driven by hand (background=False). The embedded model answering JSON
schemas: test_structured_generation.py."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from localinfer.constraints import ConstraintCompiler, ConstraintSpec, vocabulary_from_tokenizer
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine.speculative import DraftProposer, SpecConfig, Speculator
from tests.test_engine_model import ByteTokenizer, HashRunner
from tests.tiny import tiny_model

WORDS = r"[a-z]{1,8}( [a-z]{1,8}){2,4}\."  # at most 45 bytes: every walk ends in time
DIGITS = r"[0-9]{3}-[0-9]{4}"


class ByteVocab(ByteTokenizer):
    """ByteTokenizer with what the constraint vocabulary adapter reads: eos ids are special."""

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.eos_ids)

    def encode(  # type: ignore[override]
        self, text: str, add_special_tokens: bool = False, parse_special: bool = True
    ) -> list[int]:
        return list(text.encode("utf-8"))


def compiler_for(tokenizer: ByteVocab) -> ConstraintCompiler:
    return ConstraintCompiler(vocabulary_from_tokenizer(tokenizer))


COMPILER = compiler_for(ByteVocab())


def regex(pattern: str, compiler: ConstraintCompiler = COMPILER):
    return compiler.compile(ConstraintSpec("regex", pattern, field="--regex"))


def engine_for(runner=None, tokenizer=None, **kw: object) -> Engine:
    return Engine(runner or HashRunner(slots=3), tokenizer or ByteVocab(), background=False, **kw)  # type: ignore[arg-type]


def run_all(engine: Engine, requests: Sequence[Request]):
    handles = engine.submit_all(requests)
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    return [h.result() for h in handles], reports


PROMPTS = [[3, 4, 5], list(range(10, 40)), [7], list(range(100, 113)), [9] * 6]


def mixed_requests(params: SamplingParams | None = None) -> list[Request]:
    """Constrained and unconstrained requests, alternating."""
    kinds = [regex(WORDS), None, regex(DIGITS), None, regex(WORDS)]
    out = []
    for i, (prompt, constraint) in enumerate(zip(PROMPTS, kinds, strict=True)):
        p = params or SamplingParams(max_tokens=60)
        if not p.greedy:
            p = p.model_copy(update={"seed": 100 + i})
        out.append(Request(prompt, p, constraint=constraint))
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mixed_batch_gives_each_request_its_solo_tokens(temperature: float) -> None:
    params = SamplingParams(max_tokens=60, temperature=temperature)
    requests = mixed_requests(params)
    solo = [run_all(engine_for(HashRunner(slots=1)), [r])[0][0] for r in requests]
    # 3 slots for 5 requests: some wait, prompts prefill in chunks beside running decodes.
    batched, _ = run_all(engine_for(HashRunner(slots=3), prefill_chunk=8), requests)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    for request, result in zip(requests, batched, strict=True):
        if request.constraint is None:
            assert result.finish_reason == "length" and len(result.token_ids) == 60
        else:
            pattern = request.constraint.spec.source
            assert re.fullmatch(pattern, result.text), result.text
            assert result.finish_reason == "stop"


LETTERS = range(ord("a"), ord("z") + 1)


@pytest.mark.parametrize("pattern", [r"[a-z]+", r"[a-z]{5,}", "ANSWER[a-z]*"])
def test_constrained_greedy_equals_unconstrained_when_the_answer_already_fits(
    pattern: str,
) -> None:
    # Every byte but a-z pushed down: the free greedy answer is letters (and so fits).
    def engine() -> Engine:
        return engine_for(HashRunner(discourage=[b for b in range(256) if b not in LETTERS]))

    for prompt in ([5, 6, 7], [40, 41]):
        plain, _ = run_all(engine(), [Request(prompt, SamplingParams(max_tokens=24))])
        assert re.fullmatch("[a-z]{24}", plain[0].text)
        # ANSWER: the free answer's own first letters, then any letters.
        constraint = regex(pattern.replace("ANSWER", plain[0].text[:10]))
        request = Request(prompt, SamplingParams(max_tokens=24), constraint=constraint)
        constrained, _ = run_all(engine(), [request])
        assert constrained[0].token_ids == plain[0].token_ids
        assert constrained[0].finish_reason == plain[0].finish_reason == "length"


@pytest.mark.parametrize("seed", range(12))
def test_sampled_answers_always_match(seed: int) -> None:
    params = SamplingParams(max_tokens=64, temperature=1.0, top_p=0.95, seed=seed)
    results, _ = run_all(engine_for(), [Request([seed + 1], params, constraint=regex(WORDS))])
    assert re.fullmatch(WORDS, results[0].text), results[0].text
    assert results[0].finish_reason == "stop"


def test_a_finished_constraint_stops_without_eos_text_and_max_tokens_still_cuts() -> None:
    # "yes|no" is finished after its last letter: the request ends there, no eos needed.
    done, _ = run_all(engine_for(), [Request([1, 2], constraint=regex("yes|no"))])
    assert done[0].text in ("yes", "no") and done[0].finish_reason == "stop"
    assert bytes(done[0].token_ids).decode() == done[0].text  # no eos token was spent
    # A pattern that may end or go on: eos ends it, its text never shown, ignore_eos or not.
    ends = regex(r"[a-c]{2,40}")
    for ignore_eos in (False, True):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=3, ignore_eos=ignore_eos)
        engine = engine_for(HashRunner(slots=1, discourage=()))  # eos (0) as likely as a byte
        res, _ = run_all(engine, [Request([4], params, constraint=ends)])
        assert res[0].finish_reason == "stop" and re.fullmatch(r"[a-c]{2,40}", res[0].text)
        assert res[0].token_ids[-1] == 0 and "\x00" not in res[0].text
    # Too few tokens for the pattern: "length", like any request.
    short, _ = run_all(
        engine_for(), [Request([1], SamplingParams(max_tokens=5), constraint=regex(DIGITS))]
    )
    assert short[0].finish_reason == "length" and re.fullmatch(r"[0-9]{3}-[0-9]", short[0].text)


class BrokenConstraint:
    """A constraint whose mask fails at its ``fail_at``-th call; counts its calls."""

    def __init__(self, fail_at: int, vocab_size: int = 256) -> None:
        self.fail_at = fail_at
        self.vocab_size = vocab_size
        self.calls = 0
        self.taken: list[int] = []

    def start(self) -> BrokenConstraint:
        return self

    def fill_allowed(self, out: np.ndarray) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("grammar engine bug")
        out[:] = -1

    def advance(self, token_id: int) -> None:
        self.taken.append(token_id)

    def is_finished(self) -> bool:
        return False

    def accepted_prefix(self, tokens: Sequence[int]) -> int:
        return len(tokens)

    def rollback(self, count: int) -> None:
        del self.taken[len(self.taken) - count :]


def test_a_failing_constraint_fails_only_its_request() -> None:
    broken = BrokenConstraint(fail_at=4)
    others = [Request(p, SamplingParams(max_tokens=20)) for p in PROMPTS[:2]]
    solo = [run_all(engine_for(HashRunner(slots=1)), [r])[0][0] for r in others]
    bad = Request([8, 8], SamplingParams(max_tokens=20), constraint=broken)
    results, _ = run_all(engine_for(), [others[0], bad, others[1]])
    assert results[1].finish_reason == "error" and "grammar engine bug" in (results[1].error or "")
    assert len(results[1].token_ids) == 3  # three tokens passed their masks, then it failed
    assert broken.taken == list(results[1].token_ids)
    assert [r.token_ids for r in (results[0], results[2])] == [r.token_ids for r in solo]
    assert [r.finish_reason for r in (results[0], results[2])] == ["length", "length"]


def test_a_constraint_that_allows_nothing_fails_its_request() -> None:
    class AllowsNothing(BrokenConstraint):
        def fill_allowed(self, out: np.ndarray) -> None:
            out[:] = 0

    results, _ = run_all(engine_for(), [Request([1], constraint=AllowsNothing(fail_at=-1))])
    assert results[0].finish_reason == "error" and "allows no token" in (results[0].error or "")


def test_mask_work_only_for_constrained_tokens() -> None:
    counting = BrokenConstraint(fail_at=-1)  # never fails: counts masks
    requests = [
        Request([3], SamplingParams(max_tokens=15), constraint=counting),
        Request([4], SamplingParams(max_tokens=30)),
    ]
    results, _ = run_all(engine_for(), requests)
    assert counting.calls == len(results[0].token_ids) == 15  # one mask per own token, no more


def test_constraint_compiled_for_a_smaller_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="another vocabulary"):
        engine_for(HashRunner(vocab_size=256)).submit(
            Request([1], constraint=BrokenConstraint(fail_at=-1, vocab_size=100))
        )


def speculators():
    """An n-gram speculator (1-grams: proposals on the random HashRunner) and a self-draft."""
    ngram = SpecConfig(max_busy_slots=4, ngram_min=1, ngram_max=1)
    fixed = SpecConfig(max_busy_slots=4, measure_draft_cost=False)
    yield "ngram", Speculator(ngram), None
    draft = DraftProposer(HashRunner(slots=2), vocab_size=256)
    yield "draft", Speculator(fixed, draft), draft


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_speculation_skips_constrained_slots_in_a_mixed_batch(kind: str) -> None:
    _, speculator, draft = next(s for s in speculators() if s[0] == kind)
    prompts = [[3, 4, 5] * 4, [3, 4, 5] * 4, [6, 7] * 5, [3, 4, 5] * 4, [6, 7] * 5]
    # 2 slots, 5 requests: slots pass from unconstrained to constrained requests and back.
    constraints = [None, regex(WORDS), None, regex(DIGITS), None]
    requests = [
        Request(p, SamplingParams(max_tokens=40), constraint=c)
        for p, c in zip(prompts, constraints, strict=True)
    ]
    plain, _ = run_all(engine_for(HashRunner(slots=2)), requests)
    runner = HashRunner(slots=2)
    engine = engine_for(runner, speculator=speculator)
    spec, reports = run_all(engine, requests)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert [r.finish_reason for r in spec] == [r.finish_reason for r in plain]
    constrained_ids = {
        res.request_id for res, req in zip(spec, requests, strict=True) if req.constraint
    }
    assert constrained_ids and all(not (set(r.proposed) & constrained_ids) for r in reports)
    assert engine.metrics().spec_proposed > 0  # the others did speculate
    if draft is not None:
        assert engine.metrics().spec_acceptance_rate == 1.0  # the draft is the target itself
    for slot in engine._scheduler.slots.slots:
        assert runner.slot_length(slot.index) == len(slot.cached)


def test_request_with_a_constraint_can_be_submitted_again() -> None:
    request = Request([2, 3], SamplingParams(max_tokens=60), constraint=regex(WORDS))
    engine = engine_for()
    first, _ = run_all(engine, [request])
    second, _ = run_all(engine, [request, request])
    assert first[0].token_ids == second[0].token_ids == second[1].token_ids


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_torch_models_batched_equals_single_with_constraints(arch: str) -> None:
    runner_module = pytest.importorskip("localinfer.backends.torch.runner")
    from localinfer.backends.base import RunnerConfig

    tokenizer = ByteVocab(eos_ids=(2,))
    model = tiny_model(arch, seed=1, path=Path("/dev/null"), tokenizer=tokenizer)
    compiler = compiler_for(tokenizer)
    constraints = [regex(WORDS, compiler), None, regex(DIGITS, compiler), None]
    params = [SamplingParams(max_tokens=50), SamplingParams(max_tokens=12)] * 2
    requests = [
        Request(p, sp, constraint=c)
        for p, sp, c in zip(PROMPTS[:4], params, constraints, strict=True)
    ]
    runner = runner_module.TorchRunner(model, RunnerConfig(slots=3, max_ctx=128))
    solo = []
    for request in requests:
        solo.append(run_all(Engine(runner, tokenizer, background=False), [request])[0][0])
    batched, _ = run_all(Engine(runner, tokenizer, background=False, prefill_chunk=8), requests)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert re.fullmatch(WORDS, batched[0].text) and re.fullmatch(DIGITS, batched[2].text)
    runner.close()
