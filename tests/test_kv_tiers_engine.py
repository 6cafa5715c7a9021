"""The KV tiers in the engine (issue #24): prefix copy between slots, the RAM tier, a spill tier,
persisting and flushing, and cold = warm under greedy decoding.

- RamKVStore on its own: LRU by bytes, prefixes superseded, spill, oversize entries.
- Placement and bookkeeping on TransferHashRunner (the exact HashRunner plus KVTransfer: its
  logits hash the whole cached context, so any wrong copy or restore changes the tokens).
- Parity on the real runners (tiny random models) and the embedded model: cold = own slot =
  copied (idle and busy source) = restored from RAM = restored from a spill tier.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import KVSnapshot, Runner, kv_transfer
from localinfer.engine import Engine, Request, StepReport
from localinfer.engine.kv.placement import MIN_TRANSFER
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.store import KVStore, TierMatch
from localinfer.engine.slots import shared_prefix
from tests.prefix_reuse_helpers import greedy, manual, seq, slot_cache
from tests.test_engine import reference_greedy
from tests.test_engine_model import ByteTokenizer, HashRunner
from tests.test_prefix_reuse_runners import ARCHS, runner_factory

# -- helpers ------------------------------------------------------------------------------------


class TransferHashRunner(HashRunner):
    """HashRunner with KVTransfer: a cell is the rolling hash at its position (8 bytes). Its
    cells are its own, so it is its own ``kv_cache``."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.kv_cache = self
        self.copies: list[tuple[int, int, int]] = []
        self.restores: list[tuple[int, int]] = []

    def layout(self) -> str:
        return "numpy-hash;cell=u64"

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        if src == dst or not 1 <= n_tokens <= len(self._cells[src]):
            raise ValueError(f"copy_prefix({src}, {dst}, {n_tokens})")
        self._cells[dst] = list(self._cells[src][:n_tokens])
        self.copies.append((src, dst, n_tokens))

    def snapshot(self, slot: int, n_tokens: int) -> KVSnapshot:
        if not 1 <= n_tokens <= len(self._cells[slot]):
            raise ValueError(f"snapshot({slot}, {n_tokens})")
        payload = np.asarray(self._cells[slot][:n_tokens], dtype=np.uint64).tobytes()
        return KVSnapshot(self.layout(), n_tokens, payload)

    def restore(self, slot: int, snapshot: KVSnapshot) -> None:
        if snapshot.layout != self.layout() or snapshot.nbytes != 8 * snapshot.n_tokens:
            raise ValueError("restore: malformed snapshot")
        cells = np.frombuffer(snapshot.payload, dtype=np.uint64)
        self._cells[slot] = [int(c) for c in cells]
        self.restores.append((slot, snapshot.n_tokens))


class MemStore:
    """An in-memory KVStore standing in for the disk tier (no bound; thread-safe, as a tier the
    RAM tier spills into is stored into from its spill thread)."""

    def __init__(self, name: str = "disk") -> None:
        self.name = name
        self.entries: dict[tuple[int, ...], KVSnapshot] = {}
        self.loads = 0
        self.lock = threading.Lock()

    def best_match(self, prompt_ids: Sequence[int]) -> TierMatch | None:
        with self.lock:
            scored = [(shared_prefix(k, list(prompt_ids)), k) for k in self.entries]
        best = max(scored, default=None)
        return None if best is None or best[0] == 0 else TierMatch(self.name, best[1], best[0])

    def load(self, key: tuple[int, ...]) -> KVSnapshot | None:
        with self.lock:
            self.loads += 1
            return self.entries.get(key)

    def store(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        assert snapshot.n_tokens == len(key)
        with self.lock:
            for old in [k for k in self.entries if key[: len(k)] == k]:
                del self.entries[old]
            self.entries[key] = snapshot

    def nbytes(self) -> int:
        with self.lock:
            return sum(s.nbytes for s in self.entries.values())


class CorruptStore(MemStore):
    """Hands out a damaged payload for every entry."""

    def load(self, key: tuple[int, ...]) -> KVSnapshot | None:
        snap = super().load(key)
        return None if snap is None else KVSnapshot(snap.layout, snap.n_tokens, b"\x00" * 5)


def snap(n: int, nbytes: int = 100) -> KVSnapshot:
    return KVSnapshot("test", n, b"x" * nbytes)


def run(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], list[StepReport]]:
    """Generate with a hand-stepped engine; the tokens and every step's report."""
    handle = engine.submit(Request(prompt, greedy(n)))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    return list(handle.result().token_ids), reports


