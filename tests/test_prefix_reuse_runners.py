"""Prefix reuse on the real runners: what a request generates over a reused cache is what a cold
prefill would give.

- Cached = cold on every real runner, through the Engine: a next chat turn (the prefix ends
  mid-conversation), a prompt that diverges inside the cached part, a prompt that is wholly cached,
  and teacher-forced logits over a reused cache against a fresh slot.
- The embedded SmolLM2 model on the default session backend: a real multi-turn chat through
  ``Session.chat_prompt_ids`` with reuse on and off.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import Runner, RunnerConfig, SlotWork
from localinfer.engine import Request, SamplingParams
from localinfer.loading.model import LoadedModel
from tests.prefix_reuse_helpers import greedy, manual, seq, slot_cache
from tests.test_engine_model import ByteTokenizer
from tests.tiny import tiny_model

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]


# -- cached = cold on the real runners (tiny random models) -------------------------------------

RunnerFactory = Callable[[], Runner]


def engine_model(arch: str) -> LoadedModel:
    """A tiny model with byte tokens, ending on tiny_config's eos id 2."""
    return tiny_model(arch, seed=1, path=Path("/dev/null"), tokenizer=ByteTokenizer(eos_ids=(2,)))


def runner_factory(backend: str, arch: str, tmp_path: Path) -> RunnerFactory:
    config = RunnerConfig(slots=2, max_ctx=160, threads=1)
    if backend == "torch":
        mod = pytest.importorskip("localinfer.backends.torch.runner")
        return lambda: mod.TorchRunner(engine_model(arch), config)
    if backend == "mlx":
        pytest.importorskip("mlx.core")
        mod = pytest.importorskip("localinfer.backends.mlx.runner")
        return lambda: mod.create_runner(engine_model(arch), config)
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.llamacpp_helpers import tiny_setup

    _, _, model = tiny_setup(tmp_path, arch, seed=1)
    return lambda: LlamaCppRunner(model, config)


def assert_logits_match(backend: str, warm: np.ndarray, cold: np.ndarray) -> None:
    """The tightest agreement each backend gives between a reused cache and a cold prefill.

    mlx: bit-identical (its kernels do not depend on how many tokens a forward carries).
    torch fp32: not bit-identical, because a matmul's blocking (so its summation order) follows
    the number of rows fed; measured max |diff| <= 2e-5 at logit scale ~65 (3e-7 relative).
    llama.cpp: its CPU kernels differ by ubatch size (a forward of 1..63 tokens takes another
    matmul path than one of >= 64), so KV computed by one-token decodes or short chunks differs
    from a whole prefill's; measured max |diff| 0.017 at scale 65 (2.6e-4 relative) on these F32
    models. Reuse itself adds nothing: see the exact replay test on the embedded model.
    """
    assert warm.shape == cold.shape
    if backend == "mlx":
        np.testing.assert_array_equal(warm, cold)
        return
    scale = float(np.abs(cold).max())
    rel = 1e-5 if backend == "torch" else 2e-3
    err = float(np.abs(warm - cold).max())
    assert err <= rel * scale, f"{backend}: max |diff| {err:.3g} at scale {scale:.3g}"
    top = np.sort(cold, axis=-1)
    clear = top[:, -1] - top[:, -2] > 2 * err  # rows that are not near-ties
    assert (warm.argmax(-1) == cold.argmax(-1))[clear].all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["torch", "llamacpp", "mlx"])
def test_cached_equals_cold_on_tiny_models(backend: str, arch: str, tmp_path: Path) -> None:
    make = runner_factory(backend, arch, tmp_path)
    warm_runner, cold_runner = make(), make()
    # A small prefill budget so both the cold and the reused prompts are fed in several chunks.
    warm = manual(warm_runner, reuse=True, prefill_chunk=16)
    cold = manual(cold_runner, reuse=False, prefill_chunk=16)

    def both(prompt: list[int], n: int, cached: int) -> list[int]:
        w = warm.generate(Request(prompt, greedy(n)))
        c = cold.generate(Request(prompt, greedy(n)))
        assert w.token_ids == c.token_ids, f"{backend}/{arch}: reuse changed the answer"
        assert w.metrics is not None and w.metrics.cached_tokens == cached
        return list(w.token_ids)

    p1 = seq(40, 1)
    a1 = both(p1, 12, cached=0)
    p2 = p1 + a1 + seq(9, 2)  # next turn: the cache ends mid-conversation (after the answer)
    a2 = both(p2, 12, cached=len(p1) + 11)
    assert both(p2, 12, cached=len(p2) - 1) == a2  # wholly cached: only the last token is fed
    p3 = p2[:25] + seq(15, 3)  # diverges inside the cached part (an edited first message)
    a3 = both(p3, 12, cached=25)
    assert warm.metrics().prefix_hits == 3

    # Teacher-forced logits over the engine-built cache (prompt chunks + one-token decodes),
    # truncated inside the answer and inside the prompt, against a fresh slot's whole prefill.
    cache = p3 + a3[:-1]
    assert slot_cache(warm, 0) == cache and warm_runner.slot_length(0) == len(cache)
    follow = seq(30, 4)
    for keep in (len(p3) + 4, 20):
        warm_runner.truncate(0, keep)
        got = warm_runner.forward([SlotWork(0, tuple(follow), keep, "all")])[0]
        cold_runner.release(1)
        want = cold_runner.forward([SlotWork(1, tuple(cache[:keep] + follow), 0, "all")])[0]
        assert_logits_match(backend, got, want[keep:])
    for r in (warm_runner, cold_runner):
        r.close()


# -- the embedded SmolLM2 model -----------------------------------------------------------------


