"""Unit tests of image header reading (sieve.images) and of the intake's image checks built on it."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import pytest

from intake_svc.validation import validate_spec
from sieve.errors import InvalidInput
from sieve.images import ImageError, check_pixels, inspect_image
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2

pytestmark = pytest.mark.ocr_extra


def _pillow() -> Any:
    """PIL.Image, or the test is skipped: Pillow (the `ocr` extra) renders the test images."""
    return pytest.importorskip("PIL.Image", reason="Pillow (the `ocr` extra) renders the test images")


def encoded(fmt: str, size: tuple[int, int] = (321, 123), mode: str = "RGB", **options: object) -> bytes:
    out = io.BytesIO()
    _pillow().new(mode, size, "white").save(out, format=fmt, **options)
    return out.getvalue()


def png_header(width: int, height: int, depth: int = 8, colour: int = 2) -> bytes:
    body = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + body + struct.pack(">I", zlib.crc32(b"IHDR" + body))
    return b"\x89PNG\r\n\x1a\n" + chunk


@pytest.mark.parametrize(
    ("fmt", "options", "name"),
    [
        ("PNG", {}, "png"),
        ("JPEG", {"quality": 80}, "jpeg"),
        ("JPEG", {"progressive": True}, "jpeg"),
        ("WEBP", {"lossless": True}, "webp"),
        ("WEBP", {"quality": 70}, "webp"),
        ("BMP", {}, "bmp"),
    ],
)
def test_the_header_of_each_accepted_format_gives_its_size(fmt: str, options: dict, name: str) -> None:
    info = inspect_image(encoded(fmt, **options), require_complete=True)
    assert (info.format, info.width, info.height) == (name, 321, 123)
    assert info.pixels == 321 * 123


def test_a_webp_with_alpha_uses_the_extended_header() -> None:
    info = inspect_image(encoded("WEBP", mode="RGBA", quality=70), require_complete=True)
    assert (info.width, info.height) == (321, 123)


def test_something_without_magic_bytes_is_not_an_image() -> None:
    with pytest.raises(ImageError, match="is not a JPEG, PNG, WebP or BMP image"):
        inspect_image(b"hello, this is a text file\n")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP"])
def test_a_header_cut_short_is_refused(fmt: str) -> None:
    data = encoded(fmt)
    cut = {"PNG": 20, "JPEG": 30, "WEBP": 22, "BMP": 20}[fmt]
    with pytest.raises(ImageError, match=r"truncated|corrupt"):
        inspect_image(data[:cut])


def test_zero_size_dimensions_are_refused() -> None:
    with pytest.raises(ImageError, match="zero-size"):
        inspect_image(png_header(0, 100))
    jpeg = bytearray(encoded("JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 7] = b"\x00\x00"  # height 0
    with pytest.raises(ImageError, match="zero-size"):
        inspect_image(bytes(jpeg))


def test_an_impossible_png_bit_depth_is_refused() -> None:
    with pytest.raises(ImageError, match="bit depth"):
        inspect_image(png_header(10, 10, depth=3))


def test_a_bomb_is_told_by_its_header_alone() -> None:
    info = inspect_image(png_header(20000, 20000))  # no pixel data at all
    assert info.pixels == 400_000_000
    with pytest.raises(ImageError, match="400000000 pixels, more than the limit of 40000000"):
        check_pixels(info, 40_000_000)


def test_a_truncated_body_passes_the_header_check_but_not_the_completeness_check() -> None:
    jpeg = encoded("JPEG", (400, 300))
    png = encoded("PNG", (400, 300))
    for data in (jpeg[: len(jpeg) - 50], png[: len(png) - 20]):
        inspect_image(data)
        with pytest.raises(ImageError, match="truncated"):
            inspect_image(data, require_complete=True)


# --- intake ------------------------------------------------------------------------------------------
def image_spec(data: bytes) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id="AA:BB:CC:DD:EE:FF", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=data)


def test_intake_accepts_a_good_image_and_refuses_bad_headers_naming_task_image() -> None:
    settings = Settings.from_env({}, ocr_max_image_pixels=1_000_000)
    task = validate_spec(image_spec(encoded("PNG")), "task", "anonymous", settings)
    assert task.image is not None
    for data, reason in (
        (encoded("JPEG")[:25], "truncated"),
        (png_header(0, 5), "zero-size"),
        (png_header(2000, 2000), "more than the limit"),
    ):
        with pytest.raises(InvalidInput) as err:
            validate_spec(image_spec(data), "task", "anonymous", settings)
        assert err.value.field == "task.image"
        assert reason in str(err.value)
