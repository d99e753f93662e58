"""The ``pinyin`` and ``homophone`` rules: a CJK lexicon word found by its sound, spelled on the lexicon side.

A CJK lexicon word (two CJK characters or more, nothing but CJK characters and Latin letters) gets, besides its
own, the spellings (``spellings``) of its readings (``pypinyin``: the word read as a phrase, and each character's
first reading):

* ``pinyin``: some or all of its characters as their toneless pinyin (``bing毒``, ``冰du``, ``bingdu``; the
  text's separators are gone once normalised, so ``bing du`` too): every choice for words of up to
  ``MAX_PINYIN_CHARS`` characters, else one character at a time and all of them;
* ``homophone``: characters of the same sound, tone included (堵 dǔ for 赌 dǔ; 病 bìng is no 冰 bīng): the
  matcher's automaton holds every key as it sounds (``sound_table``: each CJK character as a private-use code
  of its first reading with its tone; ``sound_keys`` adds a word's phrase reading when it differs) and reads the
  text's sound, so a lexicon word's homophones are found in the same pass as the keys, and told apart from the
  word itself by their characters.

A hit through either rule must also pass ``plausible``:

* with CJK characters in it: the characters found are no ordinary word of the dictionary (jieba's word list:
  病毒 is a word and no disguise of 冰毒), and the text around them does not read better as ordinary words than
  with the lexicon word there (the most likely segmentation into dictionary words, by their frequencies, against
  the one that reads the span as the word: 士兵|毒死 rather than 士|冰毒|死; pinyin stands for the word's own
  characters, so Du博士 reads 赌|博士 rather than 赌博|士);
* all in Latin letters: the text has CJK characters somewhere (pinyin as a disguise is a thing of Chinese text:
  ``Dupin`` in an English sentence is a name), or the word has ``LONG`` syllables or more (``mianfeilingqu`` is
  no English word), or every Latin word of the text reads as pinyin (a text in pinyin only: ``dubo wangzhan``).

Like any Latin word, a spelling that starts (ends) with a Latin letter hits only on a word boundary of the
original text. Hits through these rules are fuzzier than the others and are never more than REVIEW
(``worker_svc.text.rules.FUZZY_RULES``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import cache
from importlib import resources
from itertools import combinations

from worker_svc.text.rules import CJK_PATTERN, RULE_BITS, is_cjk

__all__ = ["LONG", "initials", "plausible", "sound_keys", "sound_table", "spellings", "syllable"]

PINYIN = RULE_BITS["pinyin"]
HOMOPHONE = RULE_BITS["homophone"]
#: pinyin of a word this long (syllables) is no English word: it hits without CJK characters around it
LONG = 3
MAX_PINYIN_CHARS = 6
#: a dictionary word this rare is no evidence that the characters are an ordinary word
_MIN_FREQUENCY = 3
#: the log-likelihood, in a segmentation, of a run of Latin letters, and the least of a lexicon word read as
#: itself (that of a word seen ~100 times in jieba's 60 million)
_LATIN = math.log(100 / 60e6)
_LEXICON = math.log(100 / 60e6)
#: how much more likely than the characters' ordinary reading a homophone's reading as the word must be
_HOMOPHONE_ODDS = 10.0


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


@cache
def dictionary() -> dict[str, float]:
    """Ordinary Chinese words of one to four characters -> the log of their frequency (jieba's dictionary, MIT
    licence; the rarest left out)."""
    text = resources.files("jieba").joinpath("dict.txt").read_text("utf-8")
    counts: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 2 and 1 <= len(fields[0]) <= 4 and fields[1].isdigit() and int(fields[1]) >= _MIN_FREQUENCY:
            counts[fields[0]] = int(fields[1])
    total = math.log(sum(counts.values()))
    return {word: math.log(count) - total for word, count in counts.items()}


@cache
def _unknown() -> float:
    """The log frequency of a character the dictionary does not have: below its rarest word."""
    words = dictionary()
    return min(words.values()) - 1.0 if words else -20.0


def _best(text: str) -> list[float]:
    """For each position of ``text``, the log-likelihood of the most likely segmentation of the rest of it into
    dictionary words (jieba's way: the highest product of word frequencies); a character the dictionary lacks is
    a word of its own, and a run of Latin letters one word of ``_LATIN`` likelihood. ``[0]`` is the whole text's."""
    words = dictionary()
    unknown = _unknown()
    n = len(text)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        if "a" <= text[i] <= "z":
            j = i + 1
            while j < n and "a" <= text[j] <= "z":
                j += 1
            if i == 0 or not "a" <= text[i - 1] <= "z":
                best[i] = _LATIN + best[j]
            else:
                best[i] = best[j]  # inside a run: only its start is a token's start
            continue
        score = words.get(text[i], unknown) + best[i + 1]
        for length in range(2, 5):
            piece = text[i : i + length]
            if len(piece) == length and piece in words:
                score = max(score, words[piece] + best[i + length])
        best[i] = score
    return best


@cache
def _syllable_codes() -> dict[str, str]:
    """Each reading with its tone -> a private-use character standing for that sound."""
    readings = sorted({r for value in _readings().values() for r in value.split(",")})
    return {reading: chr(0xF0000 + i) for i, reading in enumerate(readings)}


@cache
def sound_table() -> dict[int, str]:
    """For ``str.translate``: each character of GB 2312 (the common simplified ones: a homophone is written to be
    read) -> the code of its first reading (with its tone), so that homophones read alike; every other character
    stays as it is (and so matches only itself)."""
    codes = _syllable_codes()
    return {cp: codes[value.split(",")[0]] for cp, value in _readings().items() if _common(chr(cp))}


def _common(ch: str) -> bool:
    try:
        ch.encode("gb2312")
    except UnicodeEncodeError:
        return False
    return True


def sound_keys(key: str) -> list[tuple[str, int]]:
    """A folded key as it sounds (``sound_table``), for each of its readings: (sound spelling, syllables)."""
    if not _phonetic_key(key):
        return []
    codes = _syllable_codes()
    syllables = sum(1 for ch in key if is_cjk(ch))
    out: dict[str, int] = {}
    for units in _readings_of(key):
        spelled = "".join(
            codes.get(unit, "\ufffd") if is_cjk(ch) and _common(ch) else ch for ch, unit in zip(key, units, strict=True)
        )
        if "\ufffd" not in spelled:
            out.setdefault(spelled, syllables)
    return list(out.items())


def _readings_of(key: str) -> list[list[str]]:
    """The readings of a folded key, one toned syllable per character (a Latin letter stands for itself): the
    phrase's and the characters' first readings."""
    from pypinyin import Style, pinyin

    phrase = [p[0] for p in pinyin(key, style=Style.TONE, errors="default")]
    per_char = [(_readings().get(ord(ch), "").split(",")[0] if is_cjk(ch) else ch) for ch in key]
    out: list[list[str]] = []
    for units in (phrase, per_char):
        plain = [_toneless(u) for u in units]
        if len(units) == len(key) and all(u and u.isascii() and u.isalpha() for u in plain) and units not in out:
            out.append(units)
    return out


def _phonetic_key(key: str) -> bool:
    return sum(1 for ch in key if is_cjk(ch)) >= 2 and all(is_cjk(ch) or "a" <= ch <= "z" for ch in key)


def spellings(key: str) -> list[tuple[str, int, int]]:
    """The pinyin spellings of a folded lexicon key: (spelling, rule bit, syllables); none for a key of fewer
    than two CJK characters or with other characters than CJK and Latin letters."""
    if not _phonetic_key(key):
        return []
    cjk = [i for i, ch in enumerate(key) if is_cjk(ch)]
    found: dict[str, tuple[int, int]] = {}
    for units in _readings_of(key):
        if len(cjk) <= MAX_PINYIN_CHARS:
            choices = [c for size in range(1, len(cjk) + 1) for c in combinations(cjk, size)]
        else:
            choices = [(i,) for i in cjk] + [tuple(cjk)]
        for chosen in choices:
            spelled = "".join(_toneless(units[i]) if i in chosen else ch for i, ch in enumerate(key))
            found.setdefault(spelled, (PINYIN, len(cjk)))
    found.pop(key, None)
    return [(spelling, bits, syllables) for spelling, (bits, syllables) in found.items()]


def plausible(original: str, text: str, first: int, last: int, syllables: int, word: str) -> bool:
    """Whether a pinyin or homophone spelling found at ``text[first:last + 1]`` (``original`` normalised) may
    stand for the lexicon word ``word`` (folded; see the module docstring)."""
    if CJK_PATTERN.search(text, first, last + 1) is not None:
        return not _ordinary(text, first, last + 1, word)
    return syllables >= LONG or CJK_PATTERN.search(text) is not None or _all_pinyin(original)


@cache
def _syllables() -> frozenset[str]:
    return frozenset(_toneless(r) for value in _readings().values() for r in value.split(","))


def _all_pinyin(original: str) -> bool:
    """Whether every Latin word of the text reads as pinyin syllables (a text written in pinyin only)."""
    syllables = _syllables()
    found = re.findall(r"[A-Za-z]+", original)
    for word in found:
        word = word.lower()
        reachable = [True] + [False] * len(word)
        for i in range(len(word)):
            if reachable[i]:
                for j in range(i + 1, min(len(word), i + 6) + 1):
                    if word[i:j] in syllables:
                        reachable[j] = True
        if not reachable[-1]:
            return False
    return bool(found)


def _ordinary(text: str, start: int, end: int, word: str) -> bool:
    """Whether text[start:end] (CJK in it) reads better as ordinary words than as ``word`` (see the module
    docstring): for pinyin or letters in it, read as the word's own characters, the text around has a more likely
    segmentation into dictionary words than the one with the word there (Du博士: 赌|博士 rather than 赌博|士); for
    homophones, the characters are a dictionary word, or reading the word there is not ``_HOMOPHONE_ODDS`` times
    more likely than the characters' own most likely segmentation (士兵|毒死 for 兵毒, 麻|骨头 for 麻骨)."""
    words = dictionary()
    found = text[start:end]
    latin = any("a" <= ch <= "z" for ch in found)
    if not latin and found in words:
        return True
    as_word = max(words.get(word, _LEXICON), _LEXICON)
    if not latin and not _crossed(text, start, words) and not _crossed(text, end, words):
        # no dictionary word crosses its ends: the text around reads the same either way
        return _best(found)[0] + math.log(_HOMOPHONE_ODDS) > as_word
    low, high = max(0, start - 4), min(len(text), end + 4)
    left = text[low:start]
    middle = found if not latin else word
    window = left + middle + text[end:high]
    if latin and not _crossed(window, len(left), words) and not _crossed(window, len(left) + len(middle), words):
        return False  # no dictionary word even crosses its ends: nothing else to read there
    scores = _best(window)  # the whole window's, and from its right part on (a suffix reads alike either way)
    read_as_word = _best(left)[0] + as_word + scores[len(left) + len(middle)]
    if not latin:
        return scores[0] + math.log(_HOMOPHONE_ODDS) > read_as_word
    return scores[0] > read_as_word + 1e-9


def _crossed(text: str, at: int, words: dict[str, float]) -> bool:
    """Whether some dictionary word of the text starts before ``at`` and ends after it."""
    for a in range(max(0, at - 3), at):
        for b in range(at + 1, min(len(text), a + 4) + 1):
            if text[a:b] in words:
                return True
    return False
