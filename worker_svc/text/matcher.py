"""Sensitive-word matching: a lexicon compiled once into an Aho-Corasick automaton.

This module owns the lexicon data types (``LexiconEntry``), the match results (``Hit``,
``MatchResult``, ``Verdict``) and ``Matcher``, which finds every lexicon word in a text in one pass
over its normalised form (see ``worker_svc.text.normalize``) and maps each hit back to a span of the
original text.
The disguise rules (``worker_svc.text.rules``) fold the text (traditional characters, variants, look-alikes,
leetspeak) and add spellings to the lexicon (letters and parts for characters: ``worker_svc.text.variants``;
pinyin and homophones: ``worker_svc.text.phonetic``); each can be switched per category (``RuleConfig``) and
each hit names the rules it needed. A lexicon word that starts (ends) with a Latin letter hits only where it
starts (ends) on a word boundary of the original text: not between two letters, nor just after a letter and
an apostrophe (``heroine`` holds no ``heroin``, ``John's ex`` no ``sex``), an English plural ``s`` excepted
(``casinos``); separators inside the word do not matter (``S.E.X``, ``c-a-s-i-n-o``). CJK words match anywhere.

A ``Matcher`` is immutable once built and ``match`` only reads the automaton, so one instance can
be shared by all the tasks (and threads) of a worker.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain

import ahocorasick

from worker_svc.text import phonetic, variants
from worker_svc.text.normalize import Normalized, normalize
from worker_svc.text.rules import (
    FUZZY_BITS,
    RULE_BITS,
    Folded,
    RuleConfig,
    fold,
    is_cjk,
    key_grams,
    needs_fold,
    rule_names,
)

__all__ = ["Hit", "LexiconEntry", "MatchResult", "Matcher", "RuleConfig", "Verdict"]


@dataclass(frozen=True, slots=True)
class LexiconEntry:
    """One lexicon word with its category and severity (higher is worse)."""

    word: str
    category: str
    severity: int


@dataclass(frozen=True, slots=True)
class Hit:
    """One occurrence of a lexicon word.

    ``word`` and ``category`` are those of the lexicon entry, ``word`` as stored in the lexicon; ``severity``
    is the entry's, lowered below the block severity for a hit through a fuzzy rule (pinyin, homophone,
    letter). ``start`` and ``end`` are code-point offsets into the original text, end exclusive, and
    ``matched_text == original[start:end]``; the span includes any separators or invisible characters that
    were inserted between the characters of the word. ``rules`` names the disguise rules the hit needed
    (``worker_svc.text.rules.RULES`` order; empty for a plain hit). A list, as JSON and asdict give it.
    """

    word: str
    category: str
    severity: int
    start: int
    end: int
    matched_text: str
    rules: list[str] = field(default_factory=list, hash=False)


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


@dataclass(frozen=True, slots=True)
class _Key:
    """One spelling in the automaton: the entry, the rules the spelling itself needs, the rules that changed
    each character of the lexicon word when it was folded (the text needs no rule for those: the word has
    them too), whether its ends are Latin (boundaries), the rules the entry's category allows, and for a
    pinyin or homophone spelling the syllables of the word."""

    length: int
    entry: LexiconEntry
    bits: int
    word_masks: tuple[int, ...] | None
    latin_start: bool
    latin_end: bool
    allowed: int
    syllables: int  # a pinyin or homophone spelling: the word's syllables (phonetic.plausible); else 0
    base: str  # the folded lexicon word
    spelling: str  # the characters this key stands for (the automaton holds their sound)
    homophones: int  # the word's CJK characters when other characters of the same sound may stand for them, else 0
    breaks: frozenset[int] | None  # a Latin word: where its spelling may be split by blanks (its own spaces)


def _automaton(keys: dict[str, list[_Key]]) -> ahocorasick.Automaton | None:
    if not keys:
        return None
    automaton = ahocorasick.Automaton(ahocorasick.STORE_ANY)
    for spelling, found in keys.items():
        automaton.add_word(spelling, (len(spelling), tuple(found)))
    automaton.make_automaton()
    return automaton


def _breaks(word: str) -> frozenset[int]:
    """Where a lexicon word's folded spelling has a blank of the word before it (``free money``: 4)."""
    normalized = fold(word).normalized
    return frozenset(
        k
        for k in range(1, len(normalized.text))
        if any(c.isspace() for c in word[normalized.ends[k - 1] : normalized.offsets[k]])
    )