def test_llamacpp_reuse_is_exactly_a_cold_prefill_with_the_same_batch_shapes() -> None:
    # llama.cpp's results depend on how many tokens a forward carries (see assert_logits_match),
    # so the exact statement is: a truncated-and-extended slot gives bit for bit what a fresh slot
    # gives when fed the surviving tokens in the same forward sizes. Nothing of the removed
    # tokens (KV cells, positions, masks) leaks into what follows.
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    tok = model.tokenizer
    prompt = tok.encode(
        "The history of the city begins in the Roman era, when a small settlement grew along "
        "the river. Over the centuries, merchants, monks and soldiers shaped its streets.",
        add_special_tokens=True,
    )
    answer = tok.encode(" The old bridge was built in 1350 and rebuilt in 1720.")
    follow = tok.encode(" Tell me more about the markets and the monks.")
    chunks = [0, 16, 32, len(prompt)]  # prompt chunk boundaries, then one-token decodes
    config = RunnerConfig(slots=2, max_ctx=256, threads=1)

    def fill(runner: LlamaCppRunner, tokens: list[int]) -> None:
        for a, b in zip(chunks, chunks[1:], strict=False):
            if min(b, len(tokens)) > a:
                runner.forward([SlotWork(1, tuple(tokens[a:b]), a)])
        for i in range(len(prompt), len(tokens)):
            runner.forward([SlotWork(1, (tokens[i],), i)])

    warm = LlamaCppRunner(model, config)
    fill(warm, prompt + answer)
    for keep in (len(prompt) + 6, 25):  # inside the answer; inside the prompt's second chunk
        warm.truncate(1, keep)
        got = warm.forward([SlotWork(1, tuple(follow), keep, "all")])[0]
        fresh = LlamaCppRunner(model, config)
        fill(fresh, (prompt + answer)[:keep])
        want = fresh.forward([SlotWork(1, tuple(follow), keep, "all")])[0]
        fresh.close()
        np.testing.assert_array_equal(got, want)
        fill_rest = (prompt + answer)[keep:]
        warm.truncate(1, keep)  # put the answer back for the next cut
        for i, t in enumerate(fill_rest):
            warm.forward([SlotWork(1, (t,), keep + i)])
    warm.close()


CHAT = [
    "What is the capital of France?",
    "And what river flows through it?",
    "Name two famous bridges there.",
    "Which one is older?",
]


def chat_on_and_off(backend: str | None, max_tokens: int) -> list[dict[str, object]]:
    """A real multi-turn chat through two sessions, prefix reuse on (the default) and off."""
    from localinfer.engine.slots import shared_prefix
    from localinfer.session import open_session

    kw: dict[str, object] = dict(backend=backend, ctx=1024, slots=2, threads=1)
    turns: list[dict[str, object]] = []
    with open_session(**kw) as on, open_session(**kw, prefix_reuse=False) as off:  # type: ignore[arg-type]
        assert on.engine._scheduler.prefix_reuse and not off.engine._scheduler.prefix_reuse
        messages: list[dict[str, str]] = [{"role": "system", "content": "Answer briefly."}]
        cached: list[int] = []  # what the slot holds after a turn: prompt + answer minus its end
        for question in CHAT:
            messages.append({"role": "user", "content": question})
            ids = on.chat_prompt_ids(messages)
            params = SamplingParams(max_tokens=max_tokens, logprobs=2)
            warm = on.engine.generate(Request(ids, params))
            cold = off.engine.generate(Request(ids, params))
            expect = min(shared_prefix(cached, ids), len(ids) - 1)
            turns.append(dict(warm=warm, cold=cold, expect_cached=expect))
            cached = ids + list(warm.token_ids)[:-1]
            messages.append({"role": "assistant", "content": warm.text})
    return turns


def test_multi_turn_chat_on_the_default_backend_reuses_and_matches_cold() -> None:
    # Eight-token answers: each turn's cache still ends mid-conversation after an answer, and
    # every token more is one more decode on each of the two sessions.
    turns = chat_on_and_off(None, max_tokens=8)
    for i, turn in enumerate(turns):
        warm, cold = turn["warm"], turn["cold"]
        assert warm.metrics.cached_tokens == turn["expect_cached"]  # type: ignore[attr-defined]
        assert cold.metrics.cached_tokens == 0  # type: ignore[attr-defined]
        if i > 0:  # the next turn finds the whole earlier conversation in its slot
            assert warm.metrics.cached_tokens > 0.6 * warm.metrics.prompt_tokens  # type: ignore[attr-defined]
        # Same greedy tokens, up to the first near-tie. On llama.cpp a reused cache was computed
        # by one-token decodes where the cold prefill used one large batch, whose kernels round
        # differently (measured: chosen-token logprobs within 0.14; a turn can flip a token
        # whose top-2 margin is 0.31); torch and mlx give the same tokens throughout.
        for w, c in zip(warm.logprobs, cold.logprobs, strict=True):  # type: ignore[attr-defined]
            margin = c.top[0][2] - c.top[1][2]
            if w.token_id != c.token_id:
                assert margin < 1.0, f"turn {i}: a clear choice ({margin:.2f}) changed"
                break
            assert abs(w.logprob - c.logprob) < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_multi_turn_chat_gives_identical_tokens_on_torch_and_mlx(backend: str) -> None:
    pytest.importorskip("torch" if backend == "torch" else "mlx.core")
    for i, turn in enumerate(chat_on_and_off(backend, max_tokens=12)):
        warm, cold = turn["warm"], turn["cold"]
        assert warm.token_ids == cold.token_ids, f"turn {i}"  # type: ignore[attr-defined]
        assert warm.metrics.cached_tokens == turn["expect_cached"]  # type: ignore[attr-defined]
        assert i == 0 or warm.metrics.cached_tokens > 0  # type: ignore[attr-defined]
