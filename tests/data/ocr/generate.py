"""The hard OCR evaluation set, generated deterministically (seeded): Chinese, English and mixed text rendered with
Pillow in several CJK and Latin fonts at 12-48 px, under one condition per image — rotated a little, by 90°, 180° or
270° (a whole multi-line page, or a single line), blurred, JPEG quality 30, noisy, low contrast, on a textured
photo-like background, written vertically, in mixed scripts, as a paragraph, or laid out like a UI screenshot.
About 40 % of the lines carry a word of the default lexicon (`worker_svc/text/lexicon_default.tsv`), so word-hit
recall after OCR can be measured beside the character error rate.

    python -m tests.data.ocr.generate --out DIR [--per-condition 10] [--seed 18]

writes DIR/<case>.png|jpg and DIR/manifest.json (condition, lines, words, font, size of each). Tests and the
benchmark call `generate()` directly (the 200 images take a few seconds); nothing generated is committed.

Fonts come from Debian packages (.ci/run installs them): fonts-wqy-microhei, fonts-wqy-zenhei, fonts-noto-cjk
(CJK), fonts-dejavu-core and fonts-liberation (Latin). Fonts that are missing are left out of the rotation; with
no CJK font at all `generate` raises.
"""

from __future__ import annotations

import argparse
import io
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (path, face index in a .ttc); Noto CJK's collections hold the Simplified Chinese face at index 2
CJK_FONTS: tuple[tuple[str, int], ...] = (
    ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", 0),
    ("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc", 0),
    ("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc", 2),
    ("/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc", 2),
    ("/usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc", 2),
)
LATIN_FONTS: tuple[tuple[str, int], ...] = (
    ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 0),
    ("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf", 0),
    ("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf", 0),
    ("/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf", 0),
    ("/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed-Bold.ttf", 0),
)

CONDITIONS: tuple[str, ...] = (
    "clean",
    "small",
    "large",
    "rotate_10",
    "page_90",
    "page_180",
    "page_270",
    "line_90",
    "line_180",
    "line_270",
    "blur",
    "jpeg_30",
    "noise",
    "low_contrast",
    "textured",
    "vertical",
    "mixed",
    "paragraph",
    "ui",
    "latin",
)
#: the conditions whose CER must come close to the upright ones' (orientation and vertical text)
ORIENTED = ("page_90", "page_180", "page_270", "line_90", "line_180", "line_270", "vertical")

CHINESE = (
    "今天天气很好适合出门散步",
    "会议将在下午三点开始",
    "请把文件发到我的邮箱",
    "这家餐厅的菜味道不错",
    "明天早上八点在公司门口集合",
    "新的版本修复了很多问题",
    "图书馆周末开放到晚上十点",
    "请保管好您的随身物品",
    "欢迎光临本店全场八折",
    "地铁二号线因故障暂停运营",
    "孩子们在公园里放风筝",
    "本周的销售额比上周增长了",
    "请勿在车厢内饮食",
    "我们正在招聘软件工程师",
    "春天来了花都开了",
    "快递已经放在门卫室",
    "这个问题需要再讨论一下",
    "周末一起去爬山吧",
    "价格已经包含运费",
    "前方路口请右转",
    "注意安全小心地滑",
    "学习使我快乐",
    "感谢您的耐心等待",
    "晚饭想吃火锅还是烤肉",
)
ENGLISH = (
    "The weather is nice today",
    "Please send the report by Friday",
    "Meeting room booked until noon",
    "Your order has been shipped",
    "Thank you for your patience",
    "Open every day from nine to five",
    "Click the button below to continue",
    "The train to Boston leaves at seven",
    "Fresh coffee and pastries inside",
    "New features in version four",
    "Keep your password safe",
    "Lunch will be served at one",
    "All items half price this week",
    "Please wait while we load your data",
    "Turn left at the next corner",
    "Reading makes a full man",
)
MIXED = (
    "订单编号A20261129已发货",
    "版本v2.3发布了新功能",
    "请登录www.example.com查看",
    "明天下午3点开Zoom会议",
    "iPhone 15 价格下调500元",
    "本周KPI完成率达到98%",
    "用Python写一个小程序",
    "WiFi密码是guest2026",
)
UI_LABELS = (
    ("用户名", "zhang_wei"),
    ("手机号", "138 0000 1234"),
    ("Email", "user@example.com"),
    ("状态", "已付款"),
    ("Total", "128.50 CNY"),
    ("Date", "2026-11-29"),
    ("地址", "北京市朝阳区"),
    ("Plan", "Premium"),
)
UI_TITLES = ("账户设置", "Order details", "个人中心", "Settings", "订单详情", "Dashboard")
UI_BUTTONS = ("确定", "Submit", "立即购买", "Cancel", "保存", "Log in")