def _split_as_written(text: str, normalized: Normalized, first: int, length: int, breaks: frozenset[int]) -> bool:
    """Whether a Latin word found at normalised ``first`` is split by blanks in the text only where the lexicon
    word has its own (``free money``), or spelled out letter by letter (``h e r o i n``): ``hero in`` holds no
    ``heroin``. Other separators (``c-a-s-i-n-o``, ``her.oin``) split it as they like."""
    offsets = normalized.offsets
    start, end = offsets[first], normalized.ends[first + length - 1]
    blanks = [found.start() for found in _BLANK.finditer(text, start, end)]
    if not blanks:
        return True
    # a blank lies before the first normalised character that starts after it: k characters into the word
    if all(bisect_right(offsets, at, first, first + length) - first in breaks for at in blanks):
        return True
    return all(sum(c.isalpha() for c in piece) <= 1 for piece in text[start:end].split())  # spelled out


_BLANK = re.compile(r"\s")


def _text_rules(masks: tuple[int, ...], word_masks: tuple[int, ...] | None) -> int:
    """The rules that changed a match's characters in the text, less those the lexicon word has there too."""
    bits = 0
    if word_masks is None:
        for mask in masks:
            bits |= mask
    else:
        for mask, own in zip(masks, word_masks, strict=True):
            bits |= mask & ~own
    return bits


def _latin(ch: str) -> bool:
    return ch.isalpha() and not is_cjk(ch)


def _starts_word(original: str, start: int) -> bool:
    if start == 0:
        return True
    before = original[start - 1]
    if _latin(before):
        return False
    # an apostrophe inside a word (John's, don't) is no boundary
    return not (before in "'\u2019" and start >= 2 and _latin(original[start - 2]))


#: short words OCR glues to a neighbour when it misses the space between them ("Free moneyfor everyone"): in text read
#: from an image a Latin lexicon word may also start or end where one of these does, and nowhere else inside a word
#: ("heroine", "moneybox" still do not hit). None of them makes an ordinary word with the default lexicon's words.
OCR_JOINED = frozenset(
    {
        "a",
        "an",
        "and",
        "all",
        "at",
        "buy",
        "for",
        "free",
        "from",
        "get",
        "here",
        "in",
        "is",
        "it",
        "my",
        "no",
        "not",
        "now",
        "of",
        "on",
        "only",
        "or",
        "our",
        "per",
        "the",
        "this",
        "to",
        "with",
        "you",
        "your",
    }
)
#: a run of Latin letters this long read from an image is words whose spaces the OCR lost
#: ("Freshcoffeeandpastriesmoneylaunderinginside"): inside it, word boundaries are unknown and not asked for
OCR_SPACELESS_RUN = 20


def _joined_before(original: str, start: int) -> bool:
    """The Latin letters just before `start` (back to the previous non-letter) are one of OCR_JOINED."""
    i = start
    while i > 0 and _latin(original[i - 1]):
        i -= 1
    return 0 < start - i <= 5 and original[i:start].lower() in OCR_JOINED


def _joined_after(original: str, end: int) -> bool:
    """The Latin letters just after `end` (up to the next non-letter) are one of OCR_JOINED."""
    j = end
    while j < len(original) and _latin(original[j]):
        j += 1
    return 0 < j - end <= 5 and original[end:j].lower() in OCR_JOINED


