"""How close `localinfer budget` comes to the memory the real runners use (issue 7).

For each backend (torch, llama.cpp) and each cell of context x concurrency, a fresh Python process
computes the budget with `compute_budget` (what the CLI prints) and then runs `--verify`'s
measuring code (`localinfer.budget_verify.verify_budget`): load the embedded model with the real
runner at those settings, run one prefill chunk, and take the process's RSS growth from before the
load (before torch / llama_cpp is even imported) to after the forward, plus the runner's own
`memory()` report. One process per cell, so one cell's allocator arenas and freed pages cannot
inflate the next cell's figure.

The verdict is on the total: predicted (weights + KV + compute buffers + the backend's runtime
constant) against the RSS growth, which holds everything the process gained. The "parts" columns
put the predicted weights + KV + compute beside the runner's own `memory()` report (weights + KV +
overhead), which is not the same quantity: torch's report leaves out the GGUF file the session
keeps mapped (counted by the budget on CPU), and llama.cpp's overhead is the compute buffer it
reserves, most of whose pages the CPU never makes resident (see the memory model in
backends/llamacpp/profile.py).

Then "remote = local" (issue 22): a fake Hugging Face Hub on 127.0.0.1 (tests/hub_server.py, the
one the tests use) serves the embedded model's GGUF and a safetensors folder of the same model (its
tensors' names, shapes and BF16 dtype; the data a sparse hole, as the budget reads only headers).
Each is budgeted from the Hub before any download (`ORG/REPO:Q4_1`: the GGUF header by range
requests; `ORG/REPO`: config.json + the safetensors header), then pulled and budgeted from the
Hugging Face cache, and budgeted from the files themselves. Weights and KV must be equal to the
byte.

    scripts/budget-accuracy                      # the full grid, both backends
    scripts/budget-accuracy --backends torch --ctx 512 --concurrency 1
    scripts/budget-accuracy --remote-only        # only remote = local
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.child import child_env, module_argv

# The budget (localinfer.budget, which loads numpy and gguf) is imported where it is used:
# `--help` does not import it.

TOLERANCE = 0.10  # issue 7: predicted within +-10% of measured in every cell
MODEL = "smollm2-135m"  # the embedded SmolLM2-135M-Instruct Q4_1
MODULE = "bench.budget_accuracy"  # run again in child processes: one per cell, per side
GGUF_REPO = "local/SmolLM2-135M-Instruct-GGUF"  # what the fake Hub serves
ST_REPO = "local/SmolLM2-135M-Instruct"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/budget-accuracy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backends", default="torch,llamacpp", help="comma list")
    parser.add_argument("--ctx", default="512,2048,8192", help="comma list of contexts")
    parser.add_argument("--concurrency", default="1,4,8", help="comma list of slot counts")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per cell")
    parser.add_argument("--remote-only", action="store_true", help="only the remote = local check")
    parser.add_argument("--skip-remote", action="store_true", help="no remote = local check")
    # Internal: the remote = local check's budgets in a process pointed at the fake Hub.
    parser.add_argument("--remote-side", nargs=4, help=argparse.SUPPRESS)
    # Internal: measure one cell in this process and print its MemoryCheck as JSON.
    parser.add_argument(
        "--cell", nargs=3, metavar=("BACKEND", "CTX", "SLOTS"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def measure_cell(model: str, backend: str, ctx: int, slots: int) -> dict:
    """Runs in the child: the CLI's prediction, then `--verify`'s measurement of it."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest
    from localinfer.budget_verify import verify_budget

    report = compute_budget(
        BudgetRequest(model, ctx=ctx, concurrency=slots, device="cpu", backend=backend)
    )
    check = verify_budget(report)
    return {"report": report.model_dump(), "check": check.model_dump()}


