"""The chat app at the engine's speed? One run of the real `localinfer chat` app, headless.

Drives the Textual app (App.run_test) on the embedded model: a fixed prompt, greedy, a fixed
token budget (1,000). Prints the chat's decode tok/s (the engine's own timing of that request),
`localinfer generate`'s tok/s for the same request (run in its own process in the same run), their
ratio, the UI thread's CPU seconds per 100 tokens (time.thread_time in the UI thread), the rate
over the last 200 tokens vs the first 200 beside the same figure for the engine alone (the same
request on the same session, no app: a model decodes slower as its context grows), and how long
keys typed while the answer streams take to reach the prompt. Targets (2 cores): chat >= 0.9x
generate, the chat's last-200/first-200 >= 0.9x the engine's own, UI thread <= 0.2 CPU-s per
100 tokens, every key within one frame. Headless: the app lays out and
renders every frame as on a terminal, but writes no escape codes. Run it on a quiet machine.
A table, then one JSON line.

    scripts/bench-chat
    scripts/bench-chat --backend llamacpp --threads 1
    scripts/bench-chat --quick            # 200 tokens, windows of 50 (a smoke run)
    scripts/bench-chat --model path/to/model.gguf
    scripts/bench-chat --earlier 5        # five finished 1,000-token answers above it
    GOMP_SPINCOUNT=300000 scripts/bench-chat --backend llamacpp   # libgomp's own spin
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-chat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help="a model file or name (default: the embedded model)")
    p.add_argument("--backend", choices=("torch", "llamacpp", "mlx"), help="default: as chat")
    p.add_argument("--threads", type=int, default=None, help="default: as chat")
    p.add_argument("--max-tokens", type=int, default=1000)
    p.add_argument("--window", type=int, default=200, help="tokens in the first/last windows")
    p.add_argument("--quick", action="store_true", help="200 tokens, windows of 50")
    p.add_argument(
        "--earlier",
        type=int,
        default=0,
        metavar="N",
        help="N finished ~1,000-token answers on screen above the measured one",
    )
    args = p.parse_args()
    if args.quick:
        args.max_tokens, args.window = 200, 50
    return args


def main() -> int:
    args = parse_args()
    from bench.chat import ChatBenchConfig, run_chat, run_engine_alone
    from bench.chat_report import record, report_lines, run_generate
    from localinfer.backends.llamacpp.cpu import physical_cores
    from localinfer.conversations import ConversationStore
    from localinfer.tui.host import open_with_settings

    config = ChatBenchConfig(
        model=args.model,
        max_tokens=args.max_tokens,
        window=args.window,
        backend=args.backend,
        threads=args.threads,
        earlier=args.earlier,
    )
    generate = run_generate(config)  # first: the chat's process holds no model meanwhile
    session = open_with_settings(config.settings())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            chat = asyncio.run(run_chat(session, config, ConversationStore(tmp)))
        alone = run_engine_alone(session, config)
        notice = session.runner_notice.split(" (")[0]
    finally:
        session.close()
    threads = args.threads or f"default ({physical_cores()})"
    spin = os.environ.get("GOMP_SPINCOUNT")  # llama.cpp's OpenMP wait (backends/llamacpp/omp_wait)
    header = (
        f"bench-chat: {notice} · threads {threads} · {config.max_tokens} tokens greedy · "
        f"{args.earlier} earlier answers · "
        + (f"GOMP_SPINCOUNT {spin} · " if spin else "")
        + f"{os.cpu_count()} CPUs · load {os.getloadavg()[0]:.2f}"
    )
    print("\n".join(report_lines(config, chat, generate, alone, header)))
    print(json.dumps(record(config, chat, generate, alone)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