def _spaceless(original: str, start: int, end: int) -> bool:
    """The match lies in a run of at least OCR_SPACELESS_RUN Latin letters (and what joins them: the match's own
    characters) with no space: text whose spaces an OCR lost."""
    i, j = start, end
    while i > 0 and _latin(original[i - 1]):
        i -= 1
    while j < len(original) and _latin(original[j]):
        j += 1
    run = original[i:j]
    return j - i >= OCR_SPACELESS_RUN and not any(c.isspace() for c in run)


def _bounded(original: str, start: int, end: int, key: _Key, ocr: bool) -> bool:
    """A Latin key's match starts and ends where a word does (as the key asks); in text read from an image (`ocr`)
    also next to a glued OCR_JOINED word, or anywhere inside a run whose spaces the OCR lost."""
    if ocr and _spaceless(original, start, end):
        return True
    if key.latin_start and not _starts_word(original, start) and not (ocr and _joined_before(original, start)):
        return False
    return not (key.latin_end and not _ends_word(original, end) and not (ocr and _joined_after(original, end)))


def _ends_word(original: str, end: int) -> bool:
    if end >= len(original) or not _latin(original[end]):
        return True
    # an English plural (casinos) still ends the word
    return original[end] in "sS" and (end + 1 == len(original) or not _latin(original[end + 1]))


