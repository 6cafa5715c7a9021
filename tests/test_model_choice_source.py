"""The chat picker's source column: where each listed model comes from, as `localinfer models`
says it (a Hub repo budgeted from its metadata is "hub", not "catalog")."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.model_listing import ListedModel
from localinfer.tui.model_list import _choice


@pytest.mark.parametrize(
    ("listed_source", "on_disk", "shown"),
    [
        ("embedded", True, "bundled"),
        ("bundled", True, "bundled"),
        ("catalog", False, "catalog"),
        ("hf cache", True, "local"),
        ("hub", False, "hub"),
        ("local", False, "local"),
    ],
)
def test_picker_source_follows_the_listing(listed_source: str, on_disk: bool, shown: str) -> None:
    path = Path("/models/x.gguf") if on_disk else None
    model = ListedModel("org/repo:Q4_K_M", listed_source, path, None, "", error="no budget")
    choice = _choice(model, ctx=512, current=False)
    assert choice.source == shown
    assert choice.note == "no budget"
