"""Two models behind one `localinfer serve`: does switching between them cost anything?

One server holds two models that both fit (the model and a second one: by default a copy of the
same file under another name, so the two cost the same). Two streaming clients run in turns of
two modes, in the same server and run: both on the first model ("one model"), then each
alternating between the two ("two models"). With no reload between requests, a request's TTFT is
that of a model already loaded, and the ratio two/one shows only the two engines sharing the
CPU. The pool's load counter (``/metrics``) before and after the runs shows the reloads: none.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.records import RequestRecord
from localinfer.bench.stats import percentile
from localinfer.bench.targets import HttpTarget

TOPICS = ("rivers", "owls", "trains", "tea", "maps", "bees", "glass", "snow")
LOADS = re.compile(r"^localinfer_model_loads_total\{[^}]*\} (\d+)", re.MULTILINE)


def add_two_model_options(parser: argparse.ArgumentParser) -> None:
    """scripts/bench-server's flags for this row."""
    group = parser.add_argument_group("two-model row")
    which = group.add_mutually_exclusive_group()
    which.add_argument("--no-two-models", action="store_true", help="skip it")
    which.add_argument(
        "--two-models-only", action="store_true", help="only it (not with --autocomplete-only)"
    )
    group.add_argument(
        "--second-model", type=Path, help="the second GGUF (default: a copy of the model)"
    )


@dataclass(frozen=True, slots=True)
class TwoModelSettings:
    model: Path  # a GGUF file
    second: Path | None = None  # None: a copy of ``model`` under another name
    threads: int = 2
    slots: int = 2
    ctx: int = 512
    max_tokens: int = 32
    requests_per_client: int = 4
    runs: int = 3
    backend: str = "llamacpp"


@dataclass
class ModeFigures:
    ttft: list[float] = field(default_factory=list)  # seconds, every request of every run
    failures: int = 0

    def add(self, records: list[RequestRecord]) -> None:
        for record in records:
            if record.ok and record.ttft_s is not None:
                self.ttft.append(record.ttft_s)
            else:
                self.failures += 1


@dataclass
class TwoModelResult:
    models: tuple[str, str]
    one: ModeFigures  # both clients on the first model
    two: ModeFigures  # each client alternating between the two
    loads_before: int  # the pool's loads once both were up
    loads_after: int  # ... after every run: equal when nothing reloaded

    def as_dict(self) -> dict[str, object]:
        return {
            "models": list(self.models),
            "one_model_ttft_s": self.one.ttft,
            "two_models_ttft_s": self.two.ttft,
            "failures": self.one.failures + self.two.failures,
            "reloads": self.loads_after - self.loads_before,
        }


def run_two_models(settings: TwoModelSettings, log: Callable[[str], None]) -> TwoModelResult:
    """Start the server with both models, run the two modes interleaved, stop it."""
    with tempfile.TemporaryDirectory(prefix="bench-two-models-") as scratch:
        second = settings.second
        if second is None:
            second = Path(scratch) / f"second-{settings.model.name}"
            shutil.copyfile(settings.model, second)
        proc, url = _start(settings, second)
        try:
            ids = _model_ids(url)
            loads_before = _loads(url)
            result = TwoModelResult(ids, ModeFigures(), ModeFigures(), loads_before, 0)
            asyncio.run(_clients(url, ids, settings, alternate=True, requests=1))  # warm-up
            for run in range(settings.runs):
                for alternate, figures in ((False, result.one), (True, result.two)):
                    records = asyncio.run(
                        _clients(url, ids, settings, alternate, settings.requests_per_client)
                    )
                    figures.add(records)
                    mode = "two models" if alternate else "one model "
                    log(f"  run {run + 1}/{settings.runs} {mode}: {len(records)} requests")
            result.loads_after = _loads(url)
        finally:
            proc.terminate()
            proc.wait(60)
    return result


