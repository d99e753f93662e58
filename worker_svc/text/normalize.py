"""Text normalisation for sensitive-word matching, with a map back to the original text.

This module owns the single definition of "the same text" used by the matcher: both the lexicon
words (``normalize_word``) and the texts to check (``normalize``) go through the same folding, so
that disguised spellings of a word still match it:

1. **Unicode NFKC** compatibility folding, which also turns full-width forms into half-width ones
   (``ｆｒｅｅ`` -> ``free``, ``１２３`` -> ``123``, ``①`` -> ``1``) and U+3000 ideographic space
   into a plain space. A base character and the combining marks that follow it are folded together,
   so a decomposed ``e`` + U+0301 composes to ``é`` just as a precomposed ``é`` stays ``é``.
2. **Case folding** (``str.casefold``; ``S`` -> ``s``, ``ß`` -> ``ss``), then NFKC again, as in
   Unicode's NFKC_Casefold.
3. **Removal of invisible characters**: zero-width and format characters (U+200B..U+200F,
   U+2060..U+2064, U+FEFF, U+00AD and every other character of category ``Cf``), control characters
   (``Cc``), the Hangul fillers often abused as blanks, and non-spacing / enclosing marks (``Mn``,
   ``Me``) left over after composition, which strips strike-through and "Zalgo" decorations
   (``s̶e̶x̶`` -> ``sex``) and variation selectors.
4. **Removal of separators**: whitespace, punctuation and symbols (categories ``Z*``, ``P*``,
   ``S*``, which cover ASCII ``. , - _ * / \\ | ~`` and their full-width forms, as well as emoji)
   are dropped, so that ``敏 感 词``, ``敏.感.词``, ``敏*感-词`` and ``S.E.X`` match the lexicon
   words ``敏感词`` and ``sex``.

Trade-offs, accepted on purpose because content moderation prefers recall over precision:

* Dropping *all* whitespace joins neighbouring Latin words, so a lexicon word can match across a
  word boundary ("an alsex..." contains ``sex`` once normalised to ``analsex``; ``free money``
  also matches "tax-free Moneyball"). Short Latin lexicon words should therefore be avoided.
* Dropping non-spacing marks makes a few words of scripts that use them (Thai, Devanagari,
  Hebrew/Arabic points) fold together; lexicon and text are folded alike, so nothing is missed.
* Decomposed Hangul jamo are not recomposed across characters (per-cluster NFKC only).

``Normalized.offsets[i]`` is the index, in code points, of the original character (cluster) that
produced normalised character ``i``; ``Normalized.ends[i]`` is the exclusive end of that cluster.
Every character produced by one original character (``ﬁ`` -> ``fi``, ``㈱`` -> ``株``) maps to the
same original span. ``Normalized.span`` turns a normalised range into an original one.

The work is one pass over the text; each distinct character (or rare cluster) is folded once and
kept in a lookup table (backed by ``functools.lru_cache``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress
from typing import cast

__all__ = ["Normalized", "normalize", "normalize_word"]

# Categories whose characters never take part in a word: separators, punctuation, symbols,
# control and format characters, and non-spacing / enclosing marks left after composition.
_DROP_CATEGORIES: frozenset[str] = frozenset(
    {
        "Zs", "Zl", "Zp",
        "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po",
        "Sm", "Sc", "Sk", "So",
        "Cc", "Cf",
        "Mn", "Me",
    }
)  # fmt: skip

# Invisible characters dropped explicitly, whatever their category: zero-width spaces and joiners,
# directional marks, word joiner and invisible operators, BOM, soft hyphen, Hangul fillers,
# Mongolian vowel separator, combining grapheme joiner.
_DROP_CHARS: frozenset[str] = frozenset(
    [chr(cp) for cp in range(0x200B, 0x2010)]
    + [chr(cp) for cp in range(0x2060, 0x2065)]
    + ["\ufeff", "\u00ad", "\u115f", "\u1160", "\u3164", "\uffa0", "\u180e", "\u034f"]
)

# Categories of characters that attach to the preceding base character.
_MARK_CATEGORIES: frozenset[str] = frozenset({"Mn", "Mc", "Me"})

_CACHE_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class Normalized:
    """A normalised text and, for each of its characters, where it came from in the original.

    ``offsets[i]`` is the code-point index in the original text of the character that produced
    ``text[i]``; ``ends[i]`` is the exclusive end of that original character together with the
    combining marks folded into it (``offsets[i] + 1`` in the common case).
    """

    text: str
    offsets: tuple[int, ...]
    ends: tuple[int, ...]

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Map the non-empty normalised range ``[start, end)`` to a range of the original text."""
        if not 0 <= start < end <= len(self.text):
            raise ValueError(f"invalid normalised range [{start}, {end}) for length {len(self.text)}")
        return self.offsets[start], self.ends[end - 1]