class Matcher:
    """Finds every lexicon word in a text, including overlapping and repeated occurrences.

    Lexicon words are normalised (and folded) like the texts. When several entries normalise to the same
    word, the one with the highest severity is kept (the first one on a tie). A word that normalises to
    nothing (only punctuation or spaces) could never match and is rejected with ``ValueError``.

    Verdict: ``BLOCK`` if any hit has ``severity >= block_severity``, ``REVIEW`` if any other hit has
    ``severity >= review_severity``, ``PASS`` otherwise (no hits, or only hits below ``review_severity``, which
    are still reported). An empty lexicon always gives ``PASS``. The worker takes both thresholds from
    ``SIEVE_BLOCK_SEVERITY`` and ``SIEVE_REVIEW_SEVERITY``.
    """

    __slots__ = (
        "_automaton",
        "_block_severity",
        "_entries",
        "_grams",
        "_review_severity",
        "_rules",
        "_sound_table",
        "version",
    )

    def __init__(
        self,
        entries: Iterable[LexiconEntry],
        block_severity: int = 3,
        version: int = -1,
        rules: RuleConfig | None = None,
        review_severity: int = 1,
    ) -> None:
        if not review_severity <= block_severity:
            raise ValueError(f"review severity {review_severity} is above the block severity {block_severity}")
        #: the lexicon version the entries came from (-1: not from the lexicon table), stored with each result
        self.version = version
        self._rules = rules if rules is not None else RuleConfig()
        chosen: dict[str, tuple[LexiconEntry, Folded]] = {}
        for entry in entries:
            folded = fold(entry.word)
            key = folded.normalized.text
            if not key:
                raise ValueError(f"lexicon word {entry.word!r} is empty once normalised")
            previous = chosen.get(key)
            if previous is None or entry.severity > previous[0].severity:
                chosen[key] = (entry, folded)
        self._entries: dict[str, LexiconEntry] = {key: entry for key, (entry, _) in chosen.items()}
        self._block_severity = block_severity
        self._review_severity = review_severity
        keys: dict[str, _Key] = {}
        for key, (entry, folded) in chosen.items():
            keys[key] = self._key(key, entry, 0, folded.masks, base=key, breaks=_breaks(entry.word))
        for key, (entry, _) in chosen.items():
            for spelling, bits, syllables, breaks in self._spellings(key, entry):
                if spelling not in keys:
                    keys[spelling] = self._key(spelling, entry, bits, None, syllables, key, breaks)
        self._grams = key_grams(keys, [entry.word for entry, _ in chosen.values()])
        self._sound_table: dict[int, str] | None = None
        self._automaton = self._sounds(keys, chosen)

    def _sounds(
        self, keys: dict[str, _Key], chosen: dict[str, tuple[LexiconEntry, Folded]]
    ) -> ahocorasick.Automaton | None:
        """One automaton, of the keys' sounds when homophones are on anywhere (worker_svc.text.phonetic): a CJK
        character is looked for as the code of its first reading, so that one pass over the text's sound finds
        the keys and, for a lexicon word itself, its homophones; a match is then told apart by its characters."""
        if any(self._rules.bits(entry.category) & RULE_BITS["homophone"] for entry, _ in chosen.values()):
            self._sound_table = phonetic.sound_table()
        table = self._sound_table or {}
        sounds: dict[str, list[_Key]] = {}
        for found in keys.values():
            sounds.setdefault(found.spelling.translate(table), []).append(found)
        for word, (entry, _) in chosen.items():
            if table and self._rules.bits(entry.category) & RULE_BITS["homophone"]:
                for sound, _syllables in phonetic.sound_keys(word):  # the phrase's own reading, if another
                    if sound != word.translate(table):
                        sounds.setdefault(sound, []).append(keys[word])
        return _automaton(sounds)

    def _spellings(self, key: str, entry: LexiconEntry) -> list[tuple[str, int, int, frozenset[int] | None]]:
        """The other spellings of a folded lexicon word: (spelling, the rule it needs, syllables for a pinyin or
        homophone one, else 0, where blanks may split it: None for anywhere), for the rules its category
        allows."""
        allowed = self._rules.bits(entry.category)
        spellings: list[tuple[str, int, int, frozenset[int] | None]] = []
        if allowed & RULE_BITS["leet"]:
            own = _breaks(entry.word)
            spellings += [(s, RULE_BITS["leet"], 0, own) for s in variants.leet_spellings(key)]
            spellings += [
                (fold(phrase).normalized.text, RULE_BITS["leet"], 0, _breaks(phrase))
                for phrase in variants.leet_words(entry.word)
            ]
        if allowed & RULE_BITS["letter"]:
            initials = phonetic.initials(key)
            # a letter stands for a sound: judged like pinyin (彩色Q版 reads 彩色|Q版, no 色情 there)
            syllables = sum(1 for ch in key if is_cjk(ch))
            spellings += [(s, RULE_BITS["letter"], syllables, None) for s in variants.letter_spellings(key, initials)]
            # all initials: Latin letters only, so a Latin word needing CJK text around it (syllables 1)
            spellings += [(s, RULE_BITS["letter"], 1, None) for s in variants.initialisms(key, initials)]
        if allowed & RULE_BITS["decompose"]:
            spellings += [(s, RULE_BITS["decompose"], 0, None) for s in variants.decomposed(key)]
        if allowed & (RULE_BITS["pinyin"] | RULE_BITS["homophone"]):
            spellings += [(s, bits, n, None) for s, bits, n in phonetic.spellings(key) if bits & allowed]
        return spellings

    def _key(
        self,
        spelling: str,
        entry: LexiconEntry,
        bits: int,
        word_masks: tuple[int, ...] | None,
        syllables: int = 0,
        base: str = "",
        breaks: frozenset[int] | None = None,
    ) -> _Key:
        allowed = self._rules.bits(entry.category)
        cjk = sum(1 for ch in spelling if is_cjk(ch))
        homophones = cjk if bits == 0 and cjk >= 2 and allowed & RULE_BITS["homophone"] else 0
        return _Key(
            len(spelling),
            entry,
            bits,
            word_masks,
            _latin(spelling[0]),
            _latin(spelling[-1]),
            allowed,
            syllables,
            base,
            spelling,
            homophones,
            breaks,
        )

    @property
    def size(self) -> int:
        """The number of distinct (normalised) lexicon words."""
        return len(self._entries)

    @property
    def block_severity(self) -> int:
        """The lowest severity that makes the verdict ``BLOCK``."""
        return self._block_severity

    @property
    def review_severity(self) -> int:
        """The lowest severity that makes the verdict at least ``REVIEW``."""
        return self._review_severity

    @property
    def rules(self) -> RuleConfig:
        """Which disguise rules are on for which category."""
        return self._rules

    def match(self, text: str, *, ocr: bool = False) -> MatchResult:
        """Find every lexicon word in ``text`` and decide the verdict. ``ocr``: the text was read from an image,
        where a missed space glues a short word to a Latin lexicon word (OCR_JOINED)."""
        if not needs_fold(text):  # nothing any rule would change: the plain normalisation
            normalized = normalize(text)
            masks = None
        else:
            folded = fold(text, self._grams, special=True)
            normalized, masks = folded.normalized, folded.masks
        plain = normalized.text
        if self._automaton is None or not plain:
            return MatchResult((), Verdict.PASS, plain)
        table = self._sound_table
        matches = self._automaton.iter(plain if table is None or plain.isascii() else plain.translate(table))
        first = next(matches, None)
        if first is None:
            return MatchResult((), Verdict.PASS, plain)
        found: dict[tuple[str, int, int], tuple[int, LexiconEntry]] = {}
        self._scan(text, normalized, masks, chain((first,), matches), found, ocr)
        if not found:
            return MatchResult((), Verdict.PASS, plain)
        hits = [self._hit(text, entry, start, end, bits) for (_, start, end), (bits, entry) in found.items()]
        hits.sort(key=_hit_order)
        return MatchResult(tuple(hits), self._verdict(hits), plain)

    def _scan(
        self,
        text: str,
        normalized: Normalized,
        masks: tuple[int, ...] | None,
        matches: Iterable[tuple[int, tuple[int, tuple[_Key, ...]]]],
        found: dict[tuple[str, int, int], tuple[int, LexiconEntry]],
        ocr: bool = False,
    ) -> None:
        """The automaton's matches (in the text's sound: one character for one) that are a key's characters, or
        a lexicon word's homophone, and pass the boundaries, the category's rules and, for a phonetic spelling,
        ``phonetic.plausible``."""
        plain = normalized.text
        offsets = normalized.offsets
        ends = normalized.ends
        for last, (length, keys) in matches:
            first = last - length + 1
            chars = plain[first : last + 1]
            start = offsets[first]
            end = ends[last]
            for key in keys:
                bits = key.bits
                syllables = key.syllables
                if chars != key.spelling:
                    if not key.homophones or chars in self._entries:
                        continue  # another key's characters, or another word found as itself
                    bits |= RULE_BITS["homophone"]
                    syllables = key.homophones
                if (key.latin_start or key.latin_end) and not _bounded(text, start, end, key, ocr):
                    continue
                if key.breaks is not None and not _split_as_written(text, normalized, first, length, key.breaks):
                    continue
                if masks is not None:
                    bits |= _text_rules(masks[first : last + 1], key.word_masks)
                if bits & ~key.allowed:
                    continue
                if syllables and not phonetic.plausible(text, plain, first, last, syllables, key.base):
                    continue
                self._keep(found, key.entry, start, end, bits)

    @staticmethod
    def _keep(
        found: dict[tuple[str, int, int], tuple[int, LexiconEntry]],
        entry: LexiconEntry,
        start: int,
        end: int,
        bits: int,
    ) -> None:
        # One original character can expand to several normalised ones (``ﬀ`` -> ``ff``), and several spellings
        # can find one span: a word is reported once per original span, through the fewest rules.
        span = (entry.word, start, end)
        previous = found.get(span)
        if previous is None or bin(bits).count("1") < bin(previous[0]).count("1"):
            found[span] = (bits, entry)

    def _hit(self, text: str, entry: LexiconEntry, start: int, end: int, bits: int) -> Hit:
        severity = entry.severity
        if bits & FUZZY_BITS:
            severity = min(severity, self._block_severity - 1)
        return Hit(entry.word, entry.category, severity, start, end, text[start:end], rule_names(bits))

    def _verdict(self, hits: list[Hit]) -> Verdict:
        if not hits:
            return Verdict.PASS
        worst = max(hit.severity for hit in hits)
        if worst >= self._block_severity:
            return Verdict.BLOCK
        if worst >= self._review_severity:
            return Verdict.REVIEW
        return Verdict.PASS
