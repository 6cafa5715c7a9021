"""The one ``--threads`` option every command that runs a model shares, with its reason.

The default is the physical cores this process may use (backends/llamacpp/cpu.py), for every
backend. scripts/bench-threads measured it on the project's 2-core machine with a Python thread
in the same process kept busy as the chat UI or the HTTP server is while an answer streams
(single-stream decode of the embedded model, llama.cpp, tok/s, 1 vs 2 threads): idle neighbour
57 vs 96, busy half the time 50 vs 53, busy all the time 39 vs 25. Two threads win by 1.7x
unless the neighbour takes a whole core, which the chat must not do (issue: chat at the
engine's speed), so the default stays at the cores; ``--threads N`` for a machine shared with
other busy work.
"""

from __future__ import annotations

import argparse

THREADS_HELP = (
    "CPU threads for the backend (default: this machine's physical cores, measured fastest "
    "while the chat UI or HTTP server shares the process; fewer if other busy programs share "
    "the cores)"
)


def add_threads_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