def source_of(reports: list[StepReport]) -> tuple[int, str]:
    """(reused tokens, source) of the one request admitted in ``reports``."""
    for r in reports:
        for rid in r.admitted:
            return r.reused.get(rid, 0), r.reuse_source.get(rid, "cold")
    raise AssertionError("nothing admitted")


def prefilled(reports: list[StepReport]) -> int:
    return sum(sum(r.prefilled.values()) for r in reports)


# -- RamKVStore ---------------------------------------------------------------------------------


def test_ram_store_is_an_lru_by_bytes_and_spills_what_it_evicts() -> None:
    disk = MemStore()
    ram = RamKVStore(300, spill=disk)
    assert isinstance(ram, KVStore)
    keys = [tuple(range(i * 100, i * 100 + 20)) for i in range(4)]
    for k in keys[:3]:
        ram.store(k, snap(20))
    assert ram.nbytes() == 300 and len(ram) == 3
    assert ram.load(keys[0]) is not None  # now the most recently used
    ram.store(keys[3], snap(20))
    assert ram.keys() == [keys[2], keys[0], keys[3]] and ram.nbytes() == 300
    ram.drain()  # spills are written by a background thread
    assert list(disk.entries) == [keys[1]] and ram.evicted == 1
    ram.store(tuple(range(1000, 1040)), snap(40, nbytes=301))  # bigger than the tier
    ram.drain()
    assert len(ram) == 3 and tuple(range(1000, 1040)) in disk.entries
    assert ram.spill_all() == 3 and len(ram) == 0 and ram.nbytes() == 0
    assert len(disk.entries) == 5
    with pytest.raises(ValueError):
        RamKVStore(-1)
    with pytest.raises(ValueError, match="stored under"):
        ram.store((1, 2, 3), snap(2))


def test_ram_store_supersedes_prefixes_and_matches_the_longest() -> None:
    ram = RamKVStore(10_000)
    base = tuple(seq(50, 1))
    ram.store(base[:20], snap(20))
    ram.store(base[:35], snap(35))  # supersedes the 20-token entry
    assert ram.keys() == [base[:35]]
    ram.store(base[:30], snap(30))  # held already by the 35-token entry: nothing new
    assert ram.keys() == [base[:35]] and ram.nbytes() == 100
    other = tuple(seq(40, 2))
    ram.store(other, snap(40))
    m = ram.best_match(list(base[:28]) + [999])
    assert m == TierMatch("ram", base[:35], 28)
    assert ram.best_match(list(base) + [1]) == TierMatch("ram", base[:35], 35)
    assert ram.best_match([7777, 1, 2]) is None and ram.best_match([]) is None
    assert ram.load((1, 2)) is None


# -- placement on the exact runner --------------------------------------------------------------


def tiers_engine(slots: int, *stores: KVStore, **kw: object) -> tuple[TransferHashRunner, Engine]:
    runner = TransferHashRunner(slots=slots, max_ctx=512)
    return runner, manual(runner, prefill_chunk=64, kv_stores=stores, **kw)


