"""scripts/bench-servers end to end: localinfer's server and llama-cpp-python's, both tables and
the ratio table (slow: two servers, a few requests each)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.child import child_env, module_argv

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_servers_prints_both_tables_and_the_ratio(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp.server.app")  # the peer needs llama-cpp-python[server]
    out = tmp_path / "both.json"
    done = subprocess.run(
        module_argv("bench.servers_loadgen", "--concurrency", "1,2", "--requests", "2",
                    "--max-tokens", "4", "--sizes", "short", "--threads", "1", "--json", str(out)),
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bench: localinfer" in done.stdout and "bench: llama-cpp-python" in done.stdout
    assert "localinfer / llama-cpp-python" in done.stdout
    ours, peer = json.loads(out.read_text())
    for report, source in ((ours, ["usage"]), (peer, ["chunks"])):
        for level in report["levels"]:
            assert level["ok"] == 2 and level["errors"] == 0
            assert level["token_count_from"] == source
            assert level["output_tokens"] == 2 * 4  # both forced to --max-tokens
