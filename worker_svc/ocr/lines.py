"""The text of recognised lines as one string, and sensitive-word hits mapped back to the lines.

Lines are joined with "\\n" in reading order; that joined text is what is matched and stored as the
result's text, so a hit's `start`/`end` are offsets into it (as for a TEXT task). `locate` adds where
the hit is in the image's lines: `line` (index), `line_start` / `line_end` (code-point offsets in that
line's text, end exclusive) and `spans`, one {line, start, end} per line the hit covers — matching
ignores separators, so a word broken over two lines is still found, and then has two spans.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SEPARATOR = "\n"


@dataclass(frozen=True, slots=True)
class JoinedLines:
    """The joined text and where each line starts in it."""

    text: str
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def locate(self, start: int, end: int) -> dict[str, Any]:
        """Line positions of the joined-text range [start, end): line, line_start, line_end, spans."""
        spans: list[dict[str, int]] = []
        first = max(0, bisect_right(self.starts, start) - 1)
        for line in range(first, len(self.starts)):
            line_begin = self.starts[line]
            line_stop = line_begin + self.lengths[line]
            if line_begin >= end:
                break
            lo, hi = max(start, line_begin), min(end, line_stop)
            if lo < hi:
                spans.append({"line": line, "start": lo - line_begin, "end": hi - line_begin})
        if not spans:  # only separators (cannot happen for a lexicon word): point at the nearest line
            spans.append({"line": first, "start": 0, "end": 0})
        head = spans[0]
        return {"line": head["line"], "line_start": head["start"], "line_end": head["end"], "spans": spans}


def join_lines(texts: Sequence[str]) -> JoinedLines:
    starts: list[int] = []
    position = 0
    for text in texts:
        starts.append(position)
        position += len(text) + len(SEPARATOR)
    return JoinedLines(SEPARATOR.join(texts), tuple(starts), tuple(len(t) for t in texts))