def test_two_conversations_alternating_on_one_slot_restore_from_ram() -> None:
    from tests.test_kv_lookups import CountingRam

    ram = CountingRam(1 << 20)  # also: one tier lookup per admission (test_kv_lookups.py)
    runner, engine = tiers_engine(1, ram)
    _, plain = tiers_engine(1)  # prefix reuse without tiers: the other conversation evicts
    convs = {"a": seq(60, 1), "b": seq(70, 2)}
    for turn in range(3):
        for name in ("a", "b"):
            prompt = convs[name]
            tokens, reports = run(engine, prompt, 8)
            assert tokens == reference_greedy(prompt, 8)
            reused, source = source_of(reports)
            base_tokens, base_reports = run(plain, prompt, 8)
            assert base_tokens == tokens
            if turn:  # the whole earlier turn comes back from RAM, only the rest is prefilled
                assert source == "ram" and reused == len(prompt) - 6 - 1
                assert prefilled(reports) == len(prompt) - reused
                assert source_of(base_reports)[0] == 0
            assert ram.lookups[tuple(prompt)] == 1  # admitted at the first attempt
            convs[name] = prompt + tokens + seq(6, 10 * turn + len(name))
    assert engine.metrics().reused_tokens_by_source["ram"] > 0
    assert engine.metrics().kv_ram_bytes == ram.nbytes() > 0
    assert len(ram) == 2  # each conversation's latest cells; earlier turns superseded


def test_eight_conversations_sharing_a_system_prompt_prefill_it_once_per_slot() -> None:
    system = seq(200, 1)
    prompts = [system + seq(20, 10 + i) for i in range(8)]
    # One after another: the system prompt is prefilled once, then copied or kept in place.
    runner, engine = tiers_engine(4, RamKVStore(1 << 20))
    total, sources = 0, []
    for i, prompt in enumerate(prompts):
        tokens, reports = run(engine, prompt, 4)
        assert tokens == reference_greedy(prompt, 4)
        total += prefilled(reports)
        sources.append(source_of(reports))
        if i < 4:  # a new conversation takes an empty slot: nobody's cells are evicted
            assert slot_cache(engine, i)[: len(prompt)] == prompt
    assert total == len(system) + 8 * 20
    assert sources[0] == (0, "cold") and sources[1:4] == [(200, "copy")] * 3
    assert all(s == (200, "slot") for s in sources[4:])  # the LRU slot keeps the system prompt
    # All at once: the first prefills it while the others wait, then they copy it.
    for reuse in (True, False):
        _, engine = tiers_engine(4, RamKVStore(1 << 20), reuse=reuse)
        handles = engine.submit_all([Request(p, greedy(4)) for p in prompts])
        reports = []
        while engine.has_work():
            reports.append(engine.step())
        for h, p in zip(handles, prompts, strict=True):
            assert list(h.result().token_ids) == reference_greedy(p, 4)
        assert prefilled(reports) == (1 if reuse else 8) * len(system) + 8 * 20


def test_a_request_waits_for_a_shared_beginning_being_prefilled_not_forever() -> None:
    runner, engine = tiers_engine(2)
    system = seq(150, 1)
    a, b = system + seq(10, 2), system + seq(10, 3)
    h_a, h_b = engine.submit_all([Request(a, greedy(20)), Request(b, greedy(4))])
    first = engine.step()
    assert first.admitted == [h_a.request_id] and first.prefilled == {h_a.request_id: 64}
    assert engine.step().admitted == []  # b waits: slot 1 stays free
    h_a.abort()  # the slot it waited on stops prefilling: it goes ahead with what is there
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    assert list(h_b.result().token_ids) == reference_greedy(b, 4)
    assert h_a.result().finish_reason == "abort"
    assert source_of(reports) == (128, "slot")  # a's idle slot holds just b's beginning


