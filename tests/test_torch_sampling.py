"""Tokens drawn inside the torch runner (backends/torch/sampling.py) against the engine's host
sampler: the same distribution as its definition (exactly, probability by probability, and by
many seeded draws), the same greedy tokens, and, through the engine on the embedded model, the
same answers with the runner sampling and without it.

The ``gpu`` cases run the same checks on CUDA, where drawing on the device is what saves the
logits copy (scripts/gpu-check)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.runner_sampling import RunnerSampling, SamplesInRunner  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from localinfer.backends.torch.sampling import DeviceSamplers, sorted_probs  # noqa: E402
from localinfer.engine import Engine  # noqa: E402
from localinfer.engine.sampler import exact_sampling_probs, sampling_probs  # noqa: E402
from localinfer.engine.types import Request, SamplingParams  # noqa: E402
from tests.sampling_checks import assert_draws_follow  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]

DRAWS = 6000
# On the tiny model's logits divided by 6 (its top token stands far above the rest), these put
# the mass on 12 to 256 tokens, so every cut has tokens to cut.
MIXES = [
    dict(temperature=1.0),
    dict(temperature=2.0, top_k=12),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=2.0, min_p=0.1),
    dict(temperature=2.5, top_k=40, min_p=0.05, top_p=0.9),
]
EXACT_MIXES = MIXES + [
    dict(temperature=4.0, top_p=0.8),
    dict(temperature=3.5, min_p=0.2),
    dict(temperature=0.7),
    dict(temperature=0.8, top_k=1),
    dict(temperature=1.0, top_k=3),  # ties with the 3rd largest stay in
    dict(temperature=0.5, top_p=0.3),
    dict(temperature=1.0, top_p=0.999, min_p=0.3),
    dict(temperature=1e-3),  # all but a point mass
]


def _mix_id(mix: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in mix.items())


def _runner(device: str, slots: int = 2) -> TorchRunner:
    config = RunnerConfig(slots=slots, max_ctx=64, dtype="float32", device=device)
    return TorchRunner(tiny_model("qwen3", seed=3), config)


def _rows(device: str) -> torch.Tensor:
    """Logit rows to sample from: the tiny model's at a position (its top token far above the
    rest), the same divided by 6 (spread over tens of tokens) and that rounded to tenths (many
    exact ties), a flat row and a spiked one."""
    (logits,) = _runner(device).forward([SlotWork(0, tuple(random_tokens(9, seed=5)), 0)])
    row = logits[-1]
    rng = np.random.default_rng(0)
    spiked = rng.normal(size=row.shape[0]).astype(np.float32)
    spiked[17] = 30.0
    rows = np.stack([row / 6, row, np.round(row / 6, 1), np.zeros_like(row), spiked])
    return torch.from_numpy(rows).to(device)


def _dense(probs: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    out = torch.zeros_like(probs).scatter_(1, ids, probs)
    return out.cpu().numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mix", EXACT_MIXES, ids=_mix_id)
def test_the_distribution_is_the_host_definition(mix: dict, device: str) -> None:
    """Every row's probabilities equal engine/sampling_exact.py's, token by token: the same
    tokens kept (ties and all), the same mass on each."""
    rows = _rows(device)
    spec = RunnerSampling(stream=1, seed=0, **mix)
    probs, ids = sorted_probs(rows, [spec] * rows.shape[0])
    got = _dense(probs, ids)
    for r, x in enumerate(rows.cpu().numpy()):
        want = exact_sampling_probs(SamplingParams(**mix), x)
        assert np.array_equal(got[r] > 0, want > 0), (r, (got[r] > 0).sum(), (want > 0).sum())
        np.testing.assert_allclose(got[r], want, rtol=1e-9, atol=1e-12)


def _draws(samplers: DeviceSamplers, row: torch.Tensor, spec: RunnerSampling, n: int) -> np.ndarray:
    """``n`` draws of slot 0's generator in one call: ``n`` copies of the row, all for slot 0, take
    their uniforms from that one generator in row order, so they are the ``n`` one-row calls'
    draws (checked on a prefix in the test) at a twentieth of the cost of 6,000 calls."""
    rows = row[None].expand(n, -1).contiguous()
    return samplers.draw(rows, [0] * n, [spec] * n).cpu().numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mix", MIXES, ids=_mix_id)
def test_seeded_draws_follow_the_host_distribution(mix: dict, device: str) -> None:
    """6,000 draws of one generator against the host's distribution: fixed seeds, so the
    outcome is the same on every run; the bound is far above what a right sampler scores."""
    row = _rows(device)[0]
    probs = sampling_probs(SamplingParams(**mix), row.cpu().numpy())
    spec = RunnerSampling(stream=1, seed=1234, **mix)
    draws = _draws(DeviceSamplers(row.device), row, spec, DRAWS)
    one_by_one = DeviceSamplers(row.device)  # the runner's way: one row of the slot a call
    prefix = [int(one_by_one.draw(row[None], [0], [spec])[0]) for _ in range(50)]
    assert prefix == draws[:50].tolist()
    counts = np.bincount(draws, minlength=256)
    assert_draws_follow(counts, probs, DRAWS)


def _forward_draws(runner: TorchRunner, spec: RunnerSampling, n: int) -> list[int]:
    """``n`` tokens for the same position through forward: feed the last token with ``spec``,
    then truncate it away, so every draw reads the same logits and only the generator moves."""
    context = random_tokens(9, seed=6)
    runner.release(0)
    runner.forward([SlotWork(0, tuple(context[:-1]), 0)])
    out = []
    for _ in range(n):
        (got,) = runner.forward([SlotWork(0, tuple(context[-1:]), 8, sample=spec)])
        assert got.shape == (1,) and got.dtype == np.int64
        out.append(int(got[0]))
        runner.truncate(0, 8)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_a_seed_repeats_and_a_new_stream_restarts_the_generator(device: str) -> None:
    runner = _runner(device)
    first = _forward_draws(runner, RunnerSampling(stream=1, seed=7, temperature=4.0), 40)
    again = _forward_draws(runner, RunnerSampling(stream=2, seed=7, temperature=4.0), 40)
    other = _forward_draws(runner, RunnerSampling(stream=3, seed=8, temperature=4.0), 40)
    assert first == again
    assert first != other
    assert len(set(first)) > 1  # a drawn distribution, not a point mass


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_in_the_runner_is_the_argmax_in_a_mixed_batch(device: str) -> None:
    """Slots 0 and 2 draw in the runner (greedy, seeded), slot 1 returns logits, in one forward:
    the greedy token is the argmax of the logits the same position gives without sampling."""
    runner = _runner(device, slots=3)
    a, b, c = (tuple(random_tokens(n, seed=s)) for n, s in ((7, 8), (5, 9), (6, 10)))
    (alone,) = runner.forward([SlotWork(0, a, 0)])
    runner.release(0)
    greedy = RunnerSampling(stream=4, seed=0)
    seeded = RunnerSampling(stream=5, seed=1, temperature=1.0)
    out = runner.forward(
        [SlotWork(1, b, 0), SlotWork(0, a, 0, sample=greedy), SlotWork(2, c, 0, sample=seeded)]
    )
    assert out[0].shape == (1, 256) and out[0].dtype == np.float32
    assert out[1].tolist() == [int(np.argmax(alone[-1]))]
    assert out[2].shape == (1,) and 0 <= out[2][0] < 256


def test_the_runner_says_what_it_samples() -> None:
    """Greedy on every device; seeded draws only on CUDA, where they save the logits copy: on a
    CPU the host's sampler is the faster (sampling.py sorts the row, the host does not)."""
    runner = _runner("cpu")
    assert isinstance(runner, SamplesInRunner)
    assert runner.samples_in_runner and not runner.seeded_in_runner