def _keep(ch: str) -> bool:
    return ch not in _DROP_CHARS and unicodedata.category(ch) not in _DROP_CATEGORIES


def _fold(chunk: str) -> str:
    """NFKC_Casefold one character or one base+marks cluster, then drop what is not a word char."""
    folded = unicodedata.normalize("NFKC", chunk.replace("\u3000", " "))
    folded = unicodedata.normalize("NFKC", folded.casefold())
    return "".join(ch for ch in folded if _keep(ch))


@lru_cache(maxsize=_CACHE_SIZE)
def _fold_char(ch: str) -> str | None:
    """The folded form of one character, or ``None`` for a combining mark (folded with its base)."""
    if ch in _DROP_CHARS:
        return ""
    if unicodedata.category(ch) in _MARK_CATEGORIES:
        return None
    return _fold(ch)


@lru_cache(maxsize=_CACHE_SIZE)
def _fold_cluster(cluster: str) -> str:
    return _fold(cluster)


class _FoldTable(dict[str, str | None]):
    """Character -> ``_fold_char(character)``, filled on first use, read at C speed by ``map``.

    It stops growing at ``_CACHE_SIZE`` characters (a text full of rare characters cannot grow it
    without bound); characters beyond that go through the LRU cache of ``_fold_char``.
    """

    def __missing__(self, ch: str) -> str | None:
        value = _fold_char(ch)
        if len(self) < _CACHE_SIZE:
            self[ch] = value
        return value


_FOLD_TABLE = _FoldTable()
_lookup = _FOLD_TABLE.__getitem__
_plus_one = (1).__add__


def normalize(text: str) -> Normalized:
    """Normalise ``text`` for matching and keep, per normalised character, its original span."""
    pieces = list(map(_lookup, text))
    if None not in pieces:
        # Common case, no combining marks: every original character folds on its own.
        folded = "".join(cast("list[str]", pieces))
        n = len(text)
        if "" not in pieces:
            if len(folded) == n:
                # Nothing dropped, nothing expanded: the identity map.
                return Normalized(folded, tuple(range(n)), tuple(range(1, n + 1)))
        else:
            kept = list(compress(range(n), pieces))
            if len(folded) == len(kept):
                # Some characters dropped, none expanded: one normalised character per kept one.
                return Normalized(folded, tuple(kept), tuple(map(_plus_one, kept)))
    return _normalize_general(text, pieces)


def _normalize_general(text: str, pieces: list[str | None]) -> Normalized:
    """The general path of ``normalize``: combining-mark clusters and expanding characters."""
    n = len(text)
    out: list[str] = []
    offsets: list[int] = []
    ends: list[int] = []
    i = 0
    while i < n:
        piece = pieces[i]
        j = i + 1
        if piece is None or (j < n and pieces[j] is None):
            # A base character followed by combining marks (or marks with no base): fold the cluster
            # as a whole so that NFKC can compose it.
            while j < n and pieces[j] is None:
                j += 1
            piece = _fold_cluster(text[i:j])
        if piece:
            out.append(piece)
            offsets.extend([i] * len(piece))
            ends.extend([j] * len(piece))
        i = j
    return Normalized("".join(out), tuple(offsets), tuple(ends))


def normalize_word(word: str) -> str:
    """Normalise a lexicon word exactly as ``normalize`` normalises a text (may return ``""``)."""
    return normalize(word).text
