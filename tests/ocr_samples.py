"""Images for the OCR tests and benchmark: Chinese and English text rendered with Pillow and a CJK font,
the lexicon words each one holds, bad images (truncated, bombs), and the character error rate.

The CJK font comes from Debian (`fonts-wqy-microhei` or `fonts-noto-cjk`, installed by .ci/run) and is
found at run time; without it the OCR tests skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import unicodedata
import zlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
)


@dataclass(frozen=True)
class Sample:
    """One image: its lines of text, the lexicon words in it, how it is encoded."""

    lines: tuple[str, ...]
    words: frozenset[str] = field(default_factory=frozenset)
    format: str = "PNG"
    background: tuple[int, int, int] = (255, 255, 255)
    ink: tuple[int, int, int] = (20, 20, 20)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _s(
    *lines: str,
    words: tuple[str, ...] = (),
    fmt: str = "PNG",
    bg: tuple[int, int, int] = (255, 255, 255),
    ink: tuple[int, int, int] = (20, 20, 20),
) -> Sample:
    return Sample(tuple(lines), frozenset(words), fmt, bg, ink)


SAMPLES: tuple[Sample, ...] = (
    _s("今天天气很好，适合出门散步", "The weather is nice today"),
    _s("这里有赌博网站，请勿访问", words=("赌博",), fmt="JPEG"),
    _s("欢迎光临本店", "Welcome to our store", bg=(250, 244, 225)),
    _s("六合彩开奖结果查询", words=("六合彩",), fmt="WEBP"),
    _s("Online casino bonus today", words=("casino",)),
    _s("请注意个人信息安全", "Protect your password", fmt="JPEG", bg=(235, 242, 250)),
    _s("出售冰毒和海洛因", words=("冰毒", "海洛因"), fmt="BMP"),
    _s("cocaine and heroin are illegal", words=("cocaine", "heroin")),
    _s("会议时间：下午三点", "Room 302, Building B", fmt="JPEG"),
    _s("免费领取大礼包，加微信", words=("免费领取", "加微信")),
    _s("机器学习与人工智能", "Machine learning in 2026", bg=(255, 255, 240)),
    _s("警惕电信诈骗和洗钱", words=("诈骗", "洗钱"), fmt="JPEG"),
    _s("Free money for everyone", words=("free money",), fmt="WEBP"),
    _s("春眠不觉晓，处处闻啼鸟"),
    _s("订单编号：A20261129", "Total: 128.50 CNY", fmt="JPEG"),
    _s("禁止携带枪支和炸药", words=("枪支", "炸药"), bg=(245, 245, 245)),
    _s("北京欢迎你", "Beijing welcomes you", ink=(10, 30, 120)),
    _s("这是一段正常的商品评论", fmt="JPEG"),
    _s("Where to buy a gun online", words=("buy a gun",)),
    _s("明天下午开会讨论预算", "Budget meeting tomorrow", fmt="WEBP"),
)


@cache
def find_cjk_font() -> str | None:
    """A font file with Chinese glyphs (Debian's paths, then fontconfig), or None."""
    for path in FONT_CANDIDATES:
        if Path(path).is_file():
            return path
    if shutil.which("fc-match"):
        try:
            out = subprocess.run(
                ["fc-match", "-f", "%{file}", ":lang=zh-cn"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and Path(out).is_file() and any(k in out.lower() for k in ("cjk", "wqy", "hei", "song", "ming")):
            return out
    return None


def require_cjk_font() -> str:
    """The CJK font's path; skips the test without one (fails it in CI, where .ci/run installs one)."""
    font = find_cjk_font()
    if font is None:
        reason = "no CJK font (install fonts-wqy-microhei or fonts-noto-cjk; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: required in CI")
        pytest.skip(reason)
    return font


def render(sample: Sample, font_path: str, size: int = 40) -> bytes:
    """The sample's lines drawn on a plain background, encoded in its format."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(font_path, size)
    widths = [font.getbbox(line)[2] for line in sample.lines]
    line_h = int(size * 1.8)
    width = max(widths) + 2 * size
    height = line_h * len(sample.lines) + size
    image = Image.new("RGB", (width, height), sample.background)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(sample.lines):
        draw.text((size, size // 2 + i * line_h + (line_h - size) // 2), line, font=font, fill=sample.ink)
    out = io.BytesIO()
    options: dict[str, object] = {"JPEG": {"quality": 92}, "WEBP": {"lossless": True}}.get(sample.format, {})
    image.save(out, format=sample.format, **options)
    return out.getvalue()


def render_all(font_path: str) -> list[bytes]:
    return [render(s, font_path) for s in SAMPLES]


# --- scoring ---------------------------------------------------------------------------------------
def _clean(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKC", text) if not ch.isspace())


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def character_errors(expected: str, recognised: str) -> tuple[int, int]:
    """(edit distance, expected length) after NFKC and with all whitespace removed."""
    e, r = _clean(expected), _clean(recognised)
    return edit_distance(e, r), len(e)


# --- bad images --------------------------------------------------------------------------------------
def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A valid greyscale PNG of width x height white pixels: a few hundred KB that decode to width*height bytes."""
    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\xff" * width
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(parts)) + _chunk(b"IEND", b"")