# -- through the engine, on the embedded model (SmolLM2-135M Q4_1) ------------------------------


@pytest.fixture(scope="module")
def embedded():
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    try:
        path = embedded_model_path()
    except Exception as exc:  # noqa: BLE001 - the package is optional for this module
        pytest.skip(f"embedded model unavailable: {exc}")
    return load_model(path)


def _answers(
    model, device: str, in_runner: bool, params: SamplingParams, seeded: bool | None = None
) -> tuple[list[list[int]], int]:
    """Three prompts' tokens through an Engine on a fresh runner, and how many items the runner
    was asked to sample."""
    runner = TorchRunner(model, RunnerConfig(slots=2, max_ctx=128, device=device))
    if seeded is not None:
        runner.seeded_in_runner = seeded
    sampled, forward = 0, runner.forward

    def counting(batch):  # noqa: ANN001, ANN202
        nonlocal sampled
        sampled += sum(w.sample is not None for w in batch)
        return forward(batch)

    runner.forward = counting  # type: ignore[method-assign]
    tok = model.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    try:
        with Engine(runner, tok, sample_in_runner=in_runner, prefill_chunk=16) as engine:
            handles = [engine.submit(Request(tok.encode(t), params=params)) for t in texts]
            return [list(h.result().token_ids) for h in handles], sampled
    finally:
        runner.close()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_answers_are_the_same_drawn_in_the_runner_or_on_the_host(
    embedded, device: str
) -> None:
    # Six tokens a prompt: each a decode step of the 135M model, and the same greedy choice
    # drawn in the runner or on the host is what is compared, whatever the length.
    params = SamplingParams(max_tokens=6, temperature=0.0)
    host, none = _answers(embedded, device, False, params)
    runner, sampled = _answers(embedded, device, True, params)
    assert none == 0 and sampled >= 3 * 6 - 3  # every token but none drawn on the host
    assert runner == host


def test_seeded_requests_stay_on_the_host_of_a_cpu_runner_unless_it_says_otherwise(
    embedded,
) -> None:
    # Four tokens a prompt: where each is drawn, and that a seed repeats, need no more.
    params = SamplingParams(max_tokens=4, temperature=0.9, top_p=0.95, seed=42)
    _, sampled = _answers(embedded, "cpu", True, params)
    assert sampled == 0
    first, sampled = _answers(embedded, "cpu", True, params, seeded=True)
    again, _ = _answers(embedded, "cpu", True, params, seeded=True)
    assert sampled > 0 and first == again
