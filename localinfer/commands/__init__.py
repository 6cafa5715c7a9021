"""CLI subcommands: each module defines ``register(subparsers)`` (see localinfer/cli.py).

Modules import heavy dependencies inside their ``func`` so ``localinfer --help`` stays fast.
"""
