"""scripts/bench-chat's reference and verdict: `localinfer generate` on the same request, and the
issue's targets checked against one chat run (bench/chat.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from bench.chat import ChatBenchConfig, ChatRun, EngineRun, window_rate

# The chat issue's targets on a 2-core machine.
MIN_CHAT_VS_GENERATE = 0.9
MIN_LAST_VS_FIRST = 0.9
MAX_UI_CPU_PER_100 = 0.2  # CPU-seconds of the UI thread per 100 tokens
FRAME_S = 1 / 60  # Textual's default frame (TEXTUAL_FPS)


@dataclass(slots=True, frozen=True)
class GenerateRun:
    """`localinfer generate --json` on the chat's request, in its own process."""

    text: str
    decode_tps: float | None
    completion_tokens: int
    backend: str


def generate_command(config: ChatBenchConfig) -> list[str]:
    argv = [sys.executable, "-m", "localinfer", "generate", "--json"]
    argv += ["--max-tokens", str(config.max_tokens), "--temperature", "0", "--top-p", "1"]
    argv += ["--ctx", str(config.ctx)]
    if config.backend:
        argv += ["--backend", config.backend]
    if config.threads:
        argv += ["--threads", str(config.threads)]
    model = [config.model] if config.model else []  # None: generate's own default, the embedded
    return [*argv, *model, config.prompt]


def run_generate(config: ChatBenchConfig) -> GenerateRun:
    """The same request (prompt through the chat template, greedy, the same budget) through
    `localinfer generate`; its tok/s is the engine's timing, as the chat's is."""
    proc = subprocess.run(generate_command(config), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"localinfer generate failed: {proc.stderr.strip()[-2000:]}")
    data = json.loads(proc.stdout)
    return GenerateRun(
        text=data["text"],
        decode_tps=data["metrics"].get("decode_tps"),
        completion_tokens=data["usage"]["completion_tokens"],
        backend=data["backend"],
    )


@dataclass(slots=True, frozen=True)
class Verdict:
    name: str
    figure: str
    ok: bool | None  # None: not measurable in this run


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _slowdown(arrivals: list[float], window: int) -> float | None:
    """The rate over the last ``window`` tokens over the rate over the first ``window``."""
    return _ratio(window_rate(arrivals, False, window), window_rate(arrivals, True, window))


def verdicts(
    config: ChatBenchConfig, chat: ChatRun, generate: GenerateRun, alone: EngineRun
) -> list[Verdict]:
    """The four targets, each with the figure it is judged on. The slowdown over the answer is
    judged against the engine's own on the same request (``alone``): a model decodes slower as
    its context grows, UI or not; what the chat may not add is a slowdown of its own."""
    out = []
    ratio = _ratio(chat.decode_tps, generate.decode_tps)
    out.append(
        Verdict(
            "chat / generate decode",
            f"{_fmt(ratio, 'x')} ({_fmt(chat.decode_tps)} vs {_fmt(generate.decode_tps)} tok/s)",
            None if ratio is None else ratio >= MIN_CHAT_VS_GENERATE,
        )
    )
    growth = _slowdown(chat.arrivals, config.window)
    own = _slowdown(alone.arrivals, config.window)
    kept = _ratio(growth, own)
    out.append(
        Verdict(
            f"last {config.window} / first {config.window}",
            f"{_fmt(growth, 'x')}; engine alone {_fmt(own, 'x')}: {_fmt(kept, 'x')} of it",
            None if kept is None else kept >= MIN_LAST_VS_FIRST,
        )
    )
    per_100 = chat.ui_cpu_s / chat.completion_tokens * 100 if chat.completion_tokens else None
    out.append(
        Verdict(
            "UI thread CPU per 100 tokens",
            f"{_fmt(per_100, ' s', 3)} ({chat.ui_cpu_s:.2f} s for {chat.completion_tokens})",
            None if per_100 is None else per_100 <= MAX_UI_CPU_PER_100,
        )
    )
    keys = chat.key_latencies_s
    slowest = max(keys) if keys else None
    out.append(
        Verdict(
            "keys while streaming",
            f"{len(keys)} typed, slowest {_fmt(slowest and slowest * 1000, ' ms', 1)} "
            f"(a frame: {FRAME_S * 1000:.1f} ms)",
            None if slowest is None else slowest <= FRAME_S,
        )
    )
    return out


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.{digits}f}{unit}"


def report_lines(
    config: ChatBenchConfig, chat: ChatRun, generate: GenerateRun, alone: EngineRun, header: str
) -> list[str]:
    lines = [header]
    for v in verdicts(config, chat, generate, alone):
        mark = {True: "ok", False: "MISSED", None: "n/a"}[v.ok]
        lines.append(f"  {v.name:<30} {v.figure:<44} {mark}")
    renders_per_s = chat.renders / chat.wall_s if chat.wall_s else 0.0
    lines.append(
        f"  answer renders: {chat.renders} ({renders_per_s:.0f}/s), side panel updates: "
        f"{chat.stats_renders}; process CPU {chat.process_cpu_s:.1f} s over {chat.wall_s:.1f} s"
    )
    first, last = (window_rate(chat.arrivals, f, config.window) for f in (True, False))
    lines.append(
        f"  chat over the answer: first {config.window} {_fmt(first)} tok/s, last "
        f"{config.window} {_fmt(last)} tok/s; engine alone (same request, no app): "
        f"{_fmt(alone.decode_tps)} tok/s"
    )
    same = "yes" if chat.text == generate.text == alone.text else "NO (the requests differ)"
    lines.append(
        f"  chat finish: {chat.finish_reason}, {chat.completion_tokens} tokens; "
        f"generate: {generate.completion_tokens} tokens; same answer: {same}"
    )
    return lines


def record(
    config: ChatBenchConfig, chat: ChatRun, generate: GenerateRun, alone: EngineRun
) -> dict[str, object]:
    """The run as one JSON-ready object (scripts/bench-chat prints it after the table)."""
    first = chat.window_rate(True, config.window)
    last = chat.window_rate(False, config.window)
    tokens = chat.completion_tokens
    return {
        "backend": generate.backend,
        "threads": config.threads,
        "tokens": tokens,
        "chat_tps": chat.decode_tps,
        "generate_tps": generate.decode_tps,
        "chat_vs_generate": _ratio(chat.decode_tps, generate.decode_tps),
        "first_tps": first,
        "last_tps": last,
        "last_vs_first": _ratio(last, first),
        "engine_alone_tps": alone.decode_tps,
        "engine_alone_last_vs_first": _slowdown(alone.arrivals, config.window),
        "ui_cpu_per_100": chat.ui_cpu_s / tokens * 100 if tokens else None,
        "keys_typed": len(chat.key_latencies_s),
        "key_slowest_ms": max(chat.key_latencies_s) * 1000 if chat.key_latencies_s else None,
        "renders": chat.renders,
        "same_answer": chat.text == generate.text == alone.text,
        "met": {v.name: v.ok for v in verdicts(config, chat, generate, alone)},
    }