def test_copy_from_a_busy_and_from_an_idle_slot() -> None:
    runner, engine = tiers_engine(3)
    system = seq(100, 1)
    first = system + seq(10, 2)
    h1 = engine.submit(Request(first, greedy(30)))
    while len(slot_cache(engine, 0)) < len(first) + 3:  # prefilled and decoding
        engine.step()
    second = first + seq(12, 3)  # shares the busy slot's whole prompt
    h2 = engine.submit(Request(second, greedy(6)))
    report = engine.step()
    rid2 = h2.request_id
    assert report.reuse_source[rid2] == "copy" and report.reused[rid2] == len(first)
    assert runner.copies == [(0, 1, len(first))]
    while engine.has_work():
        engine.step()
    assert list(h1.result().token_ids) == reference_greedy(first, 30)
    assert list(h2.result().token_ids) == reference_greedy(second, 6)
    held0 = slot_cache(engine, 0)
    third = system + seq(15, 4)  # an idle source; slot 2 is empty, so no cells are evicted
    tokens, reports = run(engine, third, 5)
    assert tokens == reference_greedy(third, 5) and source_of(reports) == (100, "copy")
    assert runner.copies[-1][1:] == (2, 100) and slot_cache(engine, 0) == held0
    assert engine.metrics().reused_tokens_by_source == {"copy": len(first) + 100}


def test_a_short_match_is_not_worth_copying_or_evicting() -> None:
    runner, engine = tiers_engine(2, RamKVStore(1 << 20))
    a = seq(40, 1)
    run(engine, a, 4)
    b = a[: MIN_TRANSFER - 1] + seq(30, 2)
    tokens, reports = run(engine, b, 4)
    assert tokens == reference_greedy(b, 4) and source_of(reports) == (0, "cold")
    assert slot_cache(engine, 0)[:40] == a and not runner.copies  # a's slot left alone


