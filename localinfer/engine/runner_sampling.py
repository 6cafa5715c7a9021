"""Which requests draw their tokens inside the runner (backends/base.py ``RunnerSampling``).

A request needs the host's sampler, and so its vocabulary-sized logits row, when it has a
constraint, log-probabilities, penalties, a thinking budget (whose closing tag is forced at an
exact token) or speculative proposals to verify. Every other greedy request gives the runner its
sampling parameters, and the runner returns one token id a step: the same tokens as the host's.
A seeded request goes to the runner only where the runner's draws cost less than the host's
(``seeded_in_runner``); it then draws from the same distribution with the runner's generator,
not token for token the host's.
"""

from __future__ import annotations

import itertools

from localinfer.backends.base import RunnerSampling, SamplesInRunner
from localinfer.engine.sampler import SampledToken
from localinfer.engine.sequence import Sequence

# Below this the host's scaled logits can overflow float32 and it takes the limit, the argmax;
# a runner would divide by the temperature and get NaN, so such requests stay on the host.
MIN_RUNNER_TEMPERATURE = 1e-3


class RunnerSamplingPolicy:
    """Gives each admitted request its RunnerSampling, or None for the host sampler."""

    def __init__(self, runner: object, *, enabled: bool = True, speculating: bool = False) -> None:
        able = isinstance(runner, SamplesInRunner) and runner.samples_in_runner
        self.enabled = enabled and able
        self.seeded = self.enabled and runner.seeded_in_runner  # type: ignore[attr-defined]
        self.speculating = speculating  # the engine has a speculator: seeded requests stay home
        self._streams = itertools.count(1)

    def for_sequence(self, seq: Sequence) -> RunnerSampling | None:
        """``seq``'s sampling in the runner, decided once, when its first token is due."""
        if not seq.sampling_decided:
            seq.runner_sampling = self._spec(seq)
            seq.sampling_decided = True
        return seq.runner_sampling

    def _spec(self, seq: Sequence) -> RunnerSampling | None:
        if not self.enabled:
            return None
        params, sampler = seq.params, seq.sampler
        if sampler.constraint is not None or sampler.forcing or sampler.penalises:
            return None
        if params.logprobs is not None or seq.thinking_budget is not None:
            return None
        if not params.greedy and (
            not self.seeded or self.speculating or params.temperature < MIN_RUNNER_TEMPERATURE
        ):
            # A proposal's tokens are verified with the host's generator; a seeded request
            # keeps one generator from its first token to its last.
            return None
        seed = params.seed if params.seed is not None else int(sampler.rng.integers(2**32))
        return RunnerSampling(
            stream=next(self._streams),
            seed=seed % 2**32,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
        )


def drawn_token(seq: Sequence, sample: RunnerSampling | None, out: object) -> SampledToken:
    """The request's next token from a forward's output for it: the runner's draw when it sampled
    (an int64 ``[1]``), else the host sampler's on the logits' last row."""
    if sample is not None:
        return seq.sampler.accept(int(out[0]))  # type: ignore[index]
    return seq.sampler.sample(out[-1])  # type: ignore[index]
