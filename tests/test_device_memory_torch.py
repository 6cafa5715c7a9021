"""The budget's CUDA memory where nvidia-smi is missing but the process runs torch on a GPU."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from localinfer.budget import memory
from localinfer.errors import InvalidParameterError


def _torch_with_gpus(*gpus: tuple[int, int]) -> SimpleNamespace:
    cuda = SimpleNamespace(
        is_available=lambda: bool(gpus),
        device_count=lambda: len(gpus),
        mem_get_info=lambda i: gpus[i],
    )
    return SimpleNamespace(cuda=cuda)


def test_cuda_memory_falls_back_to_a_loaded_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.shutil, "which", lambda name: None)  # no nvidia-smi
    monkeypatch.setitem(sys.modules, "torch", _torch_with_gpus((3 << 30, 8 << 30), (1, 2)))
    got = memory.device_memory("cuda:0")
    assert (got.kind, got.available, got.total) == ("cuda", 3 << 30, 8 << 30)
    assert memory.device_memory("cuda:1").total == 2
    with pytest.raises(InvalidParameterError, match="cuda:2 does not exist"):
        memory.device_memory("cuda:2")


def test_no_gpu_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "torch", _torch_with_gpus())
    with pytest.raises(InvalidParameterError, match="no CUDA GPU found"):
        memory.device_memory("cuda")
