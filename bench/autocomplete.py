"""The autocomplete rows of scripts/bench-server: TTFT of fill-in-the-middle requests while a user
types, with prefix reuse off, on, and on with cache reuse (``--cache-reuse N``: cached chunks found
later in the prompt are moved rather than prefilled, an approximation).

The workload: a source file of this repository cut at a line end to about 1,500 tokens. The user
types ``lines`` of its lines one at a time, from the middle of the file down, the code below them
already there; after each line the editor sends a FIM request to ``/v1/completions`` (``prompt``:
the file down to the cursor, ``suffix``: the rest, as Continue sends it) and waits for a short
greedy answer. The first request of a sequence fills the cache and is not counted.

Each FIM layout runs on the embedded SmolLM2-135M with renamed markers (``fim_model``): PSM
(StarCoder's) and SPM (Codestral's). Each runs behind three servers in this process (prefix reuse
off; on; on with cache reuse N, left out when N is 0), request by request in turn, so machine
noise falls on all. TTFT is measured at the client: from sending a request to its first
streamed chunk.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fim_model import RENAMES, write_fim_model
from localinfer.bench.stats import percentile
from localinfer.fim import FimFamily, find_fim_format
from localinfer.loading.tokenizer import Tokenizer

TARGET_WARM_RATIO = 0.3  # warm TTFT / cold TTFT (p50), issue #21
ANSWER_TOKENS = 8
MODES = ("cold", "warm", "chunks")  # prefix reuse off; on; on + cache reuse


@dataclass(frozen=True, slots=True)
class AutocompleteSettings:
    file: Path
    backend: str = "llamacpp"
    threads: int = 2
    max_tokens: int = 1500  # the file is cut to this many tokens
    lines: int = 16  # typed, one request each
    cursor: float = 0.5  # where typing starts, as a fraction of the file
    model: Path | None = None  # a GGUF with FIM tokens; None: the embedded model, renamed
    cache_reuse: int = 64  # N of the third server (reuse + --cache-reuse N); 0: no third server


@dataclass(frozen=True, slots=True)
class TypingWorkload:
    """The prompts of one typing session: a prefix per request, one suffix for all."""

    file: Path
    tokens: int  # of the file as cut
    first_line: int  # 1-based: the first line typed
    prefixes: list[str]  # the first: before any line is typed (it fills the cache)
    suffix: str
    suffix_tokens: int


def typing_workload(
    path: Path, tokenizer: Tokenizer, max_tokens: int = 1500, lines: int = 16, cursor: float = 0.5
) -> TypingWorkload:
    """``path`` cut to at most ``max_tokens`` tokens at a line end; ``lines`` of it typed, the
    first at ``cursor`` (0: the top, 0.5: the middle, 1: the end of the rest)."""
    kept: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if len(tokenizer.encode("".join([*kept, line]))) > max_tokens:
            break
        kept.append(line)
    if len(kept) < 4:
        raise ValueError(f"{path}: too few lines within {max_tokens} tokens")
    lines = max(1, min(lines, len(kept) // 2))
    start = round((len(kept) - lines) * min(max(cursor, 0.0), 1.0))
    end = start + lines
    prefixes = ["".join(kept[:i]) for i in range(start, end + 1)]
    tokens = len(tokenizer.encode("".join(kept)))
    suffix = "".join(kept[end:])
    return TypingWorkload(path, tokens, start + 1, prefixes, suffix, len(tokenizer.encode(suffix)))


@dataclass(frozen=True, slots=True)
class Sample:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class LayoutFigures:
    """One FIM layout: the counted requests with prefix reuse off (cold), on (warm) and on with
    cache reuse (chunks)."""

    layout: str  # e.g. "PSM <fim_prefix> (starcoder)"
    warm: list[Sample] = field(default_factory=list)
    cold: list[Sample] = field(default_factory=list)
    chunks: list[Sample] = field(default_factory=list)

    def samples(self, which: str) -> list[Sample]:
        return {"warm": self.warm, "cold": self.cold, "chunks": self.chunks}[which]

    def ttft(self, which: str, q: float) -> float:
        return percentile([s.ttft_s for s in self.samples(which)], q) or float("nan")

    def ratio(self, q: float = 50, which: str = "warm") -> float:
        """``which``'s TTFT over the cold one's, at percentile ``q``."""
        cold = self.ttft("cold", q)
        return self.ttft(which, q) / cold if cold else float("nan")

    def as_dict(self) -> dict[str, Any]:
        def side(samples: list[Sample]) -> dict[str, Any]:
            n = max(len(samples), 1)
            return {
                "ttft_p50_s": percentile([s.ttft_s for s in samples], 50),
                "ttft_p95_s": percentile([s.ttft_s for s in samples], 95),
                "ttft_s": [s.ttft_s for s in samples],
                "mean_prompt_tokens": sum(s.prompt_tokens for s in samples) / n,
                "mean_cached_tokens": sum(s.cached_tokens for s in samples) / n,
            }

        out = {
            "layout": self.layout,
            "reuse_on": side(self.warm),
            "reuse_off": side(self.cold),
            "warm_over_cold_p50": self.ratio(50),
            "warm_over_cold_p95": self.ratio(95),
        }
        if self.chunks:
            out["reuse_on_cache_reuse"] = side(self.chunks)
            out["cache_reuse_over_cold_p50"] = self.ratio(50, "chunks")
            out["cache_reuse_over_cold_p95"] = self.ratio(95, "chunks")
        return out


def fim_request(
    http: httpx.Client, url: str, prefix: str, suffix: str, answer_tokens: int
) -> Sample:
    """One streamed FIM request; its client-side TTFT and the server's token counts."""
    body = {
        "model": "bench",
        "prompt": prefix,
        "suffix": suffix,
        "max_tokens": answer_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, usage = None, None
    with http.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"FIM request failed: {r.status_code} {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            usage = json.loads(line[len("data: ") :]).get("usage") or usage
    if ttft is None or usage is None:
        raise RuntimeError("FIM request answered no chunk or no usage")
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return Sample(ttft, usage["prompt_tokens"], cached)


@contextmanager
def fim_servers(
    model: Path, backend: str, threads: int, ctx: int, cache_reuse: int
) -> Iterator[dict[str, str]]:
    """Servers on ``model`` by mode (MODES): prefix reuse off, on, and on with cache reuse
    ``cache_reuse`` (none when it is 0); their URLs."""
    from localinfer.server import ServerThread, create_app
    from localinfer.session import open_session

    options = {"cold": (False, 0), "warm": (True, 0), "chunks": (True, cache_reuse)}
    with ExitStack() as stack:
        urls = {}
        for mode in MODES:
            reuse, chunk = options[mode]
            if mode == "chunks" and not chunk:
                continue
            session = open_session(
                str(model), backend=backend, slots=2, ctx=ctx, threads=threads,
                prefix_reuse=reuse, cache_reuse=chunk,
            )  # fmt: skip
            stack.callback(session.close)
            app = create_app(session, served_name="bench")  # type: ignore[arg-type]
            urls[mode] = stack.enter_context(ServerThread(app)).url
        yield urls


def measure_layout(
    family: FimFamily, workload: TypingWorkload, model: Path, settings: AutocompleteSettings
) -> LayoutFigures:
    first = family.prefix[0] if family.order == "psm" else family.suffix[0]
    figures = LayoutFigures(f"{family.order.upper()} {first} ({family.name})")
    ctx = workload.tokens + 256  # the file, the markers and the answer
    servers = fim_servers(model, settings.backend, settings.threads, ctx, settings.cache_reuse)
    with servers as urls, httpx.Client(timeout=600) as http:
        for url in urls.values():  # first-request costs are not serving speed
            fim_request(http, url, "x = 1\n", "\n", 2)
        for i, prefix in enumerate(workload.prefixes):
            for mode, url in urls.items():
                sample = fim_request(http, url, prefix, workload.suffix, ANSWER_TOKENS)
                if i:  # the first request of the sequence fills the cache
                    figures.samples(mode).append(sample)
    return figures


def run_autocomplete(
    settings: AutocompleteSettings, log: Any = None
) -> tuple[TypingWorkload, list[LayoutFigures]]:
    """The typing workload through each layout: the embedded model with StarCoder's and with
    Codestral's markers, or ``settings.model`` in its own."""
    from localinfer.loading.loader import load_model

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fim-") as tmp:
        if settings.model is not None:
            models = [settings.model]
        else:
            models = [write_fim_model(Path(tmp), family) for family in RENAMES]
        workload = None
        for model in models:
            tokenizer = load_model(model).tokenizer
            fmt = find_fim_format(tokenizer)
            if fmt is None:
                raise ValueError(f"{model}: its vocabulary has no FIM tokens")
            if workload is None:
                workload = typing_workload(
                    settings.file, tokenizer, settings.max_tokens, settings.lines, settings.cursor
                )
            figures = measure_layout(fmt.family, workload, model, settings)
            if log is not None:
                extra = ""
                if figures.chunks:
                    extra = f", cache-reuse/cold {figures.ratio(which='chunks'):.2f}x"
                log(f"  autocomplete {figures.layout}: warm/cold p50 {figures.ratio():.2f}x{extra}")
            results.append(figures)
    assert workload is not None
    return workload, results


def report_lines(
    workload: TypingWorkload, rows: list[LayoutFigures], settings: AutocompleteSettings
) -> list[str]:
    n_typed = len(workload.prefixes) - 1
    model = settings.model.name if settings.model else "embedded SmolLM2-135M, FIM markers renamed"
    last = workload.first_line + n_typed - 1
    chunks = f"reuse + cache-reuse {settings.cache_reuse}"
    out = [
        f"\nautocomplete: FIM requests while typing lines {workload.first_line}-{last} of "
        f"{workload.file.name} (cut to {workload.tokens} tokens; {workload.suffix_tokens} below "
        f"the cursor), one per line, {ANSWER_TOKENS}-token greedy answers; TTFT p50 / p95 ms at "
        f"the client over {n_typed} requests, mean cached / prompt tokens, and p50 over reuse "
        f"off (target <= {TARGET_WARM_RATIO}x); {model}, {settings.backend}, "
        f"{settings.threads} threads",
        f"{'layout':>30} | {'reuse off':>15} | {'reuse on':>36} | {chunks:>36}",
    ]
    for row in rows:
        cells = [_cell(row, "cold")[:15], _cell(row, "warm")]
        cells.append(_cell(row, "chunks") if row.chunks else f"{'-':>36}")
        out.append(f"{row.layout:>30} | " + " | ".join(cells))
    return out


def _cell(row: LayoutFigures, which: str) -> str:
    """``p50 / p95 ms``, cached / prompt, and the ratio over cold: 36 characters."""
    samples = row.samples(which)
    p50, p95 = (row.ttft(which, q) * 1000 for q in (50, 95))
    n = max(len(samples), 1)
    cached = sum(s.cached_tokens for s in samples) / n
    prompt = sum(s.prompt_tokens for s in samples) / n
    ratio = row.ratio(which=which)
    mark = "ok" if ratio <= TARGET_WARM_RATIO else "no"
    return f"{p50:>6.0f} / {p95:>6.0f} {cached:>5.0f}/{prompt:<5.0f} {ratio:4.2f}x {mark}"
