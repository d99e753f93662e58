"""The ``pinyin`` and ``homophone`` rules: a CJK lexicon word found by its sound.

A CJK lexicon word (two CJK characters or more) is keyed by its toneless pinyin (``pypinyin``: the reading of
the word as a phrase, and the first reading of each character); a text is read the same way, one unit per
normalised character (a CJK character's first reading, a Latin letter as itself, anything else a break). A
key found in that reading is a hit when

* it starts and ends on whole units: a CJK character, or a Latin word of the original text (``bing du`` and
  ``bingdu`` are words, ``combingdust`` holds none), and every CJK character lies on a syllable of the key;
* it is not the word itself (the plain matcher finds that);
* ``pinyin`` (Latin letters in it): the text has CJK characters somewhere (pinyin as a disguise is a thing of
  Chinese text: ``Dupin`` in an English sentence is a name);
* ``homophone`` (other characters of the same sound): neither the characters found nor a word that crosses
  either end of them is an ordinary word of the dictionary (jieba's word list: 病毒 is a word and is no
  disguise of 冰毒; in 士兵毒死 the 兵毒 is cut out of 士兵).

Hits through these rules are fuzzier than the others and are never more than REVIEW (``worker_svc.text.rules.
FUZZY_RULES``).
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import accumulate

import ahocorasick

from worker_svc.text.normalize import Normalized
from worker_svc.text.rules import RULE_BITS, is_cjk

__all__ = ["Phonetic", "PhoneticHit", "initials", "syllable"]

PINYIN = RULE_BITS["pinyin"]
HOMOPHONE = RULE_BITS["homophone"]
_BREAK = "\x00"
#: a dictionary word this rare is no evidence that the characters are an ordinary word
_MIN_FREQUENCY = 3


@cache
def _readings() -> dict[int, str]:
    from pypinyin.pinyin_dict import pinyin_dict

    return pinyin_dict


def _toneless(syllable: str) -> str:
    plain = "".join(c for c in unicodedata.normalize("NFD", syllable) if not unicodedata.combining(c))
    return plain.lower()


@cache
def syllable(ch: str) -> str:
    """The toneless pinyin of a CJK character's first reading ("" when it has none)."""
    reading = _readings().get(ord(ch))
    return _toneless(reading.split(",")[0]) if reading else ""


def initials(word: str) -> dict[str, str]:
    """Each CJK character of ``word`` -> the first letter of its pinyin."""
    return {ch: syllable(ch)[0] for ch in word if is_cjk(ch) and syllable(ch)}


class _Units(dict[str, str]):
    """Normalised character -> its unit in the text's reading, filled on first use."""

    def __missing__(self, ch: str) -> str:
        if "a" <= ch <= "z":
            unit = ch
        elif is_cjk(ch):
            unit = syllable(ch) or _BREAK
        else:
            unit = _BREAK
        if len(self) < 1 << 16:
            self[ch] = unit
        return unit


_UNITS = _Units()


@cache
def dictionary() -> frozenset[str]:
    """Ordinary Chinese words of two to four characters (jieba's dictionary, MIT licence)."""
    text = resources.files("jieba").joinpath("dict.txt").read_text("utf-8")
    words: set[str] = set()
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 2 and 2 <= len(fields[0]) <= 4 and fields[1].isdigit() and int(fields[1]) >= _MIN_FREQUENCY:
            words.add(fields[0])
    return frozenset(words)


@dataclass(frozen=True, slots=True)
class _Key:
    key: str  # the folded lexicon word
    payload: object  # what the matcher gave for it (handed back with each hit)
    starts: dict[int, str]  # offset of each syllable in the reading -> the key's character there


@dataclass(frozen=True, slots=True)
class PhoneticHit:
    payload: object
    first: int  # normalised index of the first and last characters found
    last: int
    bits: int


def _spellings(key: str) -> list[tuple[str, dict[int, str]]]:
    """The readings of a folded key: (reading, syllable offset -> character), the phrase's and the characters'."""
    from pypinyin import Style, pinyin

    phrase = [_toneless(p[0]) for p in pinyin(key, style=Style.TONE, errors="default")]
    per_char = [syllable(ch) if is_cjk(ch) else ch for ch in key]
    out: dict[str, dict[int, str]] = {}
    for units in (phrase, per_char):
        if len(units) != len(key) or any(not u or not u.isascii() or not u.isalpha() for u in units):
            continue
        starts: dict[int, str] = {}
        offset = 0
        for ch, unit in zip(key, units, strict=True):
            if is_cjk(ch):
                starts[offset] = ch
            offset += len(unit)
        out.setdefault("".join(units), starts)
    return list(out.items())


