"""Images from clients and files, decoded safely into RGB pixels (issue #37).

Every image is untrusted: a client's upload, a file named on the command line. Pillow reads the
header first (:func:`decode_image`), so the size is checked before a pixel is decoded: a PNG
header claiming 50,000 x 50,000 pixels is refused without the 7.5 GB it would unpack to. Only the
common still formats are taken; a file that is no image, a truncated one, an empty one, or one
too large is an InvalidParameterError naming the field it came in. A decoded image is scaled
down to :data:`MAX_SIDE_KEPT` on its longest side (projectors work at a few hundred pixels:
Gemma 3 at 896). Remote ``http(s)`` URLs are refused here: a local server must not fetch
addresses for whoever can reach it (``serve --allow-image-urls`` fetches them instead:
localinfer/server/image_fetch.py).

The pixels are handed to llama.cpp as RGB, never the file: its image loader (stb_image) never
sees client bytes. :class:`ImageChat` is how a chat with images becomes a prompt (the server's
and ``generate``'s).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from localinfer.engine import ConstraintSource
from localinfer.engine.images import PromptImage, RGBImage, image_prompt
from localinfer.errors import InvalidParameterError
from localinfer.loading.model import LoadedModel

MAX_IMAGE_BYTES = 20 * 2**20  # an encoded image (base64 decoded), as OpenAI's limit
MAX_SIDE = 16_384  # pixels a side, read from the header
MAX_PIXELS = 50_000_000  # width x height, read from the header (a 48 MP phone photo passes)
MAX_SIDE_KEPT = 4096  # decoded larger, an image is scaled down to this on its longest side
MAX_IMAGES = 16  # images in one request
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
INSTALL_HINT = "pip install 'localinfer[llamacpp]'"
_LIMITS = (
    f"is larger than localinfer reads (at most {MAX_SIDE} pixels a side and "
    f"{MAX_PIXELS // 1_000_000} megapixels)"
)
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*),", re.ASCII)


def decode_image(data: bytes, field: str) -> RGBImage:
    """``data`` (an encoded PNG, JPEG, WebP, GIF or BMP) as RGB pixels; InvalidParameterError
    naming ``field`` for anything else (module doc)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        why = f"{field}: reading images needs Pillow: {INSTALL_HINT}"
        raise InvalidParameterError(why) from None
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidParameterError(
            f"{field}: an image of {len(data)} bytes; at most {MAX_IMAGE_BYTES // 2**20} MiB"
        )
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            _check_size(image.size, field)
            if image.format == "JPEG":
                image.draft("RGB", (MAX_SIDE_KEPT, MAX_SIDE_KEPT))  # decoded at 1/2..1/8 scale
            rgb = image.convert("RGB")  # decodes the pixels: a truncated file fails here
    except UnidentifiedImageError:
        raise InvalidParameterError(
            f"{field}: not an image localinfer reads ({', '.join(FORMATS)})"
        ) from None
    except Image.DecompressionBombError:  # Pillow's own limit, met before its size is known
        raise InvalidParameterError(f"{field}: an image {_LIMITS}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidParameterError(f"{field}: a broken or truncated image ({exc})") from None
    if max(rgb.size) > MAX_SIDE_KEPT:
        rgb.thumbnail((MAX_SIDE_KEPT, MAX_SIDE_KEPT), Image.Resampling.LANCZOS)
    return RGBImage(rgb.size[0], rgb.size[1], rgb.tobytes())


def _check_size(size: tuple[int, int], field: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise InvalidParameterError(f"{field}: an image of {width}x{height} pixels")
    if max(width, height) > MAX_SIDE or width * height > MAX_PIXELS:
        raise InvalidParameterError(f"{field}: a {width}x{height} image {_LIMITS}")


def image_url_bytes(url: str, field: str) -> bytes:
    """The encoded image of an OpenAI ``image_url``: a ``data:`` URL or bare base64. Remote URLs
    are refused (module doc)."""
    text = url.strip()
    if text.lower().startswith(("http://", "https://")):
        raise InvalidParameterError(
            f"{field}: remote image URLs are not fetched (a local server fetches no address a "
            "client names, unless it runs with --allow-image-urls); send the image inline as a "
            "data: URL (data:image/png;base64,...)"
        )
    found = _DATA_URL.match(text)
    if found is not None:
        if ";base64" not in found["params"].lower():
            raise InvalidParameterError(f"{field}: a data: URL must hold base64 (;base64,)")
        text = text[found.end() :]
    elif text.lower().startswith(("data:", "file:", "ftp:")) or "://" in text[:16]:
        raise InvalidParameterError(f"{field}: only data: URLs and base64 images are read")
    return base64_bytes(text, field)


def base64_bytes(text: str, field: str) -> bytes:
    """Base64 (standard alphabet, whitespace and missing padding allowed) decoded; capped first."""
    packed = "".join(text.split())
    if len(packed) * 3 // 4 > MAX_IMAGE_BYTES:
        raise InvalidParameterError(
            f"{field}: an image of over {MAX_IMAGE_BYTES // 2**20} MiB; send a smaller one"
        )
    try:
        return base64.b64decode(packed + "=" * (-len(packed) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameterError(f"{field}: not valid base64") from None


def read_image_file(path: Path, field: str = "--image") -> RGBImage:
    """An image file on disk, decoded; errors name ``field`` and the path."""
    return decode_image(read_image_bytes(path, field), f"{field} {path}")


def read_image_bytes(path: Path, field: str = "--image") -> bytes:
    """An image file's bytes, its size checked before it is read; errors name ``field`` and
    the path."""
    where = f"{field} {path}"
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise InvalidParameterError(
                f"{where}: {size} bytes; at most {MAX_IMAGE_BYTES // 2**20} MiB"
            )
        return path.read_bytes()
    except OSError as exc:
        raise InvalidParameterError(f"{where}: {exc.strerror or exc}") from None


def check_image_count(count: int, field: str) -> None:
    if count > MAX_IMAGES:
        raise InvalidParameterError(f"{field}: {count} images in one request; at most {MAX_IMAGES}")


class ChatSource(Protocol):
    """What a chat prompt needs from a session (localinfer.session.Session fits)."""

    @property
    def model(self) -> LoadedModel: ...

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> tuple[str, list[int]]: ...

    def compile_constraint(self, spec: Any) -> ConstraintSource: ...


class ImageChat:
    """A chat source whose prompt is tokenized by the model's projector, with its images."""

    def __init__(self, source: ChatSource, runner: object, images: list[RGBImage]) -> None:
        self._source, self._runner, self._images = source, runner, images
        self.images: tuple[PromptImage, ...] = ()  # the prompt's, once rendered

    @property
    def model(self) -> LoadedModel:
        return self._source.model

    def compile_constraint(self, spec: Any) -> ConstraintSource:
        return self._source.compile_constraint(spec)

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> tuple[str, list[int]]:
        text, _ = self._source.render_chat(messages, **template_vars)
        tokenizer = self.model.tokenizer
        prompt = image_prompt(self._runner, tokenizer, text, self._images, field="messages")
        self.images = prompt.images
        return text, prompt.ids
