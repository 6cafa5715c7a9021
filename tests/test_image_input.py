"""localinfer/image_input.py: images from clients and files decoded safely (issue #37). What is
not an image, truncated, empty or too large is an InvalidParameterError naming the field, and the
size is refused from the header, before any pixel is decoded."""

from __future__ import annotations

import base64
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from localinfer.errors import InvalidParameterError  # noqa: E402
from localinfer.image_input import (  # noqa: E402
    MAX_IMAGES,
    MAX_SIDE_KEPT,
    check_image_count,
    decode_image,
    image_url_bytes,
    read_image_file,
)
from tests.image_files import data_url, png_bytes, png_claiming  # noqa: E402
from tests.vision_model import random_image  # noqa: E402

FIELD = "messages[0].content[1].image_url.url"


def test_png_and_jpeg_decode_to_their_pixels() -> None:
    pixels = random_image(3, (40, 24))
    image = decode_image(png_bytes(pixels), FIELD)
    assert (image.width, image.height) == (40, 24)
    assert image.pixels == pixels.tobytes()
    jpeg = decode_image(png_bytes(pixels, "JPEG"), FIELD)
    assert (jpeg.width, jpeg.height) == (40, 24) and len(jpeg.pixels) == 40 * 24 * 3
    # The digest is the pixels': the same picture in another file format, the same prompt ids.
    assert decode_image(png_bytes(pixels, "BMP"), FIELD).digest == image.digest


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"hello, not an image", "not an image localinfer reads"),
        (b"", "not an image localinfer reads"),
        (png_bytes(random_image(1))[:60], "broken or truncated"),
        (png_claiming(0, 0), "not an image|0x0"),  # Pillow itself takes no 0 x 0 PNG
        (png_claiming(50_000, 50_000), "image is larger than localinfer reads"),
        (png_claiming(20_000, 8), "20000x8 image is larger"),
        (b"%PDF-1.4\n", "not an image"),
    ],
)
def test_what_is_no_usable_image_is_refused_naming_the_field(data: bytes, says: str) -> None:
    with pytest.raises(InvalidParameterError, match=says) as refused:
        decode_image(data, FIELD)
    assert str(refused.value).startswith(f"{FIELD}: ")


def test_a_bomb_is_refused_from_its_header() -> None:
    """A 50,000 x 50,000 PNG would unpack to 7.5 GB: refused having allocated almost nothing."""
    bomb = png_claiming(50_000, 50_000)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidParameterError, match="larger than"):
            decode_image(bomb, FIELD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20


def test_a_large_image_is_scaled_down() -> None:
    wide = np.zeros((10, MAX_SIDE_KEPT + 904, 3), dtype=np.uint8)
    image = decode_image(png_bytes(wide), FIELD)
    assert image.width == MAX_SIDE_KEPT and image.height in (7, 8)


def test_image_urls_take_data_urls_and_base64_only() -> None:
    png = png_bytes(random_image(2))
    assert image_url_bytes(data_url(png), FIELD) == png
    assert image_url_bytes(base64.b64encode(png).decode(), FIELD) == png
    # Some clients leave the padding off or wrap the lines.
    wrapped = "\n".join(
        base64.b64encode(png).decode().rstrip("=")[i : i + 76] for i in range(0, 999, 76)
    )
    assert png.startswith(image_url_bytes(wrapped, FIELD)[:40])
    for url, says in [
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        ("http://127.0.0.1:8080/x.png", "remote image URLs are not fetched"),
        ("file:///etc/passwd", "only data: URLs and base64"),
        ("data:image/png,rawbytes", "must hold base64"),
        ("data:image/png;base64,@@@@", "not valid base64"),
    ]:
        with pytest.raises(InvalidParameterError, match=says):
            image_url_bytes(url, FIELD)


def test_files_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(png_bytes(random_image(4)))
    assert read_image_file(path).width == 40
    with pytest.raises(InvalidParameterError, match=r"--image .*missing\.png: No such file"):
        read_image_file(tmp_path / "missing.png")
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(InvalidParameterError, match=r"--image .*notes\.txt: not an image"):
        read_image_file(tmp_path / "notes.txt")
    check_image_count(MAX_IMAGES, "messages")
    with pytest.raises(
        InvalidParameterError, match=f"messages: {MAX_IMAGES + 1} images in one request; at most"
    ):
        check_image_count(MAX_IMAGES + 1, "messages")
