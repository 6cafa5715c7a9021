"""Marks shared by the whole suite."""

from __future__ import annotations

import pytest

# Modules whose results depend on the CPU's vector ISA (torch runner and its native kernels,
# oneDNN packing, the calibration the budget and backend choice read): scripts/test runs the
# tests marked `isa` a second time with AVX-512 hidden, as on most laptops.
ISA_DEPENDENT = {
    "test_torch_native",
    "test_native_quant",
    "test_torch_runner",
    "test_select",
    "test_budget",
    "test_quant",
    "test_quant_runner",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in ISA_DEPENDENT:
            item.add_marker(pytest.mark.isa)
