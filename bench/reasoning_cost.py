"""The reasoning split's cost on decode: the same request with the engine splitting its output
as a thinking model's (all of it inside the reasoning block, the splitter's busiest case) and
without, alternating, on one session (scripts/bench-reasoning; issue #36's 0.98x target).

    scripts/bench-reasoning [--model M] [--tokens 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

# The engine is imported where it is used, after the arguments are parsed: `--help` does not
# import it.
if TYPE_CHECKING:
    from localinfer.engine.reasoning import ReasoningSpec

TARGET = 0.98


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-reasoning", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", default=None, help="default: the embedded model")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args(argv)


def decode_rate(session, ids: list[int], tokens: int, reasoning: ReasoningSpec | None) -> float:
    from localinfer.engine.types import Request, SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    result = session.engine.submit(Request(ids, params, reasoning=reasoning)).result()
    return float(result.metrics.decode_tps)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from localinfer.engine.reasoning import ReasoningSpec
    from localinfer.session import open_session

    session = open_session(args.model, slots=1)
    try:
        ids = session.chat_prompt_ids([{"role": "user", "content": "Tell me a long story."}])
        split = ReasoningSpec(starts_inside=True)  # every token goes through the splitter
        decode_rate(session, ids, 16, None)  # warm-up
        off, on = [], []
        for _ in range(args.repeats):
            off.append(decode_rate(session, ids, args.tokens, None))
            on.append(decode_rate(session, ids, args.tokens, split))
        notice = session.runner_notice.split(" (")[0]
    finally:
        session.close()
    ratio = statistics.median(on) / statistics.median(off)
    print(f"bench-reasoning: {notice}, {args.tokens} tokens, median of {args.repeats}")
    print(f"  split off  {statistics.median(off):7.1f} tok/s")
    print(f"  split on   {statistics.median(on):7.1f} tok/s  {ratio:.3f}x "
          f"(>= {TARGET}) {'ok' if ratio >= TARGET else 'MISSED'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