def run_cell(args: argparse.Namespace, backend: str, ctx: int, slots: int) -> dict:
    cmd = module_argv(MODULE, "--model", args.model, "--cell", backend, str(ctx), str(slots))
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=args.timeout, env=child_env()
    )
    if done.returncode != 0:
        raise RuntimeError(f"{backend} ctx {ctx} x {slots}: exit {done.returncode}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(n: int) -> str:
    return f"{n / 2**20:8.1f}"


def pct(predicted: int, measured: int) -> float:
    """Signed error of the prediction relative to the measurement."""
    return (predicted - measured) / measured * 100.0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cell:
        backend, ctx, slots = args.cell[0], int(args.cell[1]), int(args.cell[2])
        print(json.dumps(measure_cell(args.model, backend, ctx, slots)))
        return 0
    if args.remote_side:
        side, folder, ctx, slots = args.remote_side
        print(json.dumps(remote_side(side, Path(folder), int(ctx), int(slots))))
        return 0
    measured_ok = args.remote_only or measured_grid(args)
    remote_ok = args.skip_remote or remote_equals_local(args)
    return 0 if measured_ok and remote_ok else 1


def measured_grid(args: argparse.Namespace) -> bool:
    """The +-10% check: every cell's prediction against the measured RSS growth."""
    from localinfer.budget.report import MemoryCheck

    backends = [b for b in args.backends.split(",") if b]
    contexts = [int(c) for c in args.ctx.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    misses = 0
    cells = 0
    worst = 0.0
    for backend in backends:
        print(f"\n{backend} on cpu, {args.model} (MiB; error = (predicted - measured) / measured)")
        header = (
            f"{'ctx':>5} {'seq':>3} | {'weights':>8} {'KV':>8} {'compute':>8} {'runtime':>8} |"
            f" {'predicted':>9} {'RSS grow':>8} {'error':>7} | {'parts pr':>8} {'reported':>8}"
            f" {'error':>7} | {'s':>4}"
        )
        print(header)
        print("-" * len(header))
        for ctx in contexts:
            for slots in concurrencies:
                start = time.monotonic()
                result = run_cell(args, backend, ctx, slots)
                seconds = time.monotonic() - start
                report, check = result["report"], result["check"]
                predicted = check["predicted_total"]
                measured = check["rss_growth"]
                total_error = MemoryCheck.model_validate(check).total_error
                if total_error is None:
                    raise RuntimeError(f"no RSS figure for {backend} ctx {ctx} x {slots}: {check}")
                error = total_error * 100.0
                parts_predicted = (
                    check["predicted_weights"]
                    + check["predicted_kv_cache"]
                    + check["predicted_compute"]
                )
                parts_reported = (
                    check["measured_weights"]
                    + check["measured_kv_cache"]
                    + check["measured_overhead"]
                )
                parts_error = pct(parts_predicted, parts_reported)
                ok = abs(error) <= TOLERANCE * 100
                cells += 1
                misses += 0 if ok else 1
                worst = error if abs(error) > abs(worst) else worst
                print(
                    f"{ctx:>5} {slots:>3} | {mib(report['weights_bytes'])}"
                    f" {mib(report['kv_cache_bytes'])} {mib(report['compute_bytes'])}"
                    f" {mib(report['runtime_bytes'])} | {mib(predicted):>9} {mib(measured)}"
                    f" {error:>+6.1f}% | {mib(parts_predicted)} {mib(parts_reported)}"
                    f" {parts_error:>+6.1f}% | {seconds:4.0f}{'' if ok else '  MISS'}",
                    flush=True,
                )
                if args.json:
                    print(json.dumps({"backend": backend, "ctx": ctx, "slots": slots, **check}))
    verdict = "PASS" if misses == 0 else "FAIL"
    print(
        f"\n{verdict}: {cells - misses}/{cells} cells within +-{TOLERANCE:.0%} of the measured"
        f" RSS growth (worst {worst:+.1f}%)"
    )
    return misses == 0


# -- remote = local ---------------------------------------------------------------------------


def remote_cases(folder: Path) -> list[tuple[str, str, str]]:
    """(the Hub's name, the file or folder on disk, backend) of every remote = local comparison."""
    from localinfer.loading.embedded import embedded_model_path

    gguf = str(embedded_model_path())
    return [
        (f"{GGUF_REPO}:Q4_1", gguf, "llamacpp"),
        (f"{GGUF_REPO}:Q4_1", gguf, "torch"),
        (ST_REPO, str(folder / "st"), "torch"),
    ]


def write_safetensors_twin(gguf: Path, folder: Path) -> None:
    """The GGUF's model as a Hugging Face folder: config.json and one model.safetensors whose
    header lists every tensor by its Hugging Face name and shape in BF16 (what the SmolLM2
    checkpoint stores); the data is a sparse hole, so 270 MB cost nothing on disk."""
    from localinfer.loading.loader import load_model

    model = load_model(gguf)
    c, weights = model.config, model.weights
    config = {
        "model_type": c.arch,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.ffn_size,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_ctx,
        "tie_word_embeddings": c.tied_embeddings,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "torch_dtype": "bfloat16",
    }
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "tokenizer.json").write_text("{}")
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in weights.names():
        shape = list(weights.shape(name))  # type: ignore[attr-defined]
        size = 2  # BF16
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with (folder / "model.safetensors").open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        out.truncate(8 + len(raw) + offset)


def remote_side(side: str, folder: Path, ctx: int, slots: int) -> dict:
    """In a process whose huggingface_hub talks to the fake Hub: the budgets of every case from
    the Hub's metadata (side "remote"), or after `pull` and from the files themselves ("local")."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest
    from localinfer.cli import main

    def figures(spec: str, backend: str) -> dict:
        request = BudgetRequest(spec, ctx=ctx, concurrency=slots, device="cpu", backend=backend)
        report = compute_budget(request)
        out = {"weights": report.weights_bytes, "kv": report.kv_cache_bytes}
        return out | {"kind": report.model_kind, "source": report.weights_source}

    out: dict[str, dict] = {}
    for hub_name, path, backend in remote_cases(folder):
        key = f"{hub_name} {backend}"
        if side == "remote":
            out[key] = {"remote": figures(hub_name, backend)}
            continue
        if main(["pull", hub_name, "--quiet", "--device", "cpu"]) != 0:
            raise RuntimeError(f"pull {hub_name} failed")
        out[key] = {"pulled": figures(hub_name, backend), "file": figures(path, backend)}
    return out


def run_side(side: str, folder: Path, ctx: int, slots: int, env: dict[str, str]) -> dict:
    cmd = module_argv(MODULE, "--remote-side", side, str(folder), str(ctx), str(slots))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env(env))
    if done.returncode != 0:
        raise RuntimeError(f"remote = local, {side} side: exit {done.returncode}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve_files(hub: object, folder: Path) -> dict[str, int]:
    """Put the GGUF and the safetensors folder on the fake Hub; file name -> size."""
    from localinfer.loading.embedded import embedded_model_path

    gguf = embedded_model_path()
    write_safetensors_twin(gguf, folder / "st")
    served = [(GGUF_REPO, gguf)] + [(ST_REPO, p) for p in sorted((folder / "st").iterdir())]
    for repo, path in served:
        hub.add_file(repo, path.name, path.read_bytes())  # type: ignore[attr-defined]
    return {path.name: path.stat().st_size for _, path in served}


def remote_equals_local(args: argparse.Namespace) -> bool:
    """Budgets from the Hub's metadata equal, byte for byte (weights, KV), the budgets after
    `pull` and of the files themselves; before `pull`, only headers were read."""
    from tests.hub_server import FakeHub  # the fake Hub the tests use, beside bench/

    ctx = max(int(c) for c in args.ctx.split(","))
    slots = max(int(c) for c in args.concurrency.split(","))
    with tempfile.TemporaryDirectory() as tmp, FakeHub() as hub:
        folder = Path(tmp)
        sizes = serve_files(hub, folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(folder / "hf-home")}
        env |= {"HF_HUB_CACHE": str(folder / "hf-cache"), "LOCALINFER_CACHE_DIR": tmp + "/li"}
        remote = run_side("remote", folder, ctx, slots, env)
        read = {name: hub.bytes_sent(name) for name in sizes}
        local = run_side("local", folder, ctx, slots, env)
    print("\nremote = local: budgets from the fake Hub before download, after `pull`, and of the")
    print(f"files themselves (bytes; ctx {ctx} x {slots}; cpu)")
    for name, size in sizes.items():
        if name != "tokenizer.json":
            print(f"  read from the Hub before pull: {name} {read[name]:,} of {size:,} bytes")
    return print_remote_table(remote, local)


def print_remote_table(remote: dict, local: dict) -> bool:
    header = (
        f"{'model':<38} {'backend':<8} | {'weights remote':>14} {'pulled':>12} {'file':>12} |"
        f" {'KV remote':>13} {'pulled':>13} {'file':>13} | verdict"
    )
    print(header)
    print("-" * len(header))
    failures = 0
    for key in remote:
        hub_name, backend = key.rsplit(" ", 1)
        r, p, f = remote[key]["remote"], local[key]["pulled"], local[key]["file"]
        diffs = [
            f"{what} {other_name} {other[what] - r[what]:+,}"
            for what in ("weights", "kv")
            for other_name, other in (("pulled", p), ("file", f))
            if other[what] != r[what]
        ]
        if r["kind"] != "hub_remote" or p["kind"] == "hub_remote":
            diffs.append(f"kinds {r['kind']} / {p['kind']}: not a before/after pair")
        failures += bool(diffs)
        print(
            f"{hub_name:<38} {backend:<8} | {r['weights']:>14,} {p['weights']:>12,}"
            f" {f['weights']:>12,} | {r['kv']:>13,} {p['kv']:>13,} {f['kv']:>13,} |"
            f" {'; '.join(diffs) if diffs else 'equal'}"
        )
        print(f"{'':<38} {'':<8} | remote: {r['source']}")
    verdict = "PASS" if failures == 0 else "FAIL"
    print(f"\n{verdict}: {len(remote) - failures}/{len(remote)} remote budgets equal to local")
    return failures == 0


if __name__ == "__main__":
    sys.exit(main())
