# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""Images on the llama.cpp runner (issue #37), on a tiny random Gemma 3 with its projector
(tests/vision_model.py): the runner's image path against llama.cpp's multimodal library used
directly (tests/mtmd_reference.py), through the engine with chunked prefill and prefix reuse,
and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from localinfer.backends.prompt_images import IMAGE_MARKER, RGBImage, is_image_id  # noqa: E402
from localinfer.engine import Engine, Request, SamplingParams  # noqa: E402
from localinfer.errors import InvalidParameterError, UnsupportedModelError  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from tests.model_files import file_model  # noqa: E402
from tests.mtmd_reference import mtmd_greedy  # noqa: E402
from tests.vision_model import (  # noqa: E402
    IMAGE_TOKENS,
    random_image,
    vlm,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.llamacpp

QUESTION = "<|im_start|>user\nWhat is in {image}? Say it.<|im_end|>\n<|im_start|>assistant\n"
N_NEW = 8


def rgb(seed: int, size: tuple[int, int] = (40, 24)) -> RGBImage:
    pixels = random_image(seed, size)
    return RGBImage(pixels.shape[1], pixels.shape[0], pixels.tobytes())


def runner(vlm: tuple[Path, Path], slots: int = 2, projector: bool = True) -> LlamaCppRunner:
    model, mmproj = vlm
    config = RunnerConfig(
        slots=slots, max_ctx=256, threads=1, mmproj=str(mmproj) if projector else None
    )
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


def test_a_prompt_with_an_image_holds_its_placeholders(vlm: tuple[Path, Path]) -> None:
    run = runner(vlm)
    assert run.vision is not None
    text = QUESTION.format(image=IMAGE_MARKER)
    one = run.vision.prompt(text, [rgb(0)], 1)
    again = run.vision.prompt(text, [rgb(0)], 1)
    other = run.vision.prompt(text, [rgb(1)], 1)
    (image,) = one.images
    assert one.ids[0] == 1 and image.n_tokens == IMAGE_TOKENS
    inside = one.ids[image.start : image.end]
    assert all(is_image_id(t) for t in inside) and len(set(inside)) == IMAGE_TOKENS
    assert not any(is_image_id(t) for t in one.ids[: image.start] + one.ids[image.end :])
    # The same picture gives the same ids (the prefix cache reuses it), another picture none.
    assert again.ids == one.ids
    assert not set(inside) & set(other.ids[image.start : image.end])
    with pytest.raises(ValueError, match="places 1 images but 2"):
        run.vision.prompt(text, [rgb(0), rgb(1)], None)
    run.close()


def test_runner_matches_mtmd_used_directly(vlm: tuple[Path, Path]) -> None:
    """Same image, same prompt: the runner's first logits and greedy tokens are llama.cpp's own
    (mtmd_helper_eval_chunks), and another image changes them."""
    model, mmproj = vlm
    want_rows, want = mtmd_greedy(
        model, mmproj, QUESTION.format(image="<__media__>"), [rgb(0)], N_NEW
    )
    run = runner(vlm)
    rows, got = greedy_on_runner(run, 1, rgb(0))
    assert got == want
    np.testing.assert_allclose(rows, want_rows, rtol=0, atol=1e-4 * np.abs(want_rows).max())
    assert len(set(got)) > 2  # an answer, not one token repeated
    other, other_tokens = greedy_on_runner(run, 0, rgb(1))
    assert np.abs(other[0] - rows[0]).max() > 0.1 and other_tokens != got
    run.close()


def engine(vlm: tuple[Path, Path], slots: int = 2, **kw: object) -> Engine:
    model = load_model(vlm[0])
    run = runner(vlm, slots)
    return Engine(run, model.tokenizer, background=False, **kw)  # type: ignore[arg-type]


def image_request(eng: Engine, text: str, images: list[RGBImage], n: int = N_NEW) -> Request:
    prompt = eng.runner.vision.prompt(text, images, None)  # type: ignore[attr-defined]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return Request(prompt.ids, params, images=prompt.images)


def test_engine_answers_an_image_question_as_mtmd(vlm: tuple[Path, Path]) -> None:
    """Through the engine, prefilled in chunks of 8 (the image is never split between steps),
    beside a text-only request: the same tokens as llama.cpp's own."""
    model, mmproj = vlm
    _, want = mtmd_greedy(model, mmproj, QUESTION.format(image="<__media__>"), [rgb(0)], N_NEW)
    with engine(vlm, prefill_chunk=8) as eng:
        request = image_request(eng, QUESTION.format(image=IMAGE_MARKER), [rgb(0)])
        text = Request([5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=4, ignore_eos=True))
        handles = eng.submit_all([request, text])
        fed: list[int] = []
        while eng.has_work():
            fed.append(eng.step().prefilled.get(handles[0].request_id, 0))
        assert list(handles[0].result().token_ids) == want
        assert handles[1].result().finish_reason == "length"
    image = request.images[0]
    # The chunk that reached the image took all of it, past the step's 8-token budget.
    ends = np.cumsum([n for n in fed if n])
    assert image.end in ends and image.start + 8 not in ends


def test_second_turn_about_the_same_image_reuses_its_kv(vlm: tuple[Path, Path]) -> None:
    """A follow-up question about the same picture starts from the cached image; the answer is
    what a cold prefill gives. Another picture reuses nothing past the text before it. One slot:
    Gemma 3's sliding-window cache is not copied between slots (kv_cache.py)."""
    first_turn = QUESTION.format(image=IMAGE_MARKER)
    with engine(vlm, slots=1, prefix_reuse=True) as eng:
        result = eng.generate(image_request(eng, first_turn, [rgb(0)]))
        follow = first_turn + result.text + "<|im_end|>\n<|im_start|>user\nAnd the colour?"
        follow += "<|im_end|>\n<|im_start|>assistant\n"
        second = image_request(eng, follow, [rgb(0)])
        warm = eng.generate(second)
        image = second.images[0]
        assert warm.metrics.cached_tokens >= image.end
        other = eng.generate(image_request(eng, follow, [rgb(1)]))
        assert other.metrics.cached_tokens == image.start
    with engine(vlm, slots=1, prefix_reuse=False) as cold_engine:
        cold = cold_engine.generate(image_request(cold_engine, follow, [rgb(0)]))
    assert cold.metrics.cached_tokens == 0 and cold.token_ids == warm.token_ids


def test_images_are_refused_without_a_projector(vlm: tuple[Path, Path]) -> None:
    with engine(vlm) as eng:
        request = image_request(eng, QUESTION.format(image=IMAGE_MARKER), [rgb(0)])
    plain = runner(vlm, projector=False)
    assert plain.vision is None
    with Engine(plain, load_model(vlm[0]).tokenizer, background=False) as eng:
        with pytest.raises(UnsupportedModelError, match="--backend llamacpp"):
            eng.submit(request)
        # Placeholder ids without their images are not token ids.
        with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
            eng.submit(Request(request.prompt_ids))
    plain.close()


def test_a_projector_for_another_model_is_refused(vlm: tuple[Path, Path], tmp_path: Path) -> None:
    from localinfer.errors import ModelFileError
    from tests.vision_model import write_projector

    wrong = write_projector(tmp_path / "mmproj-wrong.gguf", text_width=48)
    model, _ = vlm
    config = RunnerConfig(slots=1, max_ctx=64, threads=1, mmproj=str(wrong))
    with pytest.raises(ModelFileError, match="not a vision projector for this model"):
        LlamaCppRunner(file_model(model, "F32"), config)


def test_requests_with_images_never_speculate() -> None:
    """A proposal copied from the prompt could hold an image's placeholder ids."""
    from types import SimpleNamespace

    from localinfer.engine.batch_plan import speculation_candidates

    def decoding(images: tuple) -> SimpleNamespace:
        return SimpleNamespace(
            sampler=SimpleNamespace(constraint=None), thinking_budget=None, slot=0,
            request=SimpleNamespace(images=images), tokens=[5, 6, 7, 5, 6],
            params=SimpleNamespace(max_tokens=16), num_output=1,
        )  # fmt: skip

    assert len(speculation_candidates([decoding(())], 64)) == 1  # type: ignore[list-item]
    assert speculation_candidates([decoding((object(),))], 64) == []  # type: ignore[list-item]
