"""One tier lookup per admission attempt (kv_placement.SlotPlacer.place): whether a request
waits and which source it takes are decided from one ``best_match`` per tier, counted here on a
real RamKVStore driven through a real engine (TransferHashRunner: exact cells, so a wrong restore
changes the tokens)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from localinfer.engine import Request
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.store import TierMatch
from tests.prefix_reuse_helpers import greedy, seq
from tests.test_engine import reference_greedy
from tests.test_kv_tiers_engine import run, tiers_engine


class CountingRam(RamKVStore):
    """The RAM tier, counting the lookups made with each token sequence."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.lookups: Counter[tuple[int, ...]] = Counter()

    def best_match(self, prompt_ids: Sequence[int]) -> TierMatch | None:
        self.lookups[tuple(prompt_ids)] += 1
        return super().best_match(prompt_ids)


def test_a_request_that_waited_then_restores_asks_once_per_attempt() -> None:
    """b waits while a prefills their shared beginning; meanwhile that beginning reaches the RAM
    tier from elsewhere, so b's next attempt finds it there and restores it: that attempt decides
    "no need to wait" and "restore from RAM" from a single lookup."""
    ram = CountingRam(1 << 20)
    _, engine = tiers_engine(2, ram)
    _, other = tiers_engine(1, ram)  # another engine on the same tier fills it
    system = seq(100, 1)
    a, b = system + seq(60, 2), system + seq(20, 3)
    h_a, h_b = engine.submit_all([Request(a, greedy(4)), Request(b, greedy(4))])
    first = engine.step()
    assert first.admitted == [h_a.request_id]  # b waits for a's prefill of the system prompt
    assert ram.lookups[tuple(a)] == 1 and ram.lookups[tuple(b)] == 1
    elsewhere = system + seq(10, 4)
    out, _ = run(other, elsewhere, 2)
    assert other.persist_prefix(elsewhere + out) > len(system)
    report = engine.step()  # a is still prefilling (64 of its 160 tokens cached)
    assert report.admitted == [h_b.request_id]
    assert report.reuse_source[h_b.request_id] == "ram"
    assert report.reused[h_b.request_id] == len(system)
    assert ram.lookups[tuple(b)] == 2  # two attempts, one lookup each
    while engine.has_work():
        engine.step()
    assert list(h_a.result().token_ids) == reference_greedy(a, 4)
    assert list(h_b.result().token_ids) == reference_greedy(b, 4)
    assert ram.lookups[tuple(a)] == 1
