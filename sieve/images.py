"""Reading image headers without decoding pixels: format, width and height of JPEG, PNG, WebP and BMP.

Shared by the intake (reject what cannot be an image, or is too large, before anything is stored) and the
OCR worker (check a payload before OpenCV allocates its pixels, so a decompression bomb such as a
20 000 x 20 000 PNG is refused from its header). Pure Python, no image library.

`inspect_image` raises `ImageError` (a ValueError) with a message fit for the caller: unknown format,
truncated or inconsistent header, zero-size dimensions, and, with `require_complete`, a body without its
end marker (a JPEG without EOI after its scan, a PNG without IEND). `check_pixels` applies a pixel limit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["ImageError", "ImageInfo", "check_pixels", "inspect_image", "sniff_format"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic); not DHT (C4), JPG (C8), DAC (CC).
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
#: JPEG markers without a length field.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
#: PNG colour type -> allowed bit depths.
_PNG_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}
_BMP_BITS = {1, 2, 4, 8, 16, 24, 32, 64}
#: Where the end marker of a PNG may be: the last bytes (a few encoders append padding).
_PNG_TAIL = 1024


class ImageError(ValueError):
    """The bytes are not a usable image; the message says why."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What an image's header says."""

    #: "jpeg", "png", "webp" or "bmp"
    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff_format(data: bytes) -> str | None:
    """The format the magic bytes announce, or None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith(b"BM"):
        return "bmp"
    return None


def inspect_image(data: bytes, *, require_complete: bool = False) -> ImageInfo:
    """Format and dimensions from the header; ImageError when they cannot be read or make no sense.

    With `require_complete`, a JPEG must have its end-of-image marker after the scan and a PNG its IEND
    chunk (a truncated download or upload is refused before decoding).
    """
    kind = sniff_format(data)
    if kind is None:
        raise ImageError("is not a JPEG, PNG, WebP or BMP image")
    reader = {"jpeg": _jpeg, "png": _png, "webp": _webp, "bmp": _bmp}[kind]
    try:
        width, height = reader(data, require_complete)
    except (struct.error, IndexError):
        raise ImageError(f"{kind.upper()} header is truncated") from None
    if width <= 0 or height <= 0:
        raise ImageError(f"{kind.upper()} header gives a zero-size image ({width}x{height})")
    return ImageInfo(kind, width, height)


def check_pixels(info: ImageInfo, max_pixels: int) -> None:
    """ImageError when the image has more than `max_pixels` pixels."""
    if info.pixels > max_pixels:
        raise ImageError(
            f"{info.format.upper()} image is {info.width}x{info.height} = {info.pixels} pixels, "
            f"more than the limit of {max_pixels}"
        )


# --- formats ---------------------------------------------------------------------------------------
def _jpeg(data: bytes, require_complete: bool) -> tuple[int, int]:
    pos = 2
    size: tuple[int, int] | None = None
    while True:
        marker, pos = _jpeg_marker(data, pos, size)
        if marker in _JPEG_STANDALONE:
            continue
        if marker == 0xD9:
            raise ImageError("JPEG ends before its image data")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            raise ImageError(f"JPEG header is corrupt (segment length {length})")
        if marker in _JPEG_SOF:
            size = _jpeg_frame_size(data, pos)
        elif marker == 0xDA:  # start of scan: the header is over
            return _jpeg_scan(data, pos + length, size, require_complete)
        pos += length


def _jpeg_marker(data: bytes, pos: int, size: tuple[int, int] | None) -> tuple[int, int]:
    """(the marker at `pos`, after its fill bytes; the position after it). `size`: the frame's, once read."""
    n = len(data)
    if pos >= n:
        raise ImageError(
            "JPEG header is truncated (no frame header)" if size is None else "JPEG is truncated (no scan)"
        )
    if data[pos] != 0xFF:
        raise ImageError(f"JPEG header is corrupt (no marker at byte {pos})")
    while pos < n and data[pos] == 0xFF:  # fill bytes
        pos += 1
    if pos >= n:
        raise ImageError("JPEG header is truncated")
    return data[pos], pos + 1


def _jpeg_frame_size(data: bytes, pos: int) -> tuple[int, int]:
    """(width, height) of the frame header whose segment starts at `pos`."""
    if pos + 7 > len(data):
        raise ImageError("JPEG header is truncated (frame header)")
    height, width = struct.unpack_from(">HH", data, pos + 3)
    return width, height


def _jpeg_scan(data: bytes, scan_at: int, size: tuple[int, int] | None, require_complete: bool) -> tuple[int, int]:
    """The image size at the start of its scan (image data from `scan_at`)."""
    if size is None:
        raise ImageError("JPEG header is corrupt (scan before frame header)")
    if require_complete and data.find(b"\xff\xd9", scan_at) == -1:
        raise ImageError("JPEG is truncated (no end-of-image marker after its scan)")
    return size


def _png(data: bytes, require_complete: bool) -> tuple[int, int]:
    if len(data) < 33:
        raise ImageError("PNG header is truncated (no complete IHDR chunk)")
    length, kind = struct.unpack_from(">I4s", data, 8)
    if kind != b"IHDR" or length != 13:
        raise ImageError("PNG header is corrupt (the first chunk is not IHDR)")
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    if colour not in _PNG_DEPTHS or depth not in _PNG_DEPTHS[colour]:
        raise ImageError(f"PNG header is corrupt (bit depth {depth} with colour type {colour})")
    if width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise ImageError("PNG header is corrupt (dimension over 2^31 - 1)")
    if require_complete and data.find(b"IEND", max(0, len(data) - _PNG_TAIL)) == -1:
        raise ImageError("PNG is truncated (no IEND chunk)")
    return width, height


def _webp(data: bytes, require_complete: bool) -> tuple[int, int]:
    (riff_size,) = struct.unpack_from("<I", data, 4)
    chunk = data[12:16]
    if require_complete and riff_size + 8 > len(data):
        raise ImageError(f"WebP is truncated ({len(data)} of {riff_size + 8} bytes)")
    if chunk == b"VP8X":
        if len(data) < 30:
            raise ImageError("WebP header is truncated (VP8X)")
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise ImageError(
                "WebP header is corrupt (no VP8 start code)" if len(data) >= 26 else "WebP header is truncated (VP8)"
            )
        w, h = struct.unpack_from("<HH", data, 26)
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        if len(data) < 25 or data[20] != 0x2F:
            raise ImageError("WebP header is corrupt or truncated (VP8L)")
        (bits,) = struct.unpack_from("<I", data, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    raise ImageError(f"WebP header is corrupt (unknown chunk {chunk!r})")


def _bmp(data: bytes, require_complete: bool) -> tuple[int, int]:
    _file_size, _, offset, dib = struct.unpack_from("<IIII", data, 2)
    if dib == 12:  # BITMAPCOREHEADER
        width, height, planes, bits = struct.unpack_from("<HHHH", data, 18)
    elif dib in (40, 52, 56, 64, 108, 124):
        width, height, planes, bits = struct.unpack_from("<iiHH", data, 18)
    else:
        raise ImageError(f"BMP header is corrupt (unknown DIB header size {dib})")
    if planes != 1 or bits not in _BMP_BITS:
        raise ImageError(f"BMP header is corrupt ({planes} planes, {bits} bits per pixel)")
    if offset < 14 + dib:
        raise ImageError(f"BMP header is corrupt (pixel data at byte {offset})")
    if require_complete and offset >= len(data):
        raise ImageError("BMP is truncated (no pixel data)")
    return width, abs(height)
