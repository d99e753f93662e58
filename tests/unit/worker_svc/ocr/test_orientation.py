"""Unit tests of the orientation step (worker_svc/ocr/orientation.py) that need no model: crops and turns, the
vertical column laid out as a row, the page's orientation vote, reading order in a turned page, and which reading
of a line wins. The engines' own reading of turned and vertical text is tested in
tests/integration/worker_svc/test_ocr_quality.py."""

from __future__ import annotations

from typing import Any

import pytest

from worker_svc.ocr.orientation import (
    VERTICAL,
    ReadLine,
    crop_quad,
    page_orientation,
    read_lines,
    reading_order,
    stack_vertical,
    tall_share,
    turn,
)

try:  # imported here, skipped per test: a module that skips while imported fails .ci/run's first unit stage
    import numpy as np
except ImportError:  # pragma: no cover - the dev extra alone
    np = None

pytestmark = pytest.mark.ocr_extra


@pytest.fixture(autouse=True)
def _ocr_extra() -> None:
    pytest.importorskip("numpy")
    pytest.importorskip("cv2")


def marked(height: int = 20, width: int = 60) -> Any:
    """A white image with a black mark in its top left corner (shows which way it was turned)."""
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    image[:4, :4] = 0
    return image


def test_turning_a_line_back_puts_its_top_left_corner_top_left() -> None:
    line = marked()
    # the line turned 90 degrees clockwise in an image: its top left corner is now top right
    in_image = np.rot90(line, k=-1)
    assert in_image[:4, -4:].max() == 0
    upright = turn(in_image, 90)
    assert upright.shape == line.shape and upright[:4, :4].max() == 0
    assert turn(np.rot90(line, k=1), 270)[:4, :4].max() == 0
    assert turn(np.rot90(line, k=2), 180)[:4, :4].max() == 0
    assert turn(line, 0) is line


def test_a_quad_is_cut_out_straight_as_it_lies() -> None:
    image = np.full((100, 200, 3), 255, dtype=np.uint8)
    image[30:50, 40:160] = 0
    crop = crop_quad(image, [(40, 30), (160, 30), (160, 50), (40, 50)])
    assert crop.shape[:2] == (20, 120) and crop.mean() < 10
    tall = crop_quad(image, [(40, 10), (60, 10), (60, 90), (40, 90)])
    assert tall.shape[:2] == (80, 20)  # not turned: orientation decides that


