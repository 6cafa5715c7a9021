"""The one ``--threads`` option every command that runs a model shares, with its reason.

The default is the physical cores this process may use (backends/llamacpp/cpu.py), for every
backend. scripts/bench-threads measured it on the project's 2-core machine, single-stream decode
of the embedded model with a Python thread of the same process busy as the chat UI or the HTTP
server is while an answer streams; 1 thread vs 2 (the default), tok/s:

    neighbour busy        0%          50%         100%
    llama.cpp          59 vs 106    50 vs 60     41 vs 21
    native kernels    105 vs 208    99 vs 97     49 vs 21

Two threads are twice as fast while the neighbour idles and even at half its time; only a
neighbour that takes a whole core makes one thread better (2x). The chat UI must not take a core
(the chat issue's coalesced rendering), so the default stays at the cores; ``--threads N`` is for
a machine shared with other busy programs.

Those figures were taken with libgomp spinning 300,000 times before a llama.cpp thread sleeps;
it now spins 1,000 (backends/llamacpp/omp_wait.py): the spin is what a busy neighbour or a busy
machine stalled. Under load 5-7 (other programs), two threads then decode about as fast as one
(31.5 vs 32.9 tok/s alone, 28.9 vs 30.3 beside a UI-like thread; scripts/bench-chat-wait), not
4-10x slower. On a quiet machine the short spin costs 5-9% (83.7 / 73.9 tok/s alone / beside a
UI-like thread, against 88.4 / 81.2 with libgomp's 300,000; bench-chat-wait). The default stays
at the cores, for `chat`, `generate` and `serve` alike.
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
