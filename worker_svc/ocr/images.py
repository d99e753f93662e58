"""Payload bytes to pixels: header checks first, then one OpenCV decode (opencv-contrib-python, pinned).

`decode_image` refuses, before OpenCV allocates anything, what the header already condemns — not an
image, a truncated header or body, zero-size dimensions, more pixels than `SIEVE_OCR_MAX_IMAGE_PIXELS`
(`sieve.images`) — then decodes with `cv2.imdecode`. Whatever the source (grey, 16-bit, palette, with
alpha), the result is an 8-bit BGR image; transparent pixels are put on white, as a viewer shows them,
and a JPEG is turned upright as its EXIF orientation says.
Every refusal is a `BadImage` whose message says what is wrong; it fails the task, never retries it.

Blocking and CPU-bound: run it in an executor (OpenCV releases the GIL while decoding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sieve.images import ImageError, check_pixels, inspect_image


class BadImage(ValueError):
    """The payload cannot be OCR'd; the message is the task's error."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded image (BGR uint8, H x W x 3), what its header said, and the time decoding took."""

    pixels: Any
    format: str
    width: int
    height: int
    decode_ms: float

    def describe(self) -> dict[str, Any]:
        return {"format": self.format, "width": self.width, "height": self.height}


def decode_image(data: bytes, max_pixels: int) -> Decoded:
    """The image in `data` as BGR pixels; BadImage when it is not a usable image."""
    began = time.perf_counter()
    if not data:
        raise BadImage("image is empty")
    try:
        info = inspect_image(data, require_complete=True)
        check_pixels(info, max_pixels)
    except ImageError as exc:
        raise BadImage(f"image {exc}" if str(exc).startswith("is ") else str(exc)) from None

    import cv2
    import numpy as np

    # JPEG: IMREAD_COLOR applies the EXIF orientation (phone photos); others keep their alpha channel.
    flags = cv2.IMREAD_COLOR if info.format == "jpeg" else cv2.IMREAD_UNCHANGED
    try:
        pixels = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error as exc:
        raise BadImage(f"{info.format.upper()} image could not be decoded: {exc.err or exc}") from None
    if pixels is None or pixels.size == 0:
        raise BadImage(f"{info.format.upper()} image could not be decoded (corrupt data)")
    if sorted(pixels.shape[:2]) != sorted((info.height, info.width)):
        raise BadImage(
            f"{info.format.upper()} image decoded to {pixels.shape[1]}x{pixels.shape[0]}, "
            f"its header says {info.width}x{info.height}"
        )
    pixels = _to_bgr8(pixels, cv2, np)
    height, width = pixels.shape[:2]
    return Decoded(pixels, info.format, width, height, (time.perf_counter() - began) * 1000)


def _to_bgr8(pixels: Any, cv2: Any, np: Any) -> Any:
    if pixels.dtype != np.uint8:  # 16-bit PNG: keep the high byte
        if pixels.dtype == np.uint16:
            pixels = (pixels >> 8).astype(np.uint8)
        else:
            pixels = cv2.normalize(pixels, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)
    if pixels.ndim == 2:
        return cv2.cvtColor(pixels, cv2.COLOR_GRAY2BGR)
    channels = pixels.shape[2]
    if channels == 1:
        return cv2.cvtColor(pixels, cv2.COLOR_GRAY2BGR)
    if channels == 4:
        alpha = pixels[:, :, 3:4].astype(np.float32) / 255.0
        colour = pixels[:, :, :3].astype(np.float32)
        return (colour * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    return pixels
