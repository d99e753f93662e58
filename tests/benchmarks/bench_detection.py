"""Text detection quality and speed on the evaluation corpus (tests/data/detection/), default lexicon, all rules on:

    .venv/bin/python -m tests.benchmarks.bench_detection [--repeats 15] [--misses]

(a) recall on the positives per evasion kind (target >= 0.95 overall) and the false-positive rate on the
    negatives per style (target <= 0.5 %), printed as a table;
(b) matching speed: microseconds per text over the whole corpus (positives and negatives), the matcher of today
    against the matcher as it was before the disguise rules (issue 18: normalise, one Aho-Corasick automaton of
    the plain words, no boundaries; reproduced here, `_plain_match`, so that both are timed in one process),
    alternated `repeats` times: the median of the rounds' ratios (target: within 2 x), and the median times per
    text, in CPU time of this process (a shared machine's other load counts less). Ordinary text (the negatives)
    is shown apart.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import ahocorasick

from tests.benchmarks.report import Row
from tests.support import detection_corpus as corpus
from worker_svc.text import LexiconEntry, Matcher, MatchResult, Verdict, load_lexicon_file, normalize, normalize_word

RECALL_TARGET = 0.95
FPR_TARGET = 0.005
SPEED_TARGET = 2.0


@dataclass(frozen=True, slots=True)
class _PlainHit:
    """The hit of before the rules (six fields)."""

    word: str
    category: str
    severity: int
    start: int
    end: int
    matched_text: str


def _plain_order(hit: _PlainHit) -> tuple[int, int, str]:
    return hit.start, hit.start - hit.end, hit.word


class PlainMatcher:
    """The matcher as it was before the disguise rules (``worker_svc.text.matcher.Matcher`` at the commit before
    issue 18, its ``__init__`` and ``match`` as they were): the normalised text through one automaton of the plain
    words, each hit mapped back to its original span once, sorted, and the verdict."""

    def __init__(self, entries: list[LexiconEntry], block_severity: int = 3) -> None:
        chosen: dict[str, LexiconEntry] = {}
        for entry in entries:
            key = normalize_word(entry.word)
            previous = chosen.get(key)
            if previous is None or entry.severity > previous.severity:
                chosen[key] = entry
        self._block_severity = block_severity
        automaton = ahocorasick.Automaton(ahocorasick.STORE_ANY)
        for key, entry in chosen.items():
            automaton.add_word(key, (len(key), entry))
        automaton.make_automaton()
        self._automaton = automaton

    def match(self, text: str) -> tuple[list[_PlainHit], MatchResult]:
        normalized = normalize(text)
        if self._automaton is None or not normalized.text:
            return [], MatchResult((), Verdict.PASS, normalized.text)
        offsets = normalized.offsets
        ends = normalized.ends
        hits: list[_PlainHit] = []
        seen: set[tuple[str, int, int]] = set()
        for last, (length, entry) in self._automaton.iter(normalized.text):
            start = offsets[last - length + 1]
            end = ends[last]
            key = (entry.word, start, end)
            if key in seen:
                continue
            seen.add(key)
            hits.append(_PlainHit(entry.word, entry.category, entry.severity, start, end, text[start:end]))
        hits.sort(key=_plain_order)
        # the result as it was made (its hits were these six-field ones; the tuple is left empty here)
        return hits, MatchResult((), self._verdict(hits), normalized.text)

    def _verdict(self, hits: list[_PlainHit]) -> Verdict:
        if not hits:
            return Verdict.PASS
        if max(hit.severity for hit in hits) >= self._block_severity:
            return Verdict.BLOCK
        return Verdict.REVIEW


def _plain_match(entries: list[LexiconEntry]) -> Callable[[str], tuple[list[_PlainHit], MatchResult]]:
    return PlainMatcher(entries).match


@dataclass
class DetectionResult:
    recall: corpus.Score
    false_positives: corpus.Score
    plain_recall: corpus.Score
    plain_false_positives: corpus.Score
    us_now: float  # per text, the whole corpus
    us_before: float
    us_now_ordinary: float  # per text, the negatives
    us_before_ordinary: float
    repeats: int
    ratio: float  # the median of the rounds' now / before


def _us(match: Callable[[str], object], texts: list[str]) -> float:
    began = time.process_time()
    for text in texts:
        match(text)
    return (time.process_time() - began) / len(texts) * 1e6


def measure(repeats: int) -> DetectionResult:
    entries = load_lexicon_file()
    matcher = Matcher(entries)
    plain = _plain_match(entries)

    def now(text: str) -> list[str]:
        return [hit.word for hit in matcher.match(text).hits]

    def before(text: str) -> list[str]:
        return [hit.word for hit in plain(text)[0]]

    positives, negatives = corpus.positives(), corpus.negatives()
    texts = [c.text for c in positives + negatives]
    ordinary = [c.text for c in negatives]
    for text in texts:  # warm the caches of both
        now(text)
        plain(text)
    rounds: dict[str, list[float]] = {"now": [], "before": [], "now_o": [], "before_o": []}
    for _ in range(max(1, repeats)):
        rounds["before"].append(_us(plain, texts))
        rounds["now"].append(_us(matcher.match, texts))
        rounds["before_o"].append(_us(plain, ordinary))
        rounds["now_o"].append(_us(matcher.match, ordinary))
    best = {name: statistics.median(values) for name, values in rounds.items()}
    ratios = [now / before for now, before in zip(rounds["now"], rounds["before"], strict=True)]
    return DetectionResult(
        corpus.score_positives(now, positives),
        corpus.score_negatives(now, negatives),
        corpus.score_positives(before, positives),
        corpus.score_negatives(before, negatives),
        best["now"],
        best["before"],
        best["now_o"],
        best["before_o"],
        repeats,
        statistics.median(ratios),
    )


def describe(r: DetectionResult) -> str:
    """The per-kind table, before (plain matching) and now, and the speed."""
    lines = [f"{'kind':<12} {'cases':>5} {'before':>7} {'now':>7}   (recall)"]
    for kind, cases in r.recall.cases.items():
        lines.append(f"{kind:<12} {cases:>5} {r.plain_recall.rate(kind):>7.3f} {r.recall.rate(kind):>7.3f}")
    lines.append(f"{'ALL':<12} {r.recall.total:>5} {r.plain_recall.rate():>7.3f} {r.recall.rate():>7.3f}")
    lines.append(f"{'negatives':<12} {'cases':>5} {'before':>7} {'now':>7}   (false-positive rate)")
    for kind, cases in r.false_positives.cases.items():
        lines.append(
            f"{kind:<12} {cases:>5} {r.plain_false_positives.rate(kind):>7.4f} {r.false_positives.rate(kind):>7.4f}"
        )
    lines.append(
        f"{'ALL':<12} {r.false_positives.total:>5} {r.plain_false_positives.rate():>7.4f} "
        f"{r.false_positives.rate():>7.4f}"
    )
    lines.append(
        f"speed, us per text (median of {r.repeats} alternated rounds): corpus {r.us_now:.1f} now / "
        f"{r.us_before:.1f} before, ratio {r.ratio:.2f} x; ordinary text {r.us_now_ordinary:.1f} / "
        f"{r.us_before_ordinary:.1f}"
    )
    return "\n".join(lines)


def rows(r: DetectionResult) -> list[Row]:
    recall, fpr = r.recall.rate(), r.false_positives.rate()
    per_kind = {f"recall_{kind}": round(r.recall.rate(kind), 3) for kind in r.recall.cases}
    return [
        Row(
            "detection",
            f"recall on {r.recall.total} disguised words ({len(r.recall.cases)} evasion kinds), default lexicon",
            f"{recall:.3f} (before the rules {r.plain_recall.rate():.3f})",
            f">= {RECALL_TARGET}",
            recall >= RECALL_TARGET,
            {"recall": round(recall, 4), "recall_before": round(r.plain_recall.rate(), 4), **per_kind},
        ),
        Row(
            "detection",
            f"false positives on {r.false_positives.total} ordinary Chinese and English sentences",
            f"{fpr:.2%} (before the rules {r.plain_false_positives.rate():.2%})",
            f"<= {FPR_TARGET:.1%}",
            fpr <= FPR_TARGET,
            {"fpr": round(fpr, 5), "fpr_before": round(r.plain_false_positives.rate(), 5)},
        ),
        Row(
            "detection",
            "matching speed over the corpus, now vs before the rules (one process, alternated)",
            f"{r.us_now:.1f} / {r.us_before:.1f} us per text, {r.ratio:.2f} x "
            f"(ordinary text {r.us_now_ordinary:.1f} / {r.us_before_ordinary:.1f})",
            f"<= {SPEED_TARGET:g} x",
            r.ratio <= SPEED_TARGET,
            {
                "us_per_text": round(r.us_now, 2),
                "us_per_text_before": round(r.us_before, 2),
                "ratio": round(r.ratio, 3),
                "us_per_ordinary_text": round(r.us_now_ordinary, 2),
                "us_per_ordinary_text_before": round(r.us_before_ordinary, 2),
            },
        ),
    ]


def main(args: argparse.Namespace) -> None:
    r = measure(args.repeats)
    print(describe(r))
    if args.misses:
        for kind, text, words in r.recall.wrong:
            print(f"missed   {kind:<11} {text!r} -> {words}")
        for kind, text, words in r.false_positives.wrong:
            print(f"flagged  {kind:<11} {text!r} -> {words}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds of each matcher, alternated")
    parser.add_argument("--misses", action="store_true", help="print every missed positive and flagged negative")
    main(parser.parse_args())