def test_a_short_prompt_sent_again_is_restored_or_copied_not_prefilled() -> None:
    """Under MIN_TRANSFER tokens, a match that is the whole prompt (a client repeating a request)
    is still worth a restore or a copy: only its last token is fed."""
    p = seq(MIN_TRANSFER // 2, 1)
    runner, engine = tiers_engine(1, RamKVStore(1 << 20))
    first, _ = run(engine, p, MIN_TRANSFER)  # the slot holds enough cells for the tier to keep
    run(engine, seq(40, 2), 4)  # another conversation takes the only slot: p's cells to RAM
    tokens, reports = run(engine, p, MIN_TRANSFER)
    assert tokens == first == reference_greedy(p, MIN_TRANSFER)
    assert source_of(reports) == (len(p) - 1, "ram") and prefilled(reports) == 1
    # Beside a busy slot decoding it, the same short prompt is copied across.
    runner, engine = tiers_engine(2)
    h1 = engine.submit(Request(p, greedy(30)))
    while len(slot_cache(engine, 0)) < len(p) + 3:
        engine.step()
    tokens, reports = run(engine, p, 4)
    assert tokens == reference_greedy(p, 4) and source_of(reports) == (len(p) - 1, "copy")
    assert runner.copies == [(0, 1, len(p) - 1)] and prefilled(reports) == 1
    assert list(h1.result().token_ids) == reference_greedy(p, 30)


def test_a_spilled_entry_is_restored_from_the_spill_tier() -> None:
    disk = MemStore()
    ram = RamKVStore(70 * 8, spill=disk)  # room for one conversation's cells
    runner, engine = tiers_engine(1, ram, disk)
    convs = [seq(50, i) for i in range(3)]
    for c in convs:
        run(engine, c, 4)
    ram.drain()  # conv 0's spill is written by a background thread
    assert len(ram) == 1 and len(disk.entries) == 1  # conv 0 spilled, conv 1 in RAM
    for i, want in ((1, "ram"), (0, "disk")):
        prompt = convs[i] + seq(5, 9)
        tokens, reports = run(engine, prompt, 6)
        assert tokens == reference_greedy(prompt, 6)
        assert source_of(reports) == (len(convs[i]), want)
    assert ram.nbytes() <= ram.capacity_bytes
    by = engine.metrics().reused_tokens_by_source
    assert by["disk"] == by["ram"] == 50


def test_ram_tier_stays_within_its_bound() -> None:
    ram = RamKVStore(2 * 60 * 8)
    _, engine = tiers_engine(1, ram)
    for i in range(6):
        run(engine, seq(50, i), 10)
        assert ram.nbytes() <= ram.capacity_bytes and len(ram) <= 2
    assert ram.evicted == 3 and len(ram) == 2


def test_a_failing_restore_falls_back_cold_and_the_request_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = CorruptStore()
    runner, engine = tiers_engine(1, bad)
    prompt = seq(60, 1)
    bad.entries[tuple(prompt[:40])] = KVSnapshot("numpy-hash;cell=u64", 40, b"\x00" * 320)
    tokens, reports = run(engine, prompt, 6)
    assert tokens == reference_greedy(prompt, 6) and source_of(reports) == (0, "cold")
    assert prefilled(reports) == len(prompt) and bad.loads == 1
    assert engine.metrics().kv_transfer_failures == 1
    assert sum("restore of 40 tokens failed" in r.message for r in caplog.records) == 1


def test_without_kv_transfer_the_tiers_are_left_alone() -> None:
    ram = RamKVStore(1 << 20)
    engine = manual(HashRunner(slots=1), kv_stores=[ram])
    for i in range(2):
        prompt = seq(40, i)
        assert list(engine.generate(Request(prompt, greedy(4))).token_ids) == reference_greedy(
            prompt, 4
        )
    assert len(ram) == 0 and engine.persist_prefix(seq(40, 0)) == 0


def test_persist_prefix_and_close_write_the_tiers_a_new_engine_restores() -> None:
    disk = MemStore()
    runner = TransferHashRunner(slots=2)
    stores = [RamKVStore(1 << 20, spill=disk), disk]
    engine = Engine(runner, ByteTokenizer(), prefix_reuse=True, kv_stores=stores)
    conv = seq(80, 1)
    answer = list(engine.generate(Request(conv, greedy(5))).token_ids)
    other = seq(30, 2)
    engine.generate(Request(other, greedy(3)))
    stored: list[int] = []
    caller = threading.Thread(target=lambda: stored.append(engine.persist_prefix(conv + answer)))
    caller.start()  # from another thread, as the chat UI calls it
    caller.join(timeout=30)
    assert stored == [len(conv) + 4] and tuple(conv + answer[:4]) in disk.entries
    engine.close()  # flushes every slot's cells: the other conversation's too
    assert any(k[:30] == tuple(other) for k in disk.entries)
    # "A new process": a fresh runner and engine with only the spill tier.
    runner2 = TransferHashRunner(slots=2)
    engine2 = manual(runner2, kv_stores=[disk])
    prompt = conv + answer + seq(6, 3)
    tokens, reports = run(engine2, prompt, 5)
    assert tokens == reference_greedy(prompt, 5)
    assert source_of(reports) == (len(conv) + 4, "disk")


# -- parity on the real runners -----------------------------------------------------------------


def tier_scenario(runner: Runner, cold: Engine, stores: Sequence[KVStore]) -> list[str]:
    """Cold, own slot, copy from an idle slot, copy from a busy one, then a restore from the
    tiers after the slot was reused, each checked against ``cold`` (prefix reuse off, its own
    runner); returns the sources in that order."""
    engine = manual(runner, prefill_chunk=16, kv_stores=stores)
    system = seq(40, 1)
    sources: list[str] = []

    def both(prompt: list[int], n: int) -> list[int]:
        tokens, reports = run(engine, prompt, n)
        assert tokens == list(cold.generate(Request(prompt, greedy(n))).token_ids)
        sources.append(source_of(reports)[1])
        return tokens

    a1 = system + seq(10, 2)
    a2 = a1 + both(a1, 8) + seq(6, 3)
    a3 = a2 + both(a2, 8) + seq(6, 4)
    b1 = system + seq(10, 5)
    both(b1, 6)  # slot 1 is empty: it copies the system prompt from slot 0
    e1 = system + seq(12, 6)  # takes the least recently used slot (0: a's cells leave)
    h_e = engine.submit(Request(e1, greedy(20)))
    slot0 = engine._scheduler.slots.slots[0]
    while slot0.seq is None or len(slot0.cached) < len(e1) + 2:  # e's prompt in, decoding
        engine.step()
    f1 = e1 + seq(6, 7)  # slot 1 left: the busy slot 0 holds more of its prompt
    h_f = engine.submit(Request(f1, greedy(6)))
    report = engine.step()
    sources.append(report.reuse_source.get(h_f.request_id, "cold"))
    while engine.has_work():
        engine.step()
    for h, prompt, n in ((h_e, e1, 20), (h_f, f1, 6)):
        assert list(h.result().token_ids) == list(
            cold.generate(Request(prompt, greedy(n))).token_ids
        )
    for store in stores:  # spills written: a3 finds a's cells in the tier they went to
        if isinstance(store, RamKVStore):
            store.drain()
    both(a3, 8)  # both slots were reused: a's cells come back from a tier
    return sources


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["torch", "llamacpp", "mlx"])
def test_restored_and_copied_equal_cold_on_tiny_models(
    backend: str, arch: str, tmp_path: Path
) -> None:
    make = runner_factory(backend, arch, tmp_path)
    runners = [make() for _ in range(3)]
    if kv_transfer(runners[0]) is None:
        for r in runners:
            r.close()
        pytest.skip(f"the {backend} runner has no KVTransfer yet")
    cold = manual(runners[2], reuse=False, prefill_chunk=16)
    got = tier_scenario(runners[0], cold, [RamKVStore(1 << 30)])
    assert got == ["cold", "slot", "copy", "copy", "ram"]
    disk = MemStore()  # a RAM tier too small for anything: every snapshot goes to the spill tier
    got = tier_scenario(runners[1], cold, [RamKVStore(0, spill=disk), disk])
    assert got == ["cold", "slot", "copy", "copy", "disk"] and disk.loads == 1
    for r in runners:
        r.close()


