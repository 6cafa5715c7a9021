"""The bench plot: a real PNG with both panels, and a clear error without matplotlib."""

from __future__ import annotations

import struct
import sys

import pytest

from localinfer.bench.plot import write_plot
from localinfer.bench.records import BenchReport, LevelResult, RequestRecord
from localinfer.errors import LocalinferError


def report(name: str, scale: float) -> BenchReport:
    levels = []
    for c in (1, 2, 4):
        records = [RequestRecord(str(i), True, scale * c * (1 + i), 0.1 * c, scale * c, 8)
                   for i in range(c)]  # fmt: skip
        levels.append(LevelResult(c, scale * c, records))
    return BenchReport(name, "m", 8, levels)


def test_plot_is_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = write_plot([report("a", 1.0), report("b", 2.0)], tmp_path / "sub" / "p.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1200, 480)


def test_plot_without_matplotlib_is_one_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(LocalinferError, match="needs matplotlib"):
        write_plot([report("a", 1.0)], tmp_path / "p.png")