def _start(settings: TwoModelSettings, second: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "localinfer", "serve", str(settings.model), str(second),
           "--port", "0", "--slots", str(settings.slots), "--ctx", str(settings.ctx),
           "--threads", str(settings.threads), "--backend", settings.backend,
           "--models-from", "none", "--keep-alive", "-1", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    port = None
    for line in proc.stderr:
        found = re.search(r"port (\d+)", line)
        if found:
            port = int(found.group(1))
            break
    if port is None:
        raise RuntimeError(f"serve exited ({proc.wait()}) before saying its port")
    # Keep reading what it logs: a full stderr pipe would stop the server mid-benchmark.
    threading.Thread(target=proc.stderr.read, name="serve-stderr", daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode} while loading")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.terminate()
    raise RuntimeError("serve did not load both models in 600 s")


def _model_ids(url: str) -> tuple[str, str]:
    cards = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    loaded = [c["id"] for c in cards if c["state"] == "loaded"]
    if len(loaded) != 2:
        raise RuntimeError(f"expected two loaded models, /v1/models says {cards}")
    return loaded[0], loaded[1]


def _loads(url: str) -> int:
    return sum(int(n) for n in LOADS.findall(httpx.get(url + "/metrics", timeout=30).text))


async def _clients(
    url: str, ids: tuple[str, str], settings: TwoModelSettings, alternate: bool, requests: int
) -> list[RequestRecord]:
    """Two clients, ``requests`` each, one after another; client c's r-th request goes to model
    (c + r) mod 2 when alternating (so both models serve at every moment), else the first."""
    extra = {"ignore_eos": True}  # every answer runs to max_tokens: the same work each time
    targets = {i: HttpTarget(url, model=i, extra_body=extra, concurrency=2) for i in ids}
    records: list[RequestRecord] = []

    async def client(c: int) -> None:
        for r in range(requests):
            model = ids[(c + r) % 2] if alternate else ids[0]
            topic = TOPICS[(c * requests + r) % len(TOPICS)]
            text = f"Write a long story about {topic}, part {r}."
            prompt = BenchPrompt(f"c{c}r{r}", "short", ({"role": "user", "content": text},))
            records.append(await targets[model].run(prompt, settings.max_tokens))

    try:
        await asyncio.gather(client(0), client(1))
    finally:
        for target in targets.values():
            await target.aclose()
    return records


def run_row(settings: TwoModelSettings) -> dict[str, object]:
    """Run the row (progress on stderr), print it, return its figures."""
    result = run_two_models(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(report_lines(result, settings)))
    return result.as_dict()


def report_lines(result: TwoModelResult, settings: TwoModelSettings) -> list[str]:
    """The row, with the one-model run beside it and the ratio."""

    def ms(values: list[float], q: float) -> str:
        value = percentile(values, q)
        return f"{value * 1000:6.0f}" if value is not None else "   n/a"

    def ratio(q: float) -> str:
        one, two = percentile(result.one.ttft, q), percentile(result.two.ttft, q)
        return f"{two / one:5.2f}x" if one and two is not None else "  n/a"

    reloads = result.loads_after - result.loads_before
    failed = result.one.failures + result.two.failures
    return [
        "",
        f"two models, one server: {result.models[0]} and {result.models[1]}, "
        f"{settings.slots} slots x {settings.ctx} ctx each, {settings.threads} threads, "
        f"2 clients x {settings.requests_per_client} requests, {settings.max_tokens} tokens, "
        f"{settings.runs} runs interleaved",
        f"{'mode':>34} | TTFT p50 / p95 ms",
        f"{'one model (both clients on it)':>34} | {ms(result.one.ttft, 50)} / "
        f"{ms(result.one.ttft, 95)}",
        f"{'two models (clients alternate)':>34} | {ms(result.two.ttft, 50)} / "
        f"{ms(result.two.ttft, 95)} | ratio {ratio(50)} p50, {ratio(95)} p95",
        f"reloads during the runs: {reloads} (pool loads {result.loads_before} -> "
        f"{result.loads_after})" + (f"; {failed} requests failed" if failed else ""),
    ]
