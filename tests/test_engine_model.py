"""Small deterministic numpy models that implement the Runner protocol exactly, for engine tests.

- CellRunner: the per-slot bookkeeping and protocol checks the numpy runners share.
- HashRunner: next-token logits are a pure function of the slot's *whole* cached context (a rolling
  hash seeds the logits), so any mistake in what the engine feeds, where, or in which slot changes
  the generated tokens. It enforces the protocol with ``check_batch`` and keeps its per-slot
  "KV cache" (the hash chain) exactly like a real runner.
- ScriptRunner: greedy decoding reproduces a scripted continuation after the prompt (for stop
  strings and UTF-8 through the engine with a real tokenizer).
- ByteTokenizer: token i is the byte i.

This module also tests these helpers themselves, so the engine tests stand on checked ground.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from localinfer.backends.base import MemoryReport, RunnerInfo, SlotWork, check_batch
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.errors import ContextOverflowError

_MOD = (1 << 61) - 1


class CellRunner:
    """What both numpy runners keep like a real runner: per slot, one cell per cached position
    (a real runner's KV entry), the protocol checks, and every forward's batch for assertions. A
    subclass says what a fed token leaves in its slot's cells and the logits row it gives
    (``_step``)."""

    def __init__(self, info: RunnerInfo) -> None:
        self.info = info
        self._cells: list[list[int]] = [[] for _ in range(info.slots)]
        self.batches: list[list[SlotWork]] = []

    def _step(self, cells: list[int], token: int) -> np.ndarray:
        raise NotImplementedError

    def _validate(self, batch: Sequence[SlotWork]) -> None:
        """Checks beyond the protocol's, made before any state changes."""

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        check_batch(batch, [len(c) for c in self._cells], self.info.max_ctx)
        self._validate(batch)
        self.batches.append(list(batch))
        out: list[np.ndarray] = []
        for work in batch:
            rows = [self._step(self._cells[work.slot], t) for t in work.tokens]
            out.append(np.stack(rows) if work.logits == "all" else rows[-1][None, :])
        return out

    def slot_length(self, slot: int) -> int:
        return len(self._cells[slot])

    def truncate(self, slot: int, length: int) -> None:
        del self._cells[slot][length:]

    def release(self, slot: int) -> None:
        self._cells[slot].clear()


class HashRunner(CellRunner):
    def __init__(
        self,
        vocab_size: int = 256,
        slots: int = 4,
        max_ctx: int = 256,
        *,
        discourage: Sequence[int] = (0,),
        fail_on_token: int | None = None,
    ) -> None:
        # A slot's cells: the rolling hash after each position.
        super().__init__(
            RunnerInfo("numpy-hash", "cpu", "float32", slots, max_ctx, vocab_size, "fp32")
        )
        self._discourage = list(discourage)  # e.g. eos: keep generations long
        self.fail_on_token = fail_on_token
        self.closed = False

    def _logits(self, h: int) -> np.ndarray:
        x = np.random.default_rng(h).standard_normal(self.info.vocab_size).astype(np.float32)
        x *= 3.0
        x[self._discourage] -= 8.0
        return x  # [vocab]

    def _step(self, cells: list[int], token: int) -> np.ndarray:
        prev = cells[-1] if cells else 7
        cells.append((prev * 1_000_003 + token + 1) % _MOD)
        return self._logits(cells[-1])

    def _validate(self, batch: Sequence[SlotWork]) -> None:
        for work in batch:
            for t in work.tokens:
                if not 0 <= t < self.info.vocab_size:
                    raise ValueError(f"token {t} out of range")
                if t == self.fail_on_token:
                    raise RuntimeError(f"poisoned token {t}")

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        assert not self.closed
        return super().forward(batch)

    def memory(self) -> MemoryReport:
        cells = sum(len(c) for c in self._cells)
        return MemoryReport(weights=0, kv_cache=cells * 8, overhead=0, device="cpu")

    def close(self) -> None:
        self.closed = True


# ScriptRunner's logit for every token off the script. At 20 below the scripted one (as it was)
# each of a 49k vocabulary's tokens kept e^-20 of a temperature-1 draw, about 1e-4 of every draw
# in all: server tests sampling at their API's default temperature (Anthropic's is 1.0) now and
# then wrote a stray token ("BerThe answer is 4."). This far below, softmax gives them exactly 0
# at every temperature the engine accepts (at most 5), in float32 and float64.
OFF_SCRIPT = -1e4


class ScriptRunner(HashRunner):
    """Output after the prompt follows ``script`` (then ``end`` forever), greedy or sampled at
    any temperature: every other token's probability is exactly 0.

    The script position is the slot's length past the prompt, so it depends on the cache being
    fed correctly; the prompt length is told per slot via ``prompt_len``.
    """

    def __init__(self, script: Sequence[int], end: int, vocab_size: int = 256, **kw: object):
        super().__init__(vocab_size, **kw)  # type: ignore[arg-type]
        self.script = list(script)
        self.end = end
        self.prompt_len: dict[int, int] = {}

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        for work in batch:
            if work.start_pos == 0:
                self.prompt_len[work.slot] = len(work.tokens)  # one-chunk prompts only
        out = super().forward(batch)
        result = []
        for work, _ in zip(batch, out, strict=True):
            pos = self.slot_length(work.slot) - self.prompt_len[work.slot]
            target = self.script[pos] if pos < len(self.script) else self.end
            x = np.full((1, self.info.vocab_size), OFF_SCRIPT, dtype=np.float32)
            x[0, target] = 10.0
            result.append(x)
        return result


class ByteTokenizer:
    """Token i is byte i (vocab 256); eos ids configurable."""

    def __init__(self, eos_ids: Sequence[int] = (0,)) -> None:
        self.eos_ids = tuple(eos_ids)
        self.vocab_size = 256

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


# -- tests of the helpers -----------------------------------------------------------------------


def test_hash_runner_depends_on_whole_context_and_is_batch_independent() -> None:
    r = HashRunner(slots=2)
    a = r.forward([SlotWork(0, (5, 6, 7), 0)])[0]
    b = r.forward([SlotWork(1, (9, 6, 7), 0)])[0]
    assert not np.allclose(a, b)  # same last tokens, different history
    # Chunked feeding gives the same logits as one chunk, and batching does not matter.
    r2 = HashRunner(slots=2)
    r2.forward([SlotWork(0, (5,), 0), SlotWork(1, (9, 6), 0)])
    a2, b2 = r2.forward([SlotWork(0, (6, 7), 1), SlotWork(1, (7,), 2)])
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)