# Six greedy tokens per answer: a wrong copy or restore shows from the first token on, and each
# more token is one more 135M forward on each of the warm and cold engines.
ANSWER = 6


def test_embedded_model_restored_equals_cold_on_torch() -> None:
    pytest.importorskip("torch")
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.torch.runner import TorchRunner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    tok = model.tokenizer
    config = RunnerConfig(slots=1, max_ctx=512, threads=1)
    warm_runner, cold_runner = TorchRunner(model, config), TorchRunner(model, config)
    disk = MemStore()
    engine = Engine(warm_runner, tok, background=False, prefix_reuse=True,
                    kv_stores=[RamKVStore(1 << 30), disk])  # fmt: skip
    cold = Engine(cold_runner, tok, background=False, prefix_reuse=False)
    texts = [
        "The history of the city begins in the Roman era, when a small settlement grew along "
        "the river. Over the centuries, merchants, monks and soldiers shaped its streets.",
        "A recipe for bread needs flour, water, salt and yeast. Knead the dough for ten "
        "minutes, let it rise for an hour, then bake it in a hot oven until golden.",
    ]
    prompts = [tok.encode(t, add_special_tokens=True) for t in texts]
    for turn in range(2):
        for i, prompt in enumerate(prompts):
            tokens, reports = run(engine, prompt, ANSWER)
            assert tokens == list(cold.generate(Request(prompt, greedy(ANSWER))).token_ids)
            if turn:
                assert source_of(reports)[1] == "ram"
            prompts[i] = prompt + tokens + tok.encode(" Tell me more.")
    assert engine.persist_prefix(prompts[1]) > 0 and len(disk.entries) == 1
    engine.close()
    # A fresh runner restores from the spill tier alone, as a new process would.
    fresh = Engine(TorchRunner(model, config), tok, background=False, prefix_reuse=True,
                   kv_stores=[disk])  # fmt: skip
    tokens, reports = run(fresh, prompts[1], ANSWER)
    assert source_of(reports)[1] == "disk"
    assert tokens == list(cold.generate(Request(prompts[1], greedy(ANSWER))).token_ids)
    for e in (fresh, cold):
        e.close()
    for r in (warm_runner, cold_runner, fresh.runner):
        r.close()
