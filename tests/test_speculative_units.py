"""Speculation's parts on their own: n-gram lookup and its incremental index, the adaptive-k
controller, config validation, the draft/target tokenizer check, and how a draft is chosen and
speculation is set up per backend."""

from __future__ import annotations

import numpy as np
import pytest

from localinfer.engine.speculative import (
    AdaptiveK,
    NgramIndex,
    NgramProposer,
    SpecConfig,
    check_shared_tokenizer,
)
from localinfer.engine.speculative.adaptive import best_k, expected_tokens
from localinfer.errors import InvalidParameterError


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
