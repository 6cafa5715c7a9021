"""What an embedding job costs decoding streams (scripts/bench-embeddings).

Per backend, one session on the embedded model, each repeat running in turn:

1. embedding throughput alone: a job of ``texts`` ordinary sentences, nothing else running;
2. a greedy stream beside the same job: the job is queued once the stream's first token is out,
   and the stream is cut at the first token after the job is done. Decode tokens/s over that
   window, and the job's tokens/s over it;
3. the same stream alone, for as many tokens: decode tokens/s over the same token positions (so
   attention over a longer cache weighs on both alike), and its tokens must equal the stream's
   beside the job (greedy parity).

The ratio of 2 to 3 is the figure the engine's pacing is for (target >= 0.5x, TARGET). Medians
over repeats. When the stream reaches its context before the job is done, the job's rate is
partly alone: the row says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

# The engine is imported where it is used, after the arguments are parsed: `--help` does not
# import it.
if TYPE_CHECKING:
    from localinfer.engine import Engine, Request

TARGET = 0.5  # decode beside a job, as a share of decode alone
PROMPT = "Tell me about the sea."
PLACES = ("town", "the harbour", "the hills", "the old market", "the station", "the valley")
THINGS = ("weather", "traffic", "price of bread", "noise at night", "light in winter")


@dataclass(slots=True, frozen=True)
class BesideRun:
    decode_tps: float  # the stream's tokens/s while the job ran
    job_tps: float  # the job's tokens/s from its submission to its end
    tokens: tuple[int, ...]  # the stream's tokens, cut at the first one after the job was done
    stream_outlived: bool  # False: the stream ended first, so part of the job ran alone


@dataclass(slots=True, frozen=True)
class BackendFigures:
    backend: str
    threads: int | None  # None: the backend's default
    job_texts: int
    job_tokens: int
    embed_alone_tps: float
    decode_alone_tps: float
    decode_beside_tps: float
    job_beside_tps: float
    stream_outlived: bool
    same_tokens: bool  # the stream's greedy tokens beside the job = alone

    @property
    def ratio(self) -> float:
        return self.decode_beside_tps / self.decode_alone_tps


def job_texts(n: int) -> list[str]:
    """``n`` plain sentences of varied length (12 to 40 tokens on SmolLM2's tokenizer)."""
    out = []
    for i in range(n):
        place, thing = PLACES[i % len(PLACES)], THINGS[i % len(THINGS)]
        text = f"Note {i}: the {thing} in {place} was fairly ordinary today."
        out.append(text + " It was much the same as the day before." * (i % 3))
    return out


def embed_alone(engine: Engine, inputs: Sequence[Sequence[int]]) -> float:
    """Tokens/s of one job with nothing else running."""
    from localinfer.engine import EmbeddingRequest

    started = time.perf_counter()
    engine.embed(EmbeddingRequest([list(x) for x in inputs])).result()
    return sum(map(len, inputs)) / (time.perf_counter() - started)


def stream_beside_job(
    engine: Engine, request: Request, inputs: Sequence[Sequence[int]]
) -> BesideRun:
    from localinfer.engine import EmbeddingRequest

    handle = engine.submit(request)
    events = iter(handle)
    tokens = list(next(events).token_ids)  # the stream is decoding from here on
    started = time.perf_counter()
    job = engine.embed(EmbeddingRequest([list(x) for x in inputs]))
    outlived = False
    for event in events:
        tokens.extend(event.token_ids)
        if job.done:
            outlived = True
            break
    stream_end = time.perf_counter()
    handle.abort()
    handle.result()
    job.result()
    job_end = stream_end if outlived else time.perf_counter()
    return BesideRun(
        decode_tps=(len(tokens) - 1) / (stream_end - started),
        job_tps=sum(map(len, inputs)) / (job_end - started),
        tokens=tuple(tokens),
        stream_outlived=outlived,
    )


def stream_alone(engine: Engine, request: Request) -> tuple[float, tuple[int, ...]]:
    """Decode tokens/s from the first token to the last, and the tokens."""
    tokens: list[int] = []
    started = 0.0
    for event in engine.submit(request):
        if not tokens:
            started = time.perf_counter()
        tokens.extend(event.token_ids)
    return (len(tokens) - 1) / (time.perf_counter() - started), tuple(tokens)


def measure_backend(
    backend: str, texts: int, repeats: int, threads: int | None, ctx: int
) -> BackendFigures:
    from localinfer.engine import EmbeddingRequest, Request, SamplingParams
    from localinfer.session import open_session

    with open_session(None, backend=backend, slots=2, ctx=ctx, threads=threads) as session:
        engine = session.engine
        prompt = session.chat_prompt_ids([{"role": "user", "content": PROMPT}])
        long_stream = Request(
            prompt, SamplingParams(max_tokens=ctx - len(prompt) - 1, ignore_eos=True)
        )
        inputs = [session.raw_prompt_ids(t) for t in job_texts(texts)]
        # Warm-up: first-use costs (llama.cpp's embedding context, kernel builds) stay out.
        engine.embed(EmbeddingRequest(inputs[:2])).result()
        engine.generate(Request(prompt, SamplingParams(max_tokens=8, ignore_eos=True)))
        alone_e, alone_d, beside_d, beside_j = [], [], [], []
        outlived, same = True, True
        for _ in range(repeats):
            alone_e.append(embed_alone(engine, inputs))
            beside = stream_beside_job(engine, long_stream, inputs)
            params = SamplingParams(max_tokens=len(beside.tokens), ignore_eos=True)
            tps, tokens = stream_alone(engine, Request(prompt, params))
            alone_d.append(tps)
            beside_d.append(beside.decode_tps)
            beside_j.append(beside.job_tps)
            outlived &= beside.stream_outlived
            same &= tokens == beside.tokens
    return BackendFigures(
        backend, threads, texts, sum(map(len, inputs)), statistics.median(alone_e),
        statistics.median(alone_d), statistics.median(beside_d), statistics.median(beside_j),
        outlived, same,
    )  # fmt: skip


def report_lines(figures: Sequence[BackendFigures]) -> list[str]:
    lines = [
        "   backend    embed alone   decode alone   decode beside   ratio   target    "
        "job beside   tokens",
        "              tok/s         tok/s          tok/s                             tok/s",
    ]
    for f in figures:
        ok = "ok" if f.ratio >= TARGET else "MISSED"
        job = f"{f.job_beside_tps:10.1f}" + ("" if f.stream_outlived else " (partly alone)")
        lines.append(
            f"   {f.backend:<10} {f.embed_alone_tps:11.1f}   {f.decode_alone_tps:12.1f}   "
            f"{f.decode_beside_tps:13.1f}   {f.ratio:5.2f}x  >= {TARGET}x {ok:<6} {job}   "
            f"{'same' if f.same_tokens else 'DIFFER'}"
        )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-embeddings",
        description="An embedding job beside a decoding stream: what it costs the stream.",
    )
    p.add_argument("--backends", default="torch,llamacpp", help="comma-separated backends")
    p.add_argument("--texts", type=int, help="texts in the job (default 32; 8 with --quick)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median taken)")
    p.add_argument("--threads", type=int, default=None, help="runner threads (default: cores)")
    p.add_argument("--ctx", type=int, default=2048, help="context per slot (bounds the stream)")
    p.add_argument("--quick", action="store_true", help="8 texts, 1 repeat (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    args.texts = args.texts or (8 if args.quick else 32)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    threads = f"{args.threads} thread(s)" if args.threads else "default threads"
    print(f"# embeddings beside decode on the embedded SmolLM2-135M: {threads}; a job of")
    print(f"# {args.texts} texts; a greedy stream ({PROMPT!r}); median of {args.repeats} repeat(s)")
    figures = []
    for backend in backends:
        figures.append(measure_backend(backend, args.texts, args.repeats, args.threads, args.ctx))
        print(f"   {backend}: done", flush=True)
    print("\n".join(["", *report_lines(figures)]))
    for f in figures:
        print(json.dumps({"bench": "embeddings", **asdict(f), "ratio": f.ratio}))


if __name__ == "__main__":
    main()