@dataclass(frozen=True)
class OcrCase:
    """One generated image: its condition, the text lines in reading order, the lexicon words drawn in it."""

    name: str
    condition: str
    lines: tuple[str, ...]
    words: tuple[str, ...]
    data: bytes
    format: str
    font: str
    size: int

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "condition": self.condition,
            "lines": list(self.lines),
            "words": list(self.words),
            "format": self.format,
            "font": self.font,
            "size": self.size,
        }


def available(fonts: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    return [f for f in fonts if Path(f[0]).is_file()]


def lexicon_words() -> tuple[list[str], list[str]]:
    """The default lexicon's words: (CJK ones, Latin ones)."""
    from worker_svc.text.lexicon_file import load_lexicon_file

    cjk: list[str] = []
    latin: list[str] = []
    for entry in load_lexicon_file():
        (latin if entry.word.isascii() else cjk).append(entry.word)
    return cjk, latin


class _Maker:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cjk_fonts = available(CJK_FONTS)
        self.latin_fonts = available(LATIN_FONTS) or self.cjk_fonts
        if not self.cjk_fonts:
            raise RuntimeError("no CJK font: install fonts-wqy-microhei, fonts-wqy-zenhei or fonts-noto-cjk")
        self.cjk_words, self.latin_words = lexicon_words()

    # --- text ------------------------------------------------------------------------------------------
    def chinese(self, words: list[str]) -> str:
        line = self.rng.choice(CHINESE)
        if self.rng.random() < 0.4:
            word = self.rng.choice(self.cjk_words)
            at = self.rng.randrange(1, len(line))
            line = line[:at] + word + line[at:]
            words.append(word)
        return line

    def english(self, words: list[str]) -> str:
        line = self.rng.choice(ENGLISH)
        if self.rng.random() < 0.4:
            word = self.rng.choice(self.latin_words)
            parts = line.split(" ")
            at = self.rng.randrange(1, len(parts) + 1)
            line = " ".join([*parts[:at], word, *parts[at:]])
            words.append(word)
        return line

    def any_line(self, words: list[str]) -> str:
        return self.chinese(words) if self.rng.random() < 0.6 else self.english(words)

    # --- drawing ---------------------------------------------------------------------------------------
    def font(self, lines: Sequence[str]) -> tuple[str, int]:
        latin_only = all(line.isascii() for line in lines)
        return self.rng.choice(self.latin_fonts + self.cjk_fonts if latin_only else self.cjk_fonts)

    def draw(
        self,
        lines: Sequence[str],
        font_ref: tuple[str, int],
        size: int,
        bg: tuple[int, int, int] = (255, 255, 255),
        ink: tuple[int, int, int] = (20, 20, 20),
        background: Any = None,
    ) -> Any:
        from PIL import Image, ImageDraw, ImageFont

        font = ImageFont.truetype(font_ref[0], size, index=font_ref[1])
        widths = [int(font.getlength(line)) for line in lines]
        line_h = int(size * self.rng.uniform(1.5, 1.9))
        margin = max(12, size)
        width = max(widths) + 2 * margin
        height = line_h * len(lines) + margin
        image = background(width, height) if background else Image.new("RGB", (width, height), bg)
        draw = ImageDraw.Draw(image)
        for i, line in enumerate(lines):
            draw.text((margin, margin // 2 + i * line_h + (line_h - size) // 2), line, font=font, fill=ink)
        return image

    def textured(self, width: int, height: int) -> Any:
        """A photo-like background: a colour gradient, soft blobs, a few lines, grain; light enough for dark ink."""
        import numpy as np
        from PIL import Image, ImageDraw, ImageFilter

        rng = np.random.default_rng(self.rng.randrange(1 << 30))
        top = rng.integers(170, 250, 3)
        bottom = rng.integers(170, 250, 3)
        t = np.linspace(0.0, 1.0, height)[:, None, None]
        pixels = (top * (1 - t) + bottom * t) * np.ones((1, width, 1))
        image = Image.fromarray(pixels.astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(self.rng.randint(4, 9)):
            x, y = self.rng.randrange(width), self.rng.randrange(height)
            r = self.rng.randint(10, max(12, height // 2))
            colour = tuple(self.rng.randint(150, 240) for _ in range(3))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        image = image.filter(ImageFilter.GaussianBlur(6))
        draw = ImageDraw.Draw(image)
        for _ in range(self.rng.randint(2, 5)):
            colour = tuple(self.rng.randint(120, 200) for _ in range(3))
            ends = (self.rng.randrange(width), 0, self.rng.randrange(width), height)
            draw.line(ends, fill=colour, width=self.rng.randint(1, 3))
        grain = rng.normal(0.0, 8.0, (height, width, 1))
        return Image.fromarray(np.clip(np.asarray(image, np.float32) + grain, 0, 255).astype(np.uint8), "RGB")

    def vertical(self, columns: Sequence[str], font_ref: tuple[str, int], size: int) -> Any:
        """CJK columns drawn top to bottom, the first column on the right (traditional vertical layout)."""
        from PIL import Image, ImageDraw, ImageFont

        font = ImageFont.truetype(font_ref[0], size, index=font_ref[1])
        pitch = int(size * self.rng.uniform(1.05, 1.25))
        gap = int(size * self.rng.uniform(0.8, 1.4))
        margin = max(14, size)
        height = max(len(c) for c in columns) * pitch + 2 * margin
        width = len(columns) * size + (len(columns) - 1) * gap + 2 * margin
        image = Image.new("RGB", (width, height), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        for i, column in enumerate(columns):
            x = width - margin - size - i * (size + gap)
            for j, ch in enumerate(column):
                draw.text((x, margin + j * pitch), ch, font=font, fill=(20, 20, 20))
        return image

    def ui(self, words: list[str]) -> tuple[Any, list[str], tuple[str, int], int]:
        """A settings/order screen: a coloured title bar, label-value rows in small grey text, a button."""
        from PIL import Image, ImageDraw, ImageFont

        font_ref = self.rng.choice(self.cjk_fonts)
        size = self.rng.randint(13, 18)
        title_size = size + 6
        font = ImageFont.truetype(font_ref[0], size, index=font_ref[1])
        title_font = ImageFont.truetype(font_ref[0], title_size, index=font_ref[1])
        rows = [f"{label}: {value}" for label, value in self.rng.sample(UI_LABELS, self.rng.randint(2, 4))]
        if self.rng.random() < 0.5:
            rows.append(self.any_line(words))
        title, button = self.rng.choice(UI_TITLES), self.rng.choice(UI_BUTTONS)
        width = max(360, max(int(font.getlength(r)) for r in rows) + 60)
        row_h = int(size * 2.4)
        height = title_size * 3 + row_h * len(rows) + size * 5
        image = Image.new("RGB", (width, height), (248, 248, 250))
        draw = ImageDraw.Draw(image)
        bar = self.rng.choice(((33, 110, 230), (20, 140, 90), (60, 60, 70), (220, 80, 40)))
        draw.rectangle((0, 0, width, title_size * 2 + 8), fill=bar)
        draw.text((24, title_size // 2 + 4), title, font=title_font, fill=(255, 255, 255))
        y = title_size * 3
        for row in rows:
            draw.text((24, y), row, font=font, fill=(self.rng.choice((60, 80, 100)),) * 3)
            draw.line((16, y + row_h - 8, width - 16, y + row_h - 8), fill=(225, 225, 230))
            y += row_h
        bw = int(font.getlength(button)) + 48
        draw.rounded_rectangle((24, y + size, 24 + bw, y + size * 3 + 6), radius=8, fill=bar)
        draw.text((48, y + size + size // 2 + 2), button, font=font, fill=(255, 255, 255))
        return image, [title, *rows, button], font_ref, size

    # --- one case --------------------------------------------------------------------------------------
    def lines_for(self, condition: str, words: list[str]) -> list[str]:
        rng = self.rng
        if condition == "paragraph":
            return [self.any_line(words) for _ in range(rng.randint(4, 6))]
        if condition.startswith("page_"):
            return [self.any_line(words) for _ in range(rng.randint(2, 3))]
        if condition == "mixed":
            return [rng.choice(MIXED)] + ([self.any_line(words)] if rng.random() < 0.5 else [])
        if condition == "latin":
            return [self.english(words) for _ in range(rng.randint(1, 3))]
        if condition.startswith("line_"):
            return [self.any_line(words)]
        return [self.any_line(words) for _ in range(rng.randint(1, 2))]

    def degrade(self, image: Any, condition: str, index: int, size: int, bg: tuple[int, int, int]) -> Any:
        """The condition applied to a drawn image: rotation, blur or noise (JPEG is applied when encoding)."""
        from PIL import Image, ImageFilter

        rng = self.rng
        if condition == "rotate_10":
            angle = rng.choice((-1, 1)) * rng.uniform(3.0, 10.0)
            return image.rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor=bg)
        if condition.startswith(("page_", "line_")):
            return image.rotate(-int(condition.split("_")[1]), expand=True)  # clockwise
        if condition == "blur":
            return image.filter(ImageFilter.GaussianBlur(rng.uniform(1.2, 2.4) * max(1.0, size / 28)))
        if condition == "noise":
            import numpy as np

            grain = np.random.default_rng(index).normal(0, rng.uniform(30, 45), (*image.size[::-1], 3))
            return Image.fromarray(np.clip(np.asarray(image, np.float32) + grain, 0, 255).astype(np.uint8), "RGB")
        return image

    def case(self, condition: str, index: int) -> OcrCase:
        rng = self.rng
        words: list[str] = []
        size = rng.randint(18, 40)
        if condition == "ui":
            image, lines, font_ref, size = self.ui(words)
        elif condition == "vertical":
            columns = [self.chinese(words) for _ in range(rng.randint(1, 3))]
            columns = [c[: rng.randint(4, 10)] if not any(w in c for w in words) else c for c in columns]
            font_ref = rng.choice(self.cjk_fonts)
            size = rng.randint(20, 40)
            image, lines = self.vertical(columns, font_ref, size), columns
        else:
            lines = self.lines_for(condition, words)
            size = {"small": rng.randint(12, 15), "large": rng.randint(40, 48), "jpeg_30": rng.randint(14, 24)}.get(
                condition, size
            )
            font_ref = self.font(lines)
            bg, ink = (255, 255, 255), (20, 20, 20)
            if condition == "low_contrast":
                level = rng.randint(185, 225)
                bg = (level, level, level - rng.randint(0, 10))
                ink = (level - rng.randint(30, 50),) * 3
            elif rng.random() < 0.3 and condition != "textured":
                bg = (rng.randint(235, 255), rng.randint(235, 255), rng.randint(235, 255))
            image = self.draw(lines, font_ref, size, bg, ink, self.textured if condition == "textured" else None)
            image = self.degrade(image, condition, index, size, bg)
        fmt = "JPEG" if condition == "jpeg_30" else "PNG"
        out = io.BytesIO()
        image.save(out, format=fmt, **({"quality": 30} if fmt == "JPEG" else {}))
        return OcrCase(
            f"{condition}-{index:02d}",
            condition,
            tuple(lines),
            tuple(words),
            out.getvalue(),
            fmt,
            Path(font_ref[0]).name,
            size,
        )


def generate(per_condition: int = 10, seed: int = 18, conditions: Sequence[str] = CONDITIONS) -> list[OcrCase]:
    """`per_condition` images of each condition (20 conditions: 200 images by default), the same for one seed.

    Each condition draws from its own random stream (seeded by the seed and the condition's name), so a subset of
    conditions or a smaller `per_condition` gives the first images of the full set, not others."""
    cases: list[OcrCase] = []
    for condition in conditions:
        if condition not in CONDITIONS:
            raise ValueError(f"unknown condition {condition!r}")
        maker = _Maker(seed * 1_000 + CONDITIONS.index(condition))
        cases += [maker.case(condition, i) for i in range(per_condition)]
    return cases


def write(cases: Sequence[OcrCase], out: Path) -> Path:
    """The images and manifest.json in `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (out / f"{case.name}.{'jpg' if case.format == 'JPEG' else 'png'}").write_bytes(case.data)
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps([c.manifest() for c in cases], ensure_ascii=False, indent=1), encoding="utf-8")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-condition", type=int, default=10)
    parser.add_argument("--seed", type=int, default=18)
    args = parser.parse_args()
    cases = generate(args.per_condition, args.seed)
    print(f"{len(cases)} images -> {write(cases, args.out)}")


if __name__ == "__main__":
    main()
