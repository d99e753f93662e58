"""Reading detected text lines whatever way they face: upright, upside down, turned 90° either way, or written
vertically (CJK characters stacked top to bottom), for any engine.

`read_lines(image, quads, recognise, classify)` crops each detected quadrilateral upright as it lies in the image
(`crop_quad`, no rotation), then builds its *candidates* — the crop turned so that a line in that orientation reads
left to right — and recognises them all in one batch, keeping per line the candidate the recogniser is most
confident of:

- a wide crop (height < TALL x width) is upright or upside down: the text-line orientation classifier (PP-OCR's
  0°/180° line classifier, `classify`) decides; when it is unsure (score under CLS_SURE) both are read;
- a tall crop (height >= TALL x width) is a line turned 90° or 270° — the classifier, run on it turned back by 90°,
  tells which (both when unsure) — or a vertical CJK column: its characters are cut apart at the blank rows between
  them and laid side by side (`stack_vertical`), and that row is read too;
- a crop close to square (a short word) gets the candidates of both kinds, and leans to the page's orientation;
- a line whose best reading is still poor (under RETRY_BELOW) is read the other way up too: the classifier can be
  sure and wrong, on a blurred line for one.

The page's orientation (document orientation) is the vote of its lines, weighted by their length. It breaks near
ties for short lines and gives the reading order: boxes are sorted top to bottom and left to right in the page
turned upright, and vertical columns right to left (`reading_order`). Classifier and recogniser are callables, so
the PaddlePaddle and the onnxruntime engines share all of this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: a crop this many times taller than wide is a turned line or a vertical column
TALL = 1.5
#: a crop between 1/SQUARE and SQUARE (height / width) may be a short word in any orientation
SQUARE = 1.25
#: the classifier's score from which its word is taken without reading both ways
CLS_SURE = 0.9
#: a line whose best reading is less confident than this is read the other way up as well
RETRY_BELOW = 0.8
#: what the page's orientation adds to a near-square line's candidate that agrees with it
PAGE_BONUS = 0.05
#: how much more confident the stacked reading of a tall crop must be than its best turned reading: a recogniser
#: that reads sideways characters (PP-OCRv6 does) reads a line turned 270° stacked as well — backwards — while a
#: vertical column it cannot read turned (PP-OCRv4) gives a clearly worse turned reading
VERTICAL_MARGIN = 0.1

Recognise = Callable[[list[Any]], list[tuple[str, float]]]
Classify = Callable[[list[Any]], list[tuple[int, float]]]

#: orientations: the clockwise turn of the text in the image, or VERTICAL for a stacked column
VERTICAL = -1
ORIENTATIONS = (0, 90, 180, 270, VERTICAL)


@dataclass(frozen=True, slots=True)
class ReadLine:
    """One detected line read: its text, confidence, the orientation it was read in, its quad (image pixels)."""

    text: str
    confidence: float
    orientation: int
    quad: Any


def orientation_name(orientation: int) -> str:
    return "vertical" if orientation == VERTICAL else str(orientation)


def crop_quad(image: Any, quad: Any) -> Any:
    """The quadrilateral (4 x 2 points, clockwise from the top left) cut out and straightened as it lies."""
    import cv2
    import numpy as np

    points = np.asarray(quad, dtype=np.float32).reshape(4, 2)
    width = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    height = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    width, height = max(width, 1), max(height, 1)
    target = np.float32([[0, 0], [width, 0], [width, height], [0, height]])
    matrix = cv2.getPerspectiveTransform(points, target)
    return cv2.warpPerspective(image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)


def turn(crop: Any, orientation: int) -> Any:
    """The crop of a line whose text is turned `orientation` degrees clockwise, turned back to read left to right."""
    import cv2

    if orientation == 90:
        return cv2.rotate(crop, cv2.ROTATE_90_COUNTERCLOCKWISE)
    if orientation == 180:
        return cv2.rotate(crop, cv2.ROTATE_180)
    if orientation == 270:
        return cv2.rotate(crop, cv2.ROTATE_90_CLOCKWISE)
    return crop


def stack_vertical(crop: Any) -> Any | None:
    """A vertical column's characters cut apart at the blank rows between them and laid side by side, upright;
    None when the crop does not split into at least two characters."""
    import cv2
    import numpy as np

    height, width = crop.shape[:2]
    gray = cv2.cvtColor(crop, cv2.COLOR_BGR2GRAY) if crop.ndim == 3 else crop
    _, ink = cv2.threshold(gray, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    if ink.mean() > 0.5:  # ink is the smaller part
        ink = 1 - ink
    columns = np.flatnonzero(ink.sum(axis=0) > max(1, height // 50))
    if columns.size == 0:
        return None
    size = max(int(columns[-1] - columns[0] + 1), width // 2, 4)
    rows = ink.sum(axis=1) > max(1, size // 25)
    runs: list[tuple[int, int]] = []
    start = -1
    for y, on in enumerate([*rows.tolist(), False]):
        if on and start < 0:
            start = y
        elif not on and start >= 0:
            runs.append((start, y))
            start = -1
    if not runs:
        return None
    # runs closer together than a character's size belong to one character (e.g. the strokes of 二 or 三)
    characters: list[tuple[int, int]] = [runs[0]]
    for begin, end in runs[1:]:
        first, _ = characters[-1]
        if end - first <= size * 1.15:
            characters[-1] = (first, end)
        else:
            characters.append((begin, end))
    if len(characters) < 2:
        return None
    border = np.concatenate([crop[0], crop[-1], crop[:, 0], crop[:, -1]])
    background = np.median(border.reshape(-1, crop.shape[2] if crop.ndim == 3 else 1), axis=0).astype(crop.dtype)
    cell_h = max(e - b for b, e in characters) + max(2, size // 6)
    gap = max(2, size // 6)
    pieces = []
    for begin, end in characters:
        cell = np.empty((cell_h, width, *crop.shape[2:]), dtype=crop.dtype)
        cell[:] = background
        top = (cell_h - (end - begin)) // 2
        cell[top : top + end - begin] = crop[begin:end]
        pieces.append(cell)
        spacer = np.empty((cell_h, gap, *crop.shape[2:]), dtype=crop.dtype)
        spacer[:] = background
        pieces.append(spacer)
    return np.concatenate(pieces[:-1], axis=1)


@dataclass(slots=True)
class _Candidate:
    line: int
    orientation: int
    image: Any
    text: str = ""
    score: float = 0.0


def _classified(classify: Classify | None, crops: list[Any]) -> list[tuple[int, float]]:
    if classify is None or not crops:
        return [(0, 0.0)] * len(crops)
    return classify(crops)


def read_lines(
    image: Any, quads: Sequence[Any], recognise: Recognise, classify: Classify | None = None, *, orient: bool = True
) -> list[ReadLine]:
    """Each quad's line read in its best orientation (see the module docstring), in reading order.

    `recognise(crops)` gives (text, confidence) per crop; `classify(crops)` gives (0 or 180, score) per crop. With
    `orient` off (or no classifier) wide lines are read as they are, tall ones turned by 90° and stacked."""
    crops = [crop_quad(image, quad) for quad in quads]
    ratios = [crop.shape[0] / max(1, crop.shape[1]) for crop in crops]
    square = {i for i, r in enumerate(ratios) if 1 / SQUARE <= r < TALL}
    wide = [i for i, r in enumerate(ratios) if r < TALL]
    tall = [i for i, r in enumerate(ratios) if r >= TALL or (orient and i in square)]
    candidates = _wide_candidates(crops, wide, classify, orient)
    candidates += _tall_candidates(crops, tall, square, classify, orient)
    if not candidates:
        return []
    _read(candidates, recognise)
    by_line: dict[int, list[_Candidate]] = {}
    for candidate in candidates:
        by_line.setdefault(candidate.line, []).append(candidate)
    if orient:
        # the classifier can be sure and wrong (a blurred line): a line read poorly is read the other way up too
        again = [
            _Candidate(i, (best.orientation + 180) % 360, turn(best.image, 180))
            for i, own in by_line.items()
            for best in [max(own, key=lambda c: c.score)]
            if best.score < RETRY_BELOW
            and best.orientation != VERTICAL
            and all(c.orientation != (best.orientation + 180) % 360 for c in own)
        ]
        _read(again, recognise)
        for candidate in again:
            by_line[candidate.line].append(candidate)
    chosen = {i: _best(own, None, i in square) for i, own in by_line.items()}
    page = page_orientation([(c.orientation, _length(crops[i])) for i, c in chosen.items() if i not in square])
    for i in square:
        chosen[i] = _best(by_line[i], page, True)
    lines = [ReadLine(c.text, c.score, c.orientation, quads[i]) for i, c in sorted(chosen.items())]
    return reading_order(lines, image.shape[1], image.shape[0], page)


def _read(candidates: list[_Candidate], recognise: Recognise) -> None:
    if candidates:
        for candidate, (text, score) in zip(candidates, recognise([c.image for c in candidates]), strict=True):
            candidate.text, candidate.score = text, score if text.strip() else 0.0


def _wide_candidates(crops: list[Any], wide: list[int], classify: Classify | None, orient: bool) -> list[_Candidate]:
    """Upright or upside down: the classifier's word when it is sure, else both."""
    if not orient:
        return [_Candidate(i, 0, crops[i]) for i in wide]
    out: list[_Candidate] = []
    for i, (label, score) in zip(wide, _classified(classify, [crops[i] for i in wide]), strict=True):
        if classify is None or score < CLS_SURE:
            out += [_Candidate(i, 0, crops[i]), _Candidate(i, 180, turn(crops[i], 180))]
        else:
            out.append(_Candidate(i, label, turn(crops[i], label)))
    return out


