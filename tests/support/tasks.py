"""Task specs the tests submit: a text of a device, and a valid tiny PNG (no imaging library needed)."""

from __future__ import annotations

import struct
import zlib

from sieve.v1 import intake_pb2, types_pb2


def tiny_png(width: int = 8, height: int = 8) -> bytes:
    """A valid grey PNG (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = tiny_png()


def text_spec(device: str, text: str, **kw: object) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=text, **kw)