def column(characters: int, size: int = 24, gap: int = 8) -> Any:
    """A vertical column of `characters` square blobs (each with a blank row inside, like 二)."""
    height = characters * (size + gap) + gap
    image = np.full((height, size + 8, 3), 255, dtype=np.uint8)
    for i in range(characters):
        top = gap + i * (size + gap)
        image[top : top + size // 3, 4 : 4 + size] = 0
        image[top + size // 2 : top + size, 4 : 4 + size] = 0
    return image


def test_a_vertical_column_is_laid_out_as_a_row_of_its_characters() -> None:
    stacked = stack_vertical(column(5))
    assert stacked is not None
    height, width = stacked.shape[:2]
    assert width > 4 * height  # five characters side by side
    ink_columns = (stacked.min(axis=(0, 2)) < 128).astype(int)
    assert int(np.sum(np.diff(ink_columns) == 1)) + int(ink_columns[0]) == 5  # five separate blobs
    assert stack_vertical(column(1)) is None  # one character: nothing to lay out
    assert stack_vertical(np.full((90, 30, 3), 255, dtype=np.uint8)) is None  # blank


def test_the_page_orientation_is_the_weighted_vote_of_its_lines() -> None:
    assert page_orientation([(90, 300), (0, 40), (90, 200)]) == 90
    assert page_orientation([(180, 100), (0, 100)]) == 0  # a tie goes to upright
    assert page_orientation([]) == 0


def line(text: str, box: tuple[int, int, int, int], orientation: int = 0) -> ReadLine:
    x0, y0, x1, y1 = box
    return ReadLine(text, 0.99, orientation, [(x0, y0), (x1, y0), (x1, y1), (x0, y1)])


def test_reading_order_follows_the_page_turned_upright() -> None:
    # a page 300 x 200 with two lines, upright: top line first; words on one row left to right
    upright = [
        line("second", (10, 100, 200, 130)),
        line("first-b", (120, 20, 250, 50)),
        line("first-a", (10, 22, 100, 50)),
    ]
    assert [r.text for r in reading_order(upright, 300, 200, 0)] == ["first-a", "first-b", "second"]
    # the same page turned 180 degrees: the line at the bottom is the first
    turned = [line("first", (10, 150, 290, 180)), line("second", (10, 70, 290, 100))]
    assert [r.text for r in reading_order(turned, 300, 200, 180)] == ["first", "second"]
    # turned 90 degrees clockwise (200 wide x 300 tall): the rightmost column is the first line
    cw = [line("second", (40, 10, 70, 290)), line("first", (120, 10, 150, 290))]
    assert [r.text for r in reading_order(cw, 200, 300, 90)] == ["first", "second"]
    # turned 270: the leftmost column is the first line
    assert [r.text for r in reading_order(cw, 200, 300, 270)] == ["second", "first"]
    # vertical columns: right to left
    assert [r.text for r in reading_order(cw, 200, 300, VERTICAL)] == ["first", "second"]


class Reader:
    """A recogniser for these tests: reads a crop whose marked corner is top left (upright) with confidence 0.99,
    any other crop with 0.3 — like a real one on a line read the wrong way up — and counts what it was given."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, crops: list[Any]) -> list[tuple[str, float]]:
        self.seen += len(crops)
        return [("upright", 0.99) if c[:4, :4].max() == 0 else ("garbled", 0.3) for c in crops] if crops else []


def classify_by_mark(crops: list[Any]) -> list[tuple[int, float]]:
    """A sure 0/180 classifier for the marked test lines."""
    return [(0, 0.99) if c[:4, :4].max() == 0 else (180, 0.99) for c in crops]


@pytest.mark.parametrize("turned", [0, 90, 180, 270])
def test_each_line_is_read_the_way_up_that_reads_best(turned: int) -> None:
    line_image = marked(24, 120)
    image = np.ascontiguousarray(np.rot90(line_image, k=-turned // 90))
    h, w = image.shape[:2]
    quad = [(0, 0), (w, 0), (w, h), (0, h)]
    reader = Reader()
    (read,) = read_lines(image, [quad], reader, classify_by_mark)
    assert (read.text, read.orientation) == ("upright", turned)
    # a sure classifier: one reading per line (plus the stacked layout for a tall crop)
    assert reader.seen <= 2
    # without a classifier both ways up are read, and the better one still wins
    (read,) = read_lines(image, [quad], Reader(), None)
    assert (read.text, read.orientation) == ("upright", turned)


def test_orientation_off_reads_wide_lines_as_they_lie() -> None:
    image = np.ascontiguousarray(np.rot90(marked(24, 120), k=2))
    h, w = image.shape[:2]
    (read,) = read_lines(image, [[(0, 0), (w, 0), (w, h), (0, h)]], Reader(), classify_by_mark, orient=False)
    assert (read.text, read.orientation) == ("garbled", 0)


def test_a_line_the_classifier_turns_the_wrong_way_is_read_the_other_way_up_too() -> None:
    image = marked(24, 120)
    quad = [(0, 0), (120, 0), (120, 24), (0, 24)]
    reader = Reader()
    (read,) = read_lines(image, [quad], reader, lambda crops: [(180, 0.99)] * len(crops))  # sure, and wrong
    assert (read.text, read.orientation) == ("upright", 0)
    assert reader.seen == 2  # the classifier's reading, poor, then the other way up


def test_a_page_is_taken_for_turned_when_most_of_its_shaped_boxes_are_tall() -> None:
    def box(w: int, h: int) -> list[tuple[int, int]]:
        return [(0, 0), (w, 0), (w, h), (0, h)]

    assert tall_share([box(20, 200), box(20, 150), box(30, 30), box(200, 20)]) == pytest.approx(2 / 3)
    assert tall_share([box(200, 20), box(30, 32)]) == 0.0
    assert tall_share([box(30, 30)]) == 0.0 and tall_share([]) == 0.0