def _tall_candidates(
    crops: list[Any], tall: list[int], square: set[int], classify: Classify | None, orient: bool
) -> list[_Candidate]:
    """Turned by 90 or 270 (the classifier decides on the crop turned back by 90, both when unsure), and stacked."""
    out: list[_Candidate] = []
    turned = [turn(crops[i], 90) for i in tall]
    for i, upright, (label, score) in zip(tall, turned, _classified(classify if orient else None, turned), strict=True):
        if not orient:
            out.append(_Candidate(i, 90, upright))
        elif classify is None or score < CLS_SURE:
            out += [_Candidate(i, 90, upright), _Candidate(i, 270, turn(crops[i], 270))]
        elif label == 180:
            out.append(_Candidate(i, 270, turn(crops[i], 270)))
        else:
            out.append(_Candidate(i, 90, upright))
        stacked = stack_vertical(crops[i]) if i not in square else None
        if stacked is not None:
            out.append(_Candidate(i, VERTICAL, stacked))
    return out


def _best(own: list[_Candidate], page: int | None, square: bool) -> _Candidate:
    """The most confident turned reading (near-square lines lean to the page's orientation); the stacked reading
    only when clearly better (VERTICAL_MARGIN)."""
    bonus = PAGE_BONUS if square else 0.0
    turned = [c for c in own if c.orientation != VERTICAL]
    stacked = [c for c in own if c.orientation == VERTICAL]
    if not turned:
        return stacked[0]
    top = max(turned, key=lambda c: c.score + (bonus if c.orientation == page else 0.0))
    if stacked and stacked[0].score > top.score + VERTICAL_MARGIN:
        return stacked[0]
    return top


