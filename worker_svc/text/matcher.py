"""Sensitive-word matching: a lexicon compiled once into an Aho-Corasick automaton.

This module owns the lexicon data types (``LexiconEntry``), the match results (``Hit``,
``MatchResult``, ``Verdict``) and ``Matcher``, which finds every lexicon word in a text in one pass
over its normalised form (see ``worker_svc.text.normalize``) and maps each hit back to a span of the
original text.

A ``Matcher`` is immutable once built and ``match`` only reads the automaton, so one instance can
be shared by all the tasks (and threads) of a worker.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import ahocorasick

from worker_svc.text.normalize import normalize, normalize_word

__all__ = ["Hit", "LexiconEntry", "MatchResult", "Matcher", "Verdict"]


@dataclass(frozen=True, slots=True)
class LexiconEntry:
    """One lexicon word with its category and severity (higher is worse)."""

    word: str
    category: str
    severity: int


@dataclass(frozen=True, slots=True)
class Hit:
    """One occurrence of a lexicon word.

    ``word``, ``category`` and ``severity`` are those of the lexicon entry, ``word`` as stored in the
    lexicon. ``start`` and ``end`` are code-point offsets into the original text, end exclusive, and
    ``matched_text == original[start:end]``; the span includes any separators or invisible
    characters that were inserted between the characters of the word.
    """

    word: str
    category: str
    severity: int
    start: int
    end: int
    matched_text: str


class Verdict(enum.IntEnum):
    """The outcome of matching a text; the values are those of ``sieve.v1.Verdict``."""

    PASS = 1
    REVIEW = 2
    BLOCK = 3


@dataclass(frozen=True, slots=True)
class MatchResult:
    """All hits in a text (sorted by start, then longest first), the verdict and the normalised text."""

    hits: tuple[Hit, ...]
    verdict: Verdict
    normalized_text: str


def _hit_order(hit: Hit) -> tuple[int, int, str]:
    return hit.start, hit.start - hit.end, hit.word


class Matcher:
    """Finds every lexicon word in a text, including overlapping and repeated occurrences.

    Lexicon words are normalised like the texts. When several entries normalise to the same word,
    the one with the highest severity is kept (the first one on a tie). A word that normalises to
    nothing (only punctuation or spaces) could never match and is rejected with ``ValueError``.

    Verdict: ``BLOCK`` if any hit has ``severity >= block_severity``, ``REVIEW`` if there are other
    hits, ``PASS`` if there are none. An empty lexicon always gives ``PASS``.
    """

    __slots__ = ("_automaton", "_block_severity", "_entries", "version")

    def __init__(self, entries: Iterable[LexiconEntry], block_severity: int = 3, version: int = -1) -> None:
        #: the lexicon version the entries came from (-1: not from the lexicon table), stored with each result
        self.version = version
        chosen: dict[str, LexiconEntry] = {}
        for entry in entries:
            key = normalize_word(entry.word)
            if not key:
                raise ValueError(f"lexicon word {entry.word!r} is empty once normalised")
            previous = chosen.get(key)
            if previous is None or entry.severity > previous.severity:
                chosen[key] = entry
        self._entries: dict[str, LexiconEntry] = chosen
        self._block_severity = block_severity
        self._automaton: ahocorasick.Automaton | None = None
        if chosen:
            automaton = ahocorasick.Automaton(ahocorasick.STORE_ANY)
            for key, entry in chosen.items():
                automaton.add_word(key, (len(key), entry))
            automaton.make_automaton()
            self._automaton = automaton

    @property
    def size(self) -> int:
        """The number of distinct (normalised) lexicon words."""
        return len(self._entries)

    @property
    def block_severity(self) -> int:
        """The lowest severity that makes the verdict ``BLOCK``."""
        return self._block_severity

    def match(self, text: str) -> MatchResult:
        """Find every lexicon word in ``text`` and decide the verdict."""
        normalized = normalize(text)
        if self._automaton is None or not normalized.text:
            return MatchResult((), Verdict.PASS, normalized.text)
        offsets = normalized.offsets
        ends = normalized.ends
        hits: list[Hit] = []
        seen: set[tuple[str, int, int]] = set()
        for last, (length, entry) in self._automaton.iter(normalized.text):
            start = offsets[last - length + 1]
            end = ends[last]
            # One original character can expand to several normalised ones (``ﬀ`` -> ``ff``); report
            # a word once per original span.
            key = (entry.word, start, end)
            if key in seen:
                continue
            seen.add(key)
            hits.append(Hit(entry.word, entry.category, entry.severity, start, end, text[start:end]))
        hits.sort(key=_hit_order)
        return MatchResult(tuple(hits), self._verdict(hits), normalized.text)

    def _verdict(self, hits: list[Hit]) -> Verdict:
        if not hits:
            return Verdict.PASS
        if max(hit.severity for hit in hits) >= self._block_severity:
            return Verdict.BLOCK
        return Verdict.REVIEW