class Phonetic:
    """The readings of the CJK lexicon words in one automaton; ``find`` gives the hits in a text."""

    __slots__ = ("_automaton",)

    def __init__(self, keys: list[tuple[str, object]]) -> None:
        by_reading: dict[str, list[_Key]] = {}
        for key, payload in keys:
            if sum(1 for ch in key if is_cjk(ch)) < 2 or not all(is_cjk(ch) or "a" <= ch <= "z" for ch in key):
                continue
            for reading, starts in _spellings(key):
                by_reading.setdefault(reading, []).append(_Key(key, payload, starts))
        self._automaton: ahocorasick.Automaton | None = None
        if by_reading:
            dictionary()  # loaded now, not on the first hit
            automaton = ahocorasick.Automaton(ahocorasick.STORE_ANY)
            for reading, found in by_reading.items():
                automaton.add_word(reading, (len(reading), found))
            automaton.make_automaton()
            self._automaton = automaton

    def find(self, original: str, normalized: Normalized) -> list[PhoneticHit]:
        if self._automaton is None:
            return []
        text = normalized.text
        units = list(map(_UNITS.__getitem__, text))
        reading = "".join(units)
        if len(reading) < 2:
            return []
        ends = list(accumulate(map(len, units)))
        hits: list[PhoneticHit] = []
        has_cjk: bool | None = None
        for last_char, (length, found) in self._automaton.iter(reading):
            start = last_char - length + 1
            span = _whole_units(original, normalized, ends, start, last_char)
            if span is None:
                continue
            first, last = span
            chars = text[first : last + 1]
            for key in found:
                bits = self._bits(key, chars, units, first, start)
                if bits is None:
                    continue
                if bits & PINYIN and not any(is_cjk(ch) for ch in chars):
                    if has_cjk is None:
                        has_cjk = any(is_cjk(ch) for ch in text)
                    if not has_cjk:
                        continue
                if bits & HOMOPHONE and _ordinary(text, first, last + 1):
                    continue
                hits.append(PhoneticHit(key.payload, first, last, bits))
        return hits

    @staticmethod
    def _bits(key: _Key, chars: str, units: list[str], first: int, start: int) -> int | None:
        """The rules a match needs (None: not a match: a character off the key's syllables, or the key itself)."""
        if chars == key.key:
            return None
        bits = 0
        offset = start
        for k, ch in enumerate(chars):
            if is_cjk(ch):
                expected = key.starts.get(offset - start)
                if expected is None:
                    return None
                if expected != ch:
                    bits |= HOMOPHONE
            else:
                bits |= PINYIN
            offset += len(units[first + k])
        return bits or None


def _whole_units(
    original: str, normalized: Normalized, ends: list[int], start: int, last_char: int
) -> tuple[int, int] | None:
    """The normalised characters a match of the reading [start, last_char] covers, when it starts and ends on
    whole units (and, for Latin letters, on words of the original text); else None."""
    first = bisect_right(ends, start)
    if (ends[first - 1] if first else 0) != start:
        return None
    last = bisect_left(ends, last_char + 1)
    if last >= len(ends) or ends[last] != last_char + 1:
        return None
    text = normalized.text
    if "a" <= text[first] <= "z" and not _latin_start(original, normalized.offsets[first]):
        return None
    if "a" <= text[last] <= "z" and not _latin_end(original, normalized.ends[last]):
        return None
    return first, last


def _latin(ch: str) -> bool:
    return ch.isalpha() and not is_cjk(ch)


def _latin_start(original: str, start: int) -> bool:
    return start == 0 or not _latin(original[start - 1])


def _latin_end(original: str, end: int) -> bool:
    return end >= len(original) or not _latin(original[end])


def _ordinary(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is a dictionary word, or a dictionary word crosses either of its ends."""
    words = dictionary()
    if text[start:end] in words:
        return True
    n = len(text)
    for a in range(max(0, start - 3), start):  # words that begin before and end inside or after
        for b in range(start + 1, min(n, a + 4) + 1):
            if b - a >= 2 and text[a:b] in words:
                return True
    for a in range(start + 1, end):  # words that begin inside and end after
        for b in range(end + 1, min(n, a + 4) + 1):
            if text[a:b] in words:
                return True
    return False
