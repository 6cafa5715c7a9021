# ruff: noqa: F811 - the qwen2vl fixture imported from tests.qwen2vl_model
"""Images placed by M-RoPE on the llama.cpp runner (issue #37), on a tiny random Qwen2-VL
(tests/qwen2vl_model.py), whose 40x24 image is 15 tokens that take 5 positions: the runner against
llama.cpp's multimodal library used directly (tests/mtmd_reference.py), through the engine with
chunked prefill beside a text request, a second turn that reuses the image's cells, a cut inside an
image refused, and the KV transfers off for such a model (backends/llamacpp/mrope.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backends.base import (  # noqa: E402
    MovedChunk,
    RunnerConfig,
    SlotWork,
    kv_splicer,
    kv_transfer,
)
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from localinfer.backends.prompt_images import IMAGE_MARKER, RGBImage  # noqa: E402
from localinfer.engine import Engine, Request, SamplingParams  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from tests.model_files import file_model  # noqa: E402
from tests.mtmd_reference import mtmd_greedy  # noqa: E402
from tests.qwen2vl_model import qwen2vl  # noqa: E402, F401 - a fixture
from tests.vision_model import random_image  # noqa: E402

pytestmark = pytest.mark.llamacpp

QUESTION = "<|im_start|>user\nWhat is in {image}? Say it.<|im_end|>\n<|im_start|>assistant\n"
N_NEW = 8


def rgb(seed: int, size: tuple[int, int] = (40, 24)) -> RGBImage:
    pixels = random_image(seed, size)
    return RGBImage(pixels.shape[1], pixels.shape[0], pixels.tobytes())


def runner(qwen2vl: tuple[Path, Path], slots: int = 2) -> LlamaCppRunner:
    model, mmproj = qwen2vl
    config = RunnerConfig(slots=slots, max_ctx=256, threads=1, mmproj=str(mmproj))
    return LlamaCppRunner(file_model(model, "F32"), config)


def greedy_on_runner(
    run: LlamaCppRunner, slot: int, image: RGBImage
) -> tuple[np.ndarray, list[int]]:
    """As mtmd_greedy: the logits of each step and the greedy tokens."""
    assert run.vision is not None
    prompt = run.vision.prompt(QUESTION.format(image=IMAGE_MARKER), [image], None)
    rows = [run.forward([SlotWork(slot, tuple(prompt.ids), 0, images=prompt.images)])[0][0]]
    tokens = [int(rows[0].argmax())]
    while len(tokens) < N_NEW:
        rows.append(run.forward([SlotWork(slot, (tokens[-1],), run.slot_length(slot))])[0][0])
        tokens.append(int(rows[-1].argmax()))
    return np.stack(rows), tokens


def test_slot_positions_follow_the_images_of_each_slot() -> None:
    """Token index -> position: shifted after each M-RoPE image by its positions minus its
    tokens, per slot; a cut inside an image is refused, and setting a length before an image
    forgets it (mrope.py)."""
    from localinfer.backends.llamacpp.mrope import SlotPositions

    lengths = SlotPositions(2)
    lengths[0] = 4
    lengths.add_image(0, 4, 15, 5)  # tokens 4..18 at positions 4 (time) .. 8
    lengths[0] = 19 + 3
    lengths.add_image(0, 22, 6, 3)  # tokens 22..27 take 3 positions from 12
    lengths[0], lengths[1] = 30, 7
    assert [lengths.position(0, i) for i in (3, 4, 19, 22, 28, 30)] == [3, 4, 9, 12, 15, 17]
    assert lengths.shift.tolist() == [-13, 0] and lengths.end(0) == 17 and lengths.end(1) == 7
    index, slot = np.array([30, 31, 7], np.int32), np.array([0, 0, 1], np.int32)
    assert lengths.text_positions(index, slot).tolist() == [17, 18, 7]
    with pytest.raises(ValueError, match="inside an image"):
        lengths.cut_position(0, 10)
    with pytest.raises(ValueError, match="cannot truncate"):
        lengths.cut_position(0, 31)
    assert lengths.cut_position(0, 22) == 12
    lengths[0] = 22  # the second image goes, the first stays
    assert lengths.shift.tolist() == [-10, 0] and lengths.end(0) == 12
    lengths[0] = 0
    assert lengths.end(0) == 0 and not lengths.shift.any()
    with pytest.raises(ValueError, match="the slot holds 0"):
        lengths.add_image(0, 3, 4, 2)


def test_an_image_takes_its_larger_side_in_positions(qwen2vl: tuple[Path, Path]) -> None:
    run = runner(qwen2vl)
    assert run.vision is not None and run.vision.mrope
    (image,) = run.vision.prompt(QUESTION.format(image=IMAGE_MARKER), [rgb(0)], None).images
    assert image.n_tokens == 5 * 3 and run.vision.n_pos(image) == 5
    time, row, column, last = run.vision.positions(image, 7)
    assert (time == 7).all() and (last == 0).all()
    assert row.tolist() == [7] * 5 + [8] * 5 + [9] * 5
    assert column.tolist() == [7, 8, 9, 10, 11] * 3
    run.close()


def test_runner_matches_mtmd_used_directly(qwen2vl: tuple[Path, Path]) -> None:
    """Same image, same prompt: the runner's logits and greedy tokens are llama.cpp's own
    (mtmd_helper_eval_chunks, which places the text after the image 10 positions before its
    index), in either slot; another image changes them."""
    model, mmproj = qwen2vl
    want_rows, want = mtmd_greedy(
        model, mmproj, QUESTION.format(image="<__media__>"), [rgb(0)], N_NEW
    )
    run = runner(qwen2vl)
    rows, got = greedy_on_runner(run, 1, rgb(0))
    assert got == want and len(set(got)) > 2
    np.testing.assert_allclose(rows, want_rows, rtol=0, atol=1e-4 * np.abs(want_rows).max())
    other, other_tokens = greedy_on_runner(run, 0, rgb(1))
    assert np.abs(other[0] - rows[0]).max() > 0.1 and other_tokens != got
    run.close()


def test_a_cut_inside_an_image_is_refused(qwen2vl: tuple[Path, Path]) -> None:
    """Every token of an image shares one position of time, which llama.cpp removes cells by: a
    cut inside it is a ValueError that leaves the slot as it was; a cut at its end or start keeps
    what lies before, and the prompt fed again from there gives the same logits."""
    run = runner(qwen2vl, slots=1)
    assert run.vision is not None
    prompt = run.vision.prompt(QUESTION.format(image=IMAGE_MARKER), [rgb(0)], None)
    (image,) = prompt.images
    ids = tuple(prompt.ids)
    whole = run.forward([SlotWork(0, ids, 0, images=prompt.images)])[0]
    with pytest.raises(ValueError, match="inside an image"):
        run.truncate(0, image.start + 3)
    assert run.slot_length(0) == len(ids)
    for cut in (image.end, image.start):
        run.truncate(0, cut)
        again = run.forward([SlotWork(0, ids[cut:], cut, images=prompt.images)])[0]
        np.testing.assert_allclose(again, whole, rtol=0, atol=1e-4 * np.abs(whole).max())
    run.close()


def test_kv_transfers_are_off_for_an_m_rope_model(qwen2vl: tuple[Path, Path]) -> None:
    """llama.cpp writes an M-RoPE cell's row and column into a slot's state, and a slot with an
    image keys cells by positions that are not indices: no copies or snapshots; splices are
    refused by llama.cpp before the slot changes."""
    run = runner(qwen2vl)
    assert kv_transfer(run) is None
    splicer = kv_splicer(run)
    assert splicer is not None
    run.forward([SlotWork(0, tuple(range(5, 25)), 0)])
    with pytest.raises(NotImplementedError):
        splicer.splice(0, 4, [MovedChunk((7, 8), 10, 20)])
    assert run.slot_length(0) == 20
    run.close()


def engine(qwen2vl: tuple[Path, Path], slots: int = 2, **kw: object) -> Engine:
    model = load_model(qwen2vl[0])
    return Engine(runner(qwen2vl, slots), model.tokenizer, background=False, **kw)  # type: ignore[arg-type]


def image_request(eng: Engine, text: str, images: list[RGBImage], n: int = N_NEW) -> Request:
    prompt = eng.runner.vision.prompt(text, images, None)  # type: ignore[attr-defined]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return Request(prompt.ids, params, images=prompt.images)


def test_engine_answers_an_image_question_as_mtmd(qwen2vl: tuple[Path, Path]) -> None:
    """Through the engine, prefilled in chunks of 8 beside a text-only request decoding in the
    same steps: llama.cpp's own tokens, and the request's prompt counted in tokens (what takes
    KV cells), not positions."""
    model, mmproj = qwen2vl
    _, want = mtmd_greedy(model, mmproj, QUESTION.format(image="<__media__>"), [rgb(0)], N_NEW)
    with engine(qwen2vl, prefill_chunk=8) as eng:
        request = image_request(eng, QUESTION.format(image=IMAGE_MARKER), [rgb(0)])
        text = Request([5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=12, ignore_eos=True))
        handles = eng.submit_all([text, request])
        while eng.has_work():
            eng.step()
        result = handles[1].result()
        assert list(result.token_ids) == want
        assert result.metrics.prompt_tokens == len(request.prompt_ids)
        assert handles[0].result().finish_reason == "length"


def test_second_turn_about_the_same_image_reuses_its_kv(qwen2vl: tuple[Path, Path]) -> None:
    """A follow-up question about the same picture starts from the slot's cached image and answer
    (cut after them by position); the answer is what a cold prefill gives. Another picture reuses
    nothing past the text before it."""
    first_turn = QUESTION.format(image=IMAGE_MARKER)
    with engine(qwen2vl, prefix_reuse=True) as eng:
        result = eng.generate(image_request(eng, first_turn, [rgb(0)]))
        follow = first_turn + result.text + "<|im_end|>\n<|im_start|>user\nAnd the colour?"
        follow += "<|im_end|>\n<|im_start|>assistant\n"
        second = image_request(eng, follow, [rgb(0)])
        warm = eng.generate(second)
        image = second.images[0]
        assert warm.metrics.cached_tokens >= image.end
        other = eng.generate(image_request(eng, follow, [rgb(1)]))
        assert other.metrics.cached_tokens == image.start
        assert other.token_ids != warm.token_ids
    with engine(qwen2vl, prefix_reuse=False) as cold_engine:
        cold = cold_engine.generate(image_request(cold_engine, follow, [rgb(0)]))
    assert cold.metrics.cached_tokens == 0 and cold.token_ids == warm.token_ids
