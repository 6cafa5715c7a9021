"""The bench-engine building blocks on the numpy model: both paths generate the same tokens and
the timer sees every forward."""

from __future__ import annotations

from bench.engine_vs_direct import TimedRunner, run_direct, run_engine
from localinfer.engine import Engine
from tests.test_engine_model import ByteTokenizer, HashRunner


def test_bench_engine_and_direct_paths_run_the_same_work() -> None:
    runner = HashRunner(slots=4, discourage=())
    timed = TimedRunner(runner)
    engine = Engine(timed, ByteTokenizer(eos_ids=()), prefill_chunk=512)
    try:
        prompt = [5, 6, 7, 8]
        direct = run_direct(runner, prompt, 4, 10)
        assert direct.tok_s > 0 and direct.step_s > 0
        assert [runner.slot_length(s) for s in range(4)] == [0] * 4  # released afterwards
        run = run_engine(engine, timed, prompt, 4, 10)
        # One forward for the 4 prefills + first tokens, then 9 decode forwards of 4 slots.
        assert timed.forwards == 10
        assert 0 < run.forward_share <= 1 and run.tok_s > 0
        assert engine.metrics().completion_tokens_total == 40
        assert 0 < run.ttft_p50 <= run.ttft_p95
    finally:
        engine.close()
