"""--cache-reuse through the Engine (localinfer/engine/kv/chunk_reuse.py ``prepare_slot``, the
scheduler's admission): a fill-in-the-middle-like sequence of prompts that grow in the middle.

The runner here keeps context-free cells, one ``(token, position)`` per cached position, as a
one-layer model's keys and values are: a moved cell re-tagged with its new position is exactly
what a cold prefill writes there, so with these cells cache reuse must give exactly the cold
answers, and any slip of positions or bookkeeping changes the tokens (the logits hash every
cell). What reuse costs on real models is in test_cache_reuse_runners.py.

- off (N = 0): nothing is spliced and only the shared prefix is cached (the exact prefix reuse);
- on: the suffix after the typed line is reported cached and not prefilled, answers equal cold,
  the slot's tokens mirror the runner's cells;
- a runner without the capability, or whose splice fails, falls back to prefix reuse;
- the engine refuses a negative N, or N without prefix reuse;
- on the real runners (tiny random models, two layers: approximate), prompts growing in the
  middle report the moved suffix as cached, still answer, and the slot mirrors the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import MovedChunk, RunnerInfo, kv_splicer
from localinfer.backends.kv_splice import check_splice
from localinfer.engine import Request
from tests.prefix_reuse_helpers import greedy, manual, seq, slot_cache
from tests.test_cache_reuse_runners import BACKENDS, make_runner
from tests.test_engine_model import CellRunner, HashRunner

Cell = tuple[int, int]  # (token, position)


class PositionalRunner(CellRunner):
    """Cells ``(token, position)``; a token's logits hash every cell up to it. ``splice`` moves
    cells by re-tagging their positions (as a real runner turns stored keys). Its cells are its
    own, so it is its own ``kv_cache``."""

    def __init__(self, slots: int = 2, max_ctx: int = 512, fail_splice: str = "") -> None:
        super().__init__(RunnerInfo("numpy-pos", "cpu", "float32", slots, max_ctx, 256, "fp32"))
        self.kv_cache = self
        self.fail_splice = fail_splice
        self.splices: list[tuple[int, int, tuple[MovedChunk, ...]]] = []

    def _step(self, cells: list[Cell], token: int) -> np.ndarray:  # type: ignore[override]
        cells.append((token, len(cells)))
        rng = np.random.default_rng(abs(hash(tuple(cells))) % (1 << 63))
        x = rng.standard_normal(self.info.vocab_size).astype(np.float32) * 3
        x[0] -= 8.0  # keep answers long
        return x

    def splice(self, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
        cells = self._cells[slot]
        check_splice(len(cells), keep, chunks, self.info.max_ctx)
        if self.fail_splice == "unsupported":  # a model whose cells cannot move
            raise NotImplementedError("cannot move cells")
        if self.fail_splice:
            del cells[keep + 1 :]  # a failure part-way: only [0, keep) is promised
            raise RuntimeError("splice failed")
        self.splices.append((slot, keep, tuple(chunks)))
        out = cells[:keep]
        for chunk in chunks:
            out += [(t, len(out) + i) for i, t in enumerate(chunk.new)]
            out += [
                (token, len(out) + i) for i, (token, _) in enumerate(cells[chunk.start : chunk.end])
            ]
        cells[:] = out

    def memory(self) -> object:
        raise NotImplementedError

    def close(self) -> None:
        pass


HEAD, SUFFIX = seq(60, 1), seq(90, 2)
LINES = [seq(5 + i % 3, 10 + i) for i in range(4)]


def typing_prompts() -> list[list[int]]:
    """What an editor sends while lines are typed in the middle of a file (PSM: the prefix
    grows, the suffix follows it, and a marker ends the prompt)."""
    prompts, prefix = [], list(HEAD)
    for line in [[], *LINES]:
        prefix += line
        prompts.append([1, *prefix, 4, *SUFFIX, 5])
    return prompts


def run_all(runner: CellRunner, **kw: object) -> list[tuple[list[int], int]]:
    engine = manual(runner, prefill_chunk=64, **kw)
    out = []
    for prompt in typing_prompts():
        result = engine.generate(Request(prompt, greedy(6)))
        assert result.metrics is not None
        out.append((list(result.token_ids), result.metrics.cached_tokens))
        # The slot's tokens mirror the runner's cells, position by position.
        for slot in engine._scheduler.slots.slots:
            assert [t for t, _ in runner._cells[slot.index]] == slot.cached
            assert [p for _, p in runner._cells[slot.index]] == list(range(len(slot.cached)))
    return out


def cold_answers() -> list[list[int]]:
    return [tokens for tokens, _ in run_all(PositionalRunner(), reuse=False)]


def test_the_test_runner_is_a_splicer_and_depends_on_positions() -> None:
    runner = PositionalRunner()
    assert kv_splicer(runner) is runner and kv_splicer(HashRunner()) is None
    from localinfer.backends.base import SlotWork

    a = runner.forward([SlotWork(0, (7, 8, 9), 0)])[0]
    b = runner.forward([SlotWork(1, (7, 8), 0)])[0]
    c = runner.forward([SlotWork(1, (9,), 2)])[0]
    assert np.array_equal(a, c) and not np.array_equal(a, b)


def test_off_caches_only_the_shared_prefix() -> None:
    runner = PositionalRunner()
    got = run_all(runner, reuse=True)
    assert runner.splices == []
    prompts = typing_prompts()
    for i, (tokens, cached) in enumerate(got[1:], 1):
        assert cached == len(prompts[i - 1]) - len(SUFFIX) - 2  # up to the typed line
        assert tokens == cold_answers()[i]


def test_on_reuses_the_suffix_and_answers_as_cold() -> None:
    runner = PositionalRunner()
    got = run_all(runner, reuse=True, cache_reuse=16)
    cold = cold_answers()
    prompts = typing_prompts()
    assert [tokens for tokens, _ in got] == cold
    assert got[0][1] == 0
    for i, (_, cached) in enumerate(got[1:], 1):
        # The old prefix, then marker + suffix moved (the last token, 5, is always fed).
        assert cached == len(prompts[i - 1]) - len(SUFFIX) - 2 + 1 + len(SUFFIX)
    assert len(runner.splices) == len(LINES)
    for (_, keep, chunks), line in zip(runner.splices, LINES, strict=True):
        (chunk,) = chunks
        assert chunk.new == tuple(line) and chunk.end - chunk.start == len(SUFFIX) + 1
        assert keep == chunk.start  # the suffix sat right after the old prefix


def test_on_prefills_only_the_new_tokens_and_reports_the_reuse() -> None:
    runner = PositionalRunner()
    engine = manual(runner, prefill_chunk=64, cache_reuse=16)
    first, second = typing_prompts()[:2]
    engine.generate(Request(first, greedy(6)))
    handle = engine.submit(Request(second, greedy(6)))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    reused = len(second) - len(LINES[0]) - 1
    assert reports[0].reused == {handle.request_id: reused}
    # The typed line went in at admission; the steps prefill only the last prompt token.
    assert sum(r.prefilled.get(handle.request_id, 0) for r in reports) == 1
    assert engine.metrics().cached_prompt_tokens_total == reused
    assert slot_cache(engine, 0)[: len(second)] == second


def test_budget_for_new_tokens_is_the_prefill_chunk() -> None:
    runner = PositionalRunner()
    engine = manual(runner, prefill_chunk=4, cache_reuse=16)  # the typed line does not fit
    first, second = typing_prompts()[:2]
    engine.generate(Request(first, greedy(6)))
    result = engine.generate(Request(second, greedy(6)))
    assert runner.splices == [] and result.metrics is not None
    assert result.metrics.cached_tokens == len(first) - len(SUFFIX) - 2


@pytest.mark.parametrize(
    "runner",
    [
        HashRunner(slots=2),
        PositionalRunner(fail_splice="midway"),
        PositionalRunner(fail_splice="unsupported"),
    ],
)
def test_without_a_working_splice_it_is_prefix_reuse(runner: CellRunner) -> None:
    prompts = typing_prompts()
    engine = manual(runner, prefill_chunk=64, cache_reuse=16)
    cold = manual(type(runner)(slots=2), reuse=False, prefill_chunk=64)  # type: ignore[call-arg]
    for i, prompt in enumerate(prompts):
        got = engine.generate(Request(prompt, greedy(6)))
        want = cold.generate(Request(prompt, greedy(6)))
        assert got.token_ids == want.token_ids and got.finish_reason == "length"
        assert got.metrics is not None
        assert got.metrics.cached_tokens == (len(prompts[i - 1]) - len(SUFFIX) - 2 if i else 0)


def test_the_engine_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="cache_reuse must be >= 0"):
        manual(PositionalRunner(), cache_reuse=-1)
    with pytest.raises(ValueError, match="needs prefix_reuse"):
        manual(PositionalRunner(), reuse=False, cache_reuse=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_runners_report_the_moved_suffix_as_cached(backend: str, tmp_path: Path) -> None:
    runner = make_runner(backend, "qwen2", 2, tmp_path)
    engine = manual(runner, prefill_chunk=32, cache_reuse=16)
    head, suffix = seq(40, 1), seq(70, 2)
    prefix = list(head)
    for i in range(4):
        prefix += seq(4 + i, 10 + i)  # a line typed in the middle
        prompt = [1, *prefix, 4, *suffix, 5]
        result = engine.generate(Request(prompt, greedy(5)))
        assert result.finish_reason == "length" and len(result.token_ids) == 5
        assert result.metrics is not None
        if i:  # the old prefix and the moved marker + suffix (the last token is fed)
            assert result.metrics.cached_tokens == len(prefix) - (4 + i) + 1 + 1 + len(suffix)
        slot = engine._scheduler.slots.slots[0]
        assert runner.slot_length(0) == len(slot.cached) and slot.cached[: len(prompt)] == prompt
    runner.close()
