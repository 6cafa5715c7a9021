"""The one ``--threads`` option every command that runs a model shares, with its reason.

The default is the physical cores this process may use (backends/llamacpp/cpu.py), for every
backend. scripts/bench-threads measures single-stream decode at each thread count with a Python
thread of the same process busy, as the chat UI or the HTTP server is while an answer streams. On
the project's 2-core machine two threads decode about twice as fast as one while that neighbour
idles and no slower at half its time; only a neighbour that takes a whole core makes one thread
better. The chat UI must not take a core (its rendering is coalesced), so the default stays at
the cores, for `chat`, `generate` and `serve` alike; ``--threads N`` is for a machine shared with
other busy programs. With libgomp's short spin (backends/llamacpp/omp_wait.py) two threads on a
loaded machine decode about as fast as one, not several times slower (docs/measurements.md,
"Thread count").
"""

from __future__ import annotations

import argparse

from localinfer.counts import positive_int_arg

THREADS_HELP = (
    "CPU threads for the backend (default: this machine's physical cores, measured fastest "
    "while the chat UI or HTTP server shares the process; fewer if other busy programs share "
    "the cores)"
)


def add_threads_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--threads", type=positive_int_arg, default=None, metavar="N", help=THREADS_HELP
    )
