"""`localinfer export MODEL --to vllm|llama-server|ollama`: the launch plan for another engine
serving the same model under the same name (localinfer/handoff.py)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from localinfer.command_help import command_parser
from localinfer.counts import parse_count


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command_parser(subparsers, "export", run)
    p.add_argument("model", metavar="MODEL", help="catalog name, GGUF file, folder or ORG/REPO")
    p.add_argument("--to", required=True, choices=("vllm", "llama-server", "ollama"))
    p.add_argument("--ctx", help="context tokens per sequence, e.g. 8k (default: as serve's)")
    p.add_argument("--concurrency", default="1", help="sequences at once (default: 1)")
    p.add_argument("--kv-dtype", metavar="f16|q8_0|q4_0", help="KV cache type (default: f16)")
    p.add_argument(
        "--alias", help="model id the clients send (default: the name `localinfer serve` gives)"
    )
    p.add_argument("--draft", default="off", metavar="off|ngram|auto|MODEL",
                   help="speculative decoding on the target engine (default: off)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address it listens on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, help="default: the engine's own (8000, 8080, 11434)")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the plan as a shell script to FILE"
    )
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--rpc", metavar="HOST:PORT,...", help="llama-server: split the model over "
                   "these `localinfer worker`s as `serve --rpc` would")  # fmt: skip
    p.add_argument("--tensor-split", metavar="N,N,...", help="with --rpc: each machine's share, "
                   "this machine's first")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from localinfer.errors import InvalidParameterError
    from localinfer.handoff import ExportRequest, export_plan
    from localinfer.rpc_nodes import rpc_options

    rpc = rpc_options(args.rpc, args.tensor_split)
    if rpc is not None and args.to != "llama-server":
        raise InvalidParameterError(f"--rpc splits the model for llama-server, not {args.to}")
    plan = export_plan(
        ExportRequest(
            model=args.model,
            target=args.to,
            ctx=parse_count(args.ctx, "--ctx") if args.ctx is not None else None,
            concurrency=parse_count(args.concurrency, "--concurrency"),
            kv_dtype=args.kv_dtype,
            alias=args.alias,
            draft=args.draft,
            host=args.host,
            port=args.port,
            rpc=rpc.workers if rpc else (),
            shares=rpc.shares if rpc else None,
        )
    )
    if args.output:
        Path(args.output).write_text(plan.shell())
        Path(args.output).chmod(0o755)
    if args.json:
        print(json.dumps(asdict(plan)))
        return 0
    if not args.output:
        sys.stdout.write(plan.shell())
    for note in plan.notes:
        print(f"# {note}", file=sys.stderr)
    print(f"# clients: base_url={plan.base_url} model={plan.alias}", file=sys.stderr)
    return 0
