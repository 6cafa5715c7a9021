"""The RPC tests' workers (bench/rpc_workers.py) and the check that the loaded llama.cpp has the
RPC backend (a venv built before scripts/_env.sh passed GGML_RPC=ON has not: those tests skip,
saying so)."""

from __future__ import annotations

import pytest

from bench.rpc_workers import WorkerProcess, start_worker, workers

__all__ = ["WorkerProcess", "require_rpc", "start_worker", "workers"]


def require_rpc() -> None:
    """Skip the calling test unless llama-cpp-python is installed with the RPC backend."""
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp import rpc_ggml

    if not rpc_ggml.supported():
        pytest.skip(
            "llama-cpp-python here was built without GGML_RPC (rebuild the venv: scripts/_env.sh "
            "passes -DGGML_RPC=ON; or put `python -m bench.llamacpp_rpc`'s build on PYTHONPATH)"
        )