def test_hash_runner_enforces_the_protocol() -> None:
    r = HashRunner(slots=1, max_ctx=4)
    r.forward([SlotWork(0, (1, 2), 0)])
    with pytest.raises(ValueError, match="start_pos"):
        r.forward([SlotWork(0, (3,), 0)])
    with pytest.raises(ContextOverflowError):
        r.forward([SlotWork(0, (3, 4, 5), 2)])
    assert r.slot_length(0) == 2  # nothing written by failed calls
    r.truncate(0, 1)
    again = r.forward([SlotWork(0, (2,), 1)])[0]
    r.release(0)
    fresh = r.forward([SlotWork(0, (1, 2), 0)])[0]
    np.testing.assert_array_equal(again, fresh)


def test_script_runner_follows_its_script() -> None:
    r = ScriptRunner([10, 11, 12], end=3, slots=1)
    out = r.forward([SlotWork(0, (1, 2, 3, 4), 0)])[0]
    got = [int(np.argmax(out))]
    for _ in range(3):
        out = r.forward([SlotWork(0, (got[-1],), r.slot_length(0))])[0]
        got.append(int(np.argmax(out)))
    assert got == [10, 11, 12, 3]


def test_script_runner_is_followed_when_sampling_at_any_temperature() -> None:
    # Server tests sample at their API's default temperature (Anthropic's 1.0), so the script
    # must hold for a sampled draw, up to the highest temperature the engine takes, not only
    # for argmax. Seeded: the same draws every run (at 5 most of them left the old script).
    text = "The answer is 4."
    engine = Engine(
        ScriptRunner(list(text.encode()), end=0, slots=1), ByteTokenizer(), background=False
    )
    try:
        for seed in range(4):
            params = SamplingParams(max_tokens=50, temperature=5.0, seed=seed)
            assert engine.generate(Request([1, 2], params)).text == text
    finally:
        engine.close()