def tall_share(quads: Sequence[Any]) -> float:
    """The share of tall boxes (at least TALL times taller than wide) among those that are clearly tall or wide
    (near-square ones say nothing); 0 without such boxes. Most of them tall is a page turned by 90 degrees, or
    vertical text."""
    import numpy as np

    tall = shaped = 0
    for quad in quads:
        p = np.asarray(quad, dtype=np.float32).reshape(4, 2)
        width = max(float(np.linalg.norm(p[0] - p[1])), float(np.linalg.norm(p[2] - p[3])), 1.0)
        height = max(float(np.linalg.norm(p[0] - p[3])), float(np.linalg.norm(p[1] - p[2])), 1.0)
        if height >= TALL * width:
            tall += 1
        if height >= TALL * width or height < width / SQUARE:
            shaped += 1
    return tall / shaped if shaped else 0.0


def _length(crop: Any) -> int:
    return int(max(crop.shape[0], crop.shape[1]))


def page_orientation(votes: Sequence[tuple[int, int]]) -> int:
    """The orientation most of a page's text has (votes: orientation, weight); 0 without votes."""
    tally: dict[int, int] = {}
    for orientation, weight in votes:
        tally[orientation] = tally.get(orientation, 0) + weight
    return max(tally, key=lambda o: (tally[o], o == 0)) if tally else 0


def _upright(x: float, y: float, width: int, height: int, page: int) -> tuple[float, float]:
    """Where a point of the image lies once the page is turned upright."""
    if page == 90:
        return y, width - x
    if page == 180:
        return width - x, height - y
    if page == 270:
        return height - y, x
    return x, y


def reading_order(lines: Sequence[ReadLine], width: int, height: int, page: int) -> list[ReadLine]:
    """Lines sorted top to bottom then left to right in the page turned upright (lines whose tops lie within
    half a line height of each other count as one row); vertical columns right to left, then top to bottom."""

    def extent(line: ReadLine) -> tuple[float, float, float, float]:
        points = [_upright(float(x), float(y), width, height, page) for x, y in line.quad]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        return min(xs), min(ys), max(xs), max(ys)

    boxes = {id(line): extent(line) for line in lines}
    if page == VERTICAL:
        return sorted(lines, key=lambda line: (-boxes[id(line)][2], boxes[id(line)][1]))
    ordered = sorted(lines, key=lambda line: (boxes[id(line)][1], boxes[id(line)][0]))
    rows: list[list[ReadLine]] = []
    for line in ordered:
        _, y0, _, y1 = boxes[id(line)]
        if rows:
            head = boxes[id(rows[-1][0])]
            if abs(y0 - head[1]) < 0.5 * min(y1 - y0, head[3] - head[1]):
                rows[-1].append(line)
                continue
        rows.append([line])
    return [line for row in rows for line in sorted(row, key=lambda line: boxes[id(line)][0])]
