"""The llama.cpp runner keeps llama.cpp's graph reuse whatever order the engine lists the slots in.

llama.cpp runs the previous decode's graph again only when the batch names the same sequences in
the same order; the engine lists them in admission order, which changes whenever a request ends.
The runner feeds them in slot order (batch.py), and maps the logits back to the caller's items.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backends.base import SlotWork  # noqa: E402
from localinfer.backends.llamacpp.batch import decode_spans, flatten_batch  # noqa: E402
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from tests.llamacpp_helpers import cfg, prompt, tiny_setup  # noqa: E402

pytestmark = pytest.mark.llamacpp

VOCAB = 100
ORDER = (0, 1, 3, 2)  # as after the request in slot 2 ended and a new one took it


def test_rows_go_in_slot_order_and_outputs_name_the_callers_items() -> None:
    batch = [SlotWork(3, (7, 8), 0), SlotWork(0, (5,), 4), SlotWork(1, (9, 9, 9), 0, logits="all")]
    flat = flatten_batch(batch, VOCAB)
    assert flat.seq.tolist() == [0, 1, 1, 1, 3, 3]
    assert flat.tokens.tolist() == [5, 9, 9, 9, 7, 8]
    assert flat.pos.tolist() == [4, 0, 1, 2, 0, 1]
    assert flat.want.tolist() == [1, 1, 1, 1, 0, 1]
    assert [(o.item, o.row, o.n) for o in flat.outputs] == [(1, 0, 1), (2, 1, 3), (0, 5, 1)]
    assert flat.slot_ends(0, 6) == [(0, 4), (1, 2), (3, 1)]
    assert flat.slot_ends(2, 5) == [(1, 2), (3, 0)]  # a later span: its rows only


def test_a_decode_step_flattens_as_the_general_path_does() -> None:
    """One token per item takes a shorter path; the same rows, outputs and checks come out as
    through the general one (a 2-token item in the batch forces that)."""
    steps = [SlotWork(5, (11,), 9), SlotWork(0, (3,), 4, logits="all"), SlotWork(2, (8,), 0)]
    fast = flatten_batch(steps, VOCAB)
    general = flatten_batch([*steps, SlotWork(7, (1, 2), 0)], VOCAB)
    for name in ("tokens", "pos", "seq", "want"):
        assert getattr(fast, name).dtype == getattr(general, name).dtype
        assert getattr(fast, name).tolist() == getattr(general, name).tolist()[:3]
    assert fast.outputs == general.outputs[:3]
    assert decode_spans(fast.want, 512, 8) == [(0, 3)]
    for bad in (-1, VOCAB):
        with pytest.raises(ValueError, match=f"slot 2: token id {bad} outside vocab"):
            flatten_batch([SlotWork(0, (1,), 0), SlotWork(2, (bad,), 0)], VOCAB)
        with pytest.raises(ValueError, match=f"token id {bad} outside"):
            flatten_batch([SlotWork(0, (1, bad, 2), 0)], VOCAB)


def _decode_steps(runner: LlamaCppRunner, order: tuple[int, ...], steps: int) -> list[np.ndarray]:
    prompts = {s: prompt(5 + s, seed=s, vocab=runner.info.vocab_size) for s in order}
    runner.forward([SlotWork(s, prompts[s], 0) for s in order])
    last: list[np.ndarray] = []
    for step in range(steps):
        batch = [SlotWork(s, (100 + step + s,), runner.slot_length(s)) for s in order]
        last = runner.forward(batch)
    return last


def test_decode_steps_reuse_the_graph_in_any_slot_order(tmp_path: Path) -> None:
    _, _, model = tiny_setup(tmp_path)
    runner = LlamaCppRunner(model, cfg(max_ctx=64, slots=4))
    try:
        before = runner.graphs_reused
        _decode_steps(runner, ORDER, steps=6)
        # The first decode builds its graph (the prefill before it had another shape); the
        # other five run it again.
        assert runner.graphs_reused - before == 5
    finally:
        runner.close()


def test_logits_come_back_in_the_callers_order(tmp_path: Path) -> None:
    _, _, model = tiny_setup(tmp_path)
    shuffled = LlamaCppRunner(model, cfg(max_ctx=64, slots=4))
    ordered = LlamaCppRunner(model, cfg(max_ctx=64, slots=4))
    try:
        got = _decode_steps(shuffled, ORDER, steps=3)
        want = _decode_steps(ordered, tuple(sorted(ORDER)), steps=3)
        for i, slot in enumerate(ORDER):
            np.testing.assert_array_equal(got[i], want[sorted(ORDER).index(slot)])
    finally:
        shuffled.close()
        ordered.close()
