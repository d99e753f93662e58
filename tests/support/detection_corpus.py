"""The detection evaluation corpus (tests/data/detection/, written by its generate.py): loading it and scoring a
matcher on it, per evasion kind (recall on the positives) and per style (false-positive rate on the negatives)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "detection"


@dataclass(frozen=True, slots=True)
class Case:
    kind: str  # the evasion kind (positives) or the style (negatives)
    word: str  # the lexicon word expected ("" for a negative)
    text: str


def _rows(name: str) -> list[list[str]]:
    lines = (DATA / name).read_text("utf-8").splitlines()
    rows = [line.split("\t") for line in lines if line and not line.startswith("#")]
    return rows[1:]  # the header


def positives() -> list[Case]:
    return [Case(kind, word, text) for kind, word, text in _rows("positives.tsv")]


def negatives() -> list[Case]:
    return [Case(style, "", text) for style, text in _rows("negatives.tsv")]


@dataclass
class Score:
    """Per kind: cases and how many were caught (positives) or flagged (negatives); what went wrong, for
    messages."""

    cases: dict[str, int] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    wrong: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def add(self, kind: str, hit: bool) -> None:
        self.cases[kind] = self.cases.get(kind, 0) + 1
        self.hits[kind] = self.hits.get(kind, 0) + int(hit)

    def rate(self, kind: str | None = None) -> float:
        cases = sum(self.cases.values()) if kind is None else self.cases.get(kind, 0)
        hits = sum(self.hits.values()) if kind is None else self.hits.get(kind, 0)
        return hits / cases if cases else 0.0

    @property
    def total(self) -> int:
        return sum(self.cases.values())


Match = Callable[[str], Iterable[str]]  # a text -> the lexicon words hit in it


def score_positives(match: Match, cases: list[Case]) -> Score:
    """Recall: a positive is caught when its expected word is among the hits."""
    score = Score()
    for case in cases:
        words = list(match(case.text))
        caught = case.word in words
        score.add(case.kind, caught)
        if not caught:
            score.wrong.append((case.kind, case.text, words))
    return score


def score_negatives(match: Match, cases: list[Case]) -> Score:
    """False positives: a negative is flagged when anything hits."""
    score = Score()
    for case in cases:
        words = list(match(case.text))
        score.add(case.kind, bool(words))
        if words:
            score.wrong.append((case.kind, case.text, words))
    return score


def table(recall: Score, false_positives: Score) -> str:
    """Recall per evasion kind and false-positive rate per negative style, as a plain-text table."""
    lines = [f"{'kind':<12} {'cases':>5} {'recall':>7}"]
    for kind in recall.cases:
        lines.append(f"{kind:<12} {recall.cases[kind]:>5} {recall.rate(kind):>7.3f}")
    lines.append(f"{'ALL':<12} {recall.total:>5} {recall.rate():>7.3f}")
    lines.append("")
    lines.append(f"{'negatives':<12} {'cases':>5} {'FPR':>7}")
    for kind in false_positives.cases:
        lines.append(f"{kind:<12} {false_positives.cases[kind]:>5} {false_positives.rate(kind):>7.4f}")
    lines.append(f"{'ALL':<12} {false_positives.total:>5} {false_positives.rate():>7.4f}")
    return "\n".join(lines)
