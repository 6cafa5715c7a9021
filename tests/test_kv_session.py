"""The session's KV tiers (issue #24): --kv-ram / --kv-disk become a RAM tier spilling into a disk
tier, sized by the budget (its own row), described for display, persisted by persist_kv and by
close(), and restored by a later session on the same model: the next request's prompt comes from
the disk tier and greedy output equals a cold session's, token for token."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from localinfer import runner_setup
from localinfer import session as session_module
from localinfer.backends.base import kv_transfer
from localinfer.budget.kv_tier import DEFAULT_KV_DISK_CAP, default_kv_ram_bytes
from localinfer.engine import GenerationResult, Request, SamplingParams
from localinfer.engine.kv.tiers import KVTiers, disk_model_key
from localinfer.errors import InvalidParameterError
from localinfer.kv_options import KVTierOptions, add_kv_options, kv_settings
from localinfer.runner_setup import build_kv_tiers
from localinfer.session import Session, open_session

BACKENDS = ("torch", "llamacpp")
# Six tokens an answer: restored, in-slot and cold answers part at the first token a wrong cell
# changes; each token more is a 135M forward in each of the four sessions.
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
SYSTEM = "You are a careful assistant. Answer in one short paragraph, and say when unsure. " * 4
TURN_1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a river."}]


def _open(backend: str, kv: KVTierOptions | None) -> Session:
    return open_session(backend=backend, ctx=512, slots=2, threads=1, kv=kv)


def _needs_transfer(s: Session) -> None:
    if kv_transfer(s.engine.runner) is None:
        s.close()
        pytest.skip(f"the {s.backend} runner has no KVTransfer yet (issue #24's runner work)")


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _turn_2(s: Session, answer: str) -> list[int]:
    messages = [*TURN_1, {"role": "assistant", "content": answer}]
    return s.chat_prompt_ids([*messages, {"role": "user", "content": "How long is it?"}])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_conversation_resumes_from_the_disk_tier_in_a_new_session(
    backend: str, tmp_path: Path
) -> None:
    disk = KVTierOptions(ram="0", disk=tmp_path / "kv")  # no RAM tier: only disk can serve
    with _open(backend, disk) as s:
        _needs_transfer(s)
        ids = s.chat_prompt_ids(TURN_1)
        first = s.engine.generate(Request(ids, GREEDY))
        kept = s.persist_kv([*ids, *first.token_ids])
        prompt = _turn_2(s, first.text)
        (tier,) = s.kv_tiers
        assert (tier.name, tier.entries) == ("disk", 1) and tier.held_bytes > 0
    # The conversation's cells minus the last token, which was sampled but never fed.
    assert kept == len(ids) + len(first.token_ids) - 1
    with _open(backend, disk) as s:  # a new session: empty slots, the same folder
        restored = s.engine.generate(Request(prompt, GREEDY))
    with _open(backend, None) as s:  # the same two turns in one process, from its own slot
        assert s.engine.generate(Request(ids, GREEDY)).token_ids == first.token_ids
        in_slot = s.engine.generate(Request(prompt, GREEDY))
    with open_session(backend=backend, ctx=512, slots=2, threads=1, prefix_reuse=False) as s:
        cold = s.engine.generate(Request(prompt, GREEDY))
        # A step's prompt tokens: what the backend's profile sizes one forward pass for.
        assert s.engine._scheduler.prefill_chunk == {"llamacpp": 512, "torch": 256}[backend]
    assert cold.metrics.cached_tokens == 0
    expect = min(_shared(prompt, [*ids, *first.token_ids]), kept)
    assert restored.metrics.cached_tokens == in_slot.metrics.cached_tokens == expect
    assert expect > len(ids) // 2
    # Restored cells are the bytes the slot held: the answer is the in-process one exactly.
    assert restored.token_ids == in_slot.token_ids
    if backend == "torch":
        assert restored.token_ids == cold.token_ids
    else:  # llama.cpp rounds a batch differently from one-token decodes (test_prefix_reuse_runners)
        _same_up_to_a_near_tie(restored, cold)


def _same_up_to_a_near_tie(warm: GenerationResult, cold: GenerationResult) -> None:
    for w, c in zip(warm.logprobs, cold.logprobs, strict=True):
        if w.token_id != c.token_id:
            margin = c.top[0][2] - c.top[1][2]
            assert margin < 1.0, f"a clear choice ({margin:.2f}) changed"
            return
        assert abs(w.logprob - c.logprob) < 0.5


def test_close_writes_the_slots_to_the_disk_tier(tmp_path: Path) -> None:
    kv = KVTierOptions(disk=tmp_path / "kv")
    with _open("torch", kv) as s:
        ids = s.chat_prompt_ids(TURN_1)
        s.engine.generate(Request(ids, GREEDY))  # no persist_kv: close() keeps it
        folder = s.tiers.disk.folder  # type: ignore[union-attr]
        assert not list(folder.glob("*.kv"))
    assert len(list(folder.glob("*.kv"))) == 1
    with _open("torch", KVTierOptions(ram="0", disk=tmp_path / "kv")) as s:
        again = s.engine.generate(Request(ids, GREEDY))
    assert again.metrics.cached_tokens == len(ids) - 1


def test_the_ram_tier_is_the_budgets_row(tmp_path: Path) -> None:
    with _open("torch", KVTierOptions()) as s:
        report = s.budget
        assert report is not None and report.kv_ram_counted
        model_total = report.total_bytes - report.kv_ram_bytes
        assert report.kv_ram_bytes == default_kv_ram_bytes(report.available_bytes - model_total)
        (ram,) = s.kv_tiers
        assert (ram.name, ram.cap_bytes, ram.entries, ram.where) == (
            "ram",
            report.kv_ram_bytes,
            0,
            "host RAM",
        )
        assert s.tiers.ram is not None and s.tiers.ram.spill is None
    with _open("torch", KVTierOptions(ram="96MiB", disk=tmp_path)) as s:
        ram, disk = s.kv_tiers
        assert ram.cap_bytes == s.budget.kv_ram_bytes == 96 * 2**20  # type: ignore[union-attr]
        assert disk.cap_bytes == DEFAULT_KV_DISK_CAP and disk.where.startswith(str(tmp_path))
        assert s.tiers.ram.spill is s.tiers.disk  # type: ignore[union-attr]
    with _open("torch", None) as s:
        assert s.kv_tiers == [] and s.budget.kv_ram_bytes == 0  # type: ignore[union-attr]
        assert s.persist_kv(s.raw_prompt_ids("Hello there")) == 0


def test_tiers_are_off_with_a_notice_where_they_cannot_work(tmp_path: Path) -> None:
    kv = KVTierOptions(ram="64MiB", disk=tmp_path / "kv")
    s = open_session(ctx=256, slots=1, threads=1, kv=kv, prefix_reuse=False)
    with s:
        assert s.kv_tiers == [] and s.tiers.notice is not None
        assert "prefix reuse is off" in s.tiers.notice
        assert s.budget is not None and s.budget.kv_ram_bytes == 0  # no row for an absent tier
        built = session_module.BuiltRunner(s.model, object(), None, None, s.budget)  # type: ignore[arg-type]
        tiers = build_kv_tiers(kv, built, prefix_reuse=True)
    assert isinstance(tiers, KVTiers) and tiers.stores == ()
    assert "cannot move its KV" in tiers.notice  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kv", "flag"),
    [
        (KVTierOptions(ram="lots"), "--kv-ram"),
        (KVTierOptions(ram="-1GiB"), "--kv-ram"),
        (KVTierOptions(ram="100TiB"), "--kv-ram 100TiB is more than"),
        (KVTierOptions(disk=Path("/tmp"), disk_cap="big"), "--kv-disk-cap"),
    ],
)
def test_bad_tier_sizes_are_refused_before_any_weight_loads(
    kv: KVTierOptions, flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_weights(*args: object) -> None:
        raise AssertionError("a runner was built for bad --kv flags")

    monkeypatch.setattr(runner_setup, "create_runner", no_weights)
    with pytest.raises(InvalidParameterError, match=flag):
        open_session(ctx=64, slots=1, kv=kv)


def test_kv_disk_must_be_a_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(InvalidParameterError, match="--kv-disk"):
        open_session(ctx=64, slots=1, kv=KVTierOptions(disk=a_file))


def test_flags_become_the_session_keyword(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_kv_options(parser)
    args = parser.parse_args(
        ["--kv-ram", "1GiB", "--kv-disk", str(tmp_path), "--kv-disk-cap", "2GiB"]
    )
    assert kv_settings(args) == {"kv": KVTierOptions("1GiB", tmp_path, "2GiB")}
    assert kv_settings(parser.parse_args([])) == {"kv": KVTierOptions()}


def test_models_and_layouts_get_their_own_folders() -> None:
    a, b = "a" * 64, "b" * 64
    names = {
        disk_model_key(h, layout) for h in (a, b) for layout in ("torch;float32", "torch;bf16")
    }
    assert len(names) == 4
