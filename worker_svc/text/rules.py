"""The disguise-folding rules of the matcher, and the folded view of a text they give (``fold``).

``worker_svc.text.normalize`` folds what is never meaningful (width, case, separators, invisible
characters). The rules here fold what is *usually* a disguise, and each of them can be switched per
lexicon category (``RuleConfig``, the ``SIEVE_TEXT_RULES`` setting) and is named in every hit it made
possible. Rules that rewrite the text (``fold``), one original code point to one, so that the map back to
the original characters stays exact:

* ``t2s`` traditional Chinese characters to simplified ones (OpenCC's ``t2s`` dictionary, character by
  character: 賭博 -> 赌博);
* ``variant`` CJK variant forms to the standard one (OpenCC's Taiwan, Hong Kong and Japanese shinjitai
  variant dictionaries, for characters outside GB 2312 only, and a small table of old forms they do not cover:
  靑 -> 青, 砲 -> 炮);
* ``confusable`` look-alike letters to their Latin skeleton inside Latin-script words (Cyrillic ``а``,
  Greek ``ο`` … in ``cаsinο``; the Unicode confusables table, ``confusable-homoglyphs``' data, and a table of
  the Cyrillic, Greek, Armenian and small-capital look-alikes it leaves out), and CJK
  radicals and strokes to the ideograph they look like (⺟ -> 母);
* ``leet`` digits and symbols for letters inside a word that has Latin letters (``f@ke p4ssport``,
  ``c0ca1ne``, a word spelled out ``p.0.r.n``; digits, symbols and letters in any form NFKC folds: ``𝐩0𝐫𝐧``,
  ``ｆ＠ｋｅ``): ``4 @`` -> a, ``3 €`` -> e, ``0`` -> o, ``5 $`` -> s, ``7 +`` -> t, ``8`` -> b, ``9`` -> g;
  ``1 ! |`` stand for either ``i`` or ``l`` and are kept as ``1``, which the lexicon side expands
  (``worker_svc.text.variants``). A number on its own (``5 000``, ``2026``) is never touched.

Rules that add spellings to the lexicon side (``worker_svc.text.variants``, ``worker_svc.text.phonetic``):
``letter`` (a Latin letter for a character: 加V信, 约p; and, rewritten in the text, a plus sign for 加:
+微信), ``decompose`` (a character written as its parts: 木仓 for 枪), ``pinyin`` (the pinyin of a CJK word in
Latin letters) and ``homophone`` (other characters of the same sound). Hits that need ``pinyin``,
``homophone`` or ``letter`` are fuzzier: ``FUZZY_RULES``, their severity is lowered so that they are never
more than REVIEW.

``Folded.masks[i]`` holds the bits (``RULE_BITS``) of the rules that changed normalised character ``i``;
``masks`` is ``None`` when no rule changed anything. A text without any character a rule may change (most
texts) costs one set look-up per character more than ``normalize``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import compress

from worker_svc.text.normalize import Normalized, normalize

__all__ = [
    "CJK_PATTERN",
    "FUZZY_RULES",
    "RULES",
    "RULE_BITS",
    "Folded",
    "RuleConfig",
    "fold",
    "is_cjk",
    "rule_names",
]

#: every rule, in the order hits name them
RULES: tuple[str, ...] = ("t2s", "variant", "confusable", "leet", "letter", "decompose", "pinyin", "homophone")
RULE_BITS: dict[str, int] = {name: 1 << i for i, name in enumerate(RULES)}
ALL_BITS = (1 << len(RULES)) - 1
#: rules whose hits are fuzzier: their severity is lowered below the block severity (REVIEW at most)
FUZZY_RULES: frozenset[str] = frozenset({"pinyin", "homophone", "letter"})
FUZZY_BITS = sum(RULE_BITS[name] for name in FUZZY_RULES)

T2S = RULE_BITS["t2s"]
VARIANT = RULE_BITS["variant"]
CONFUSABLE = RULE_BITS["confusable"]
LEET = RULE_BITS["leet"]
LETTER = RULE_BITS["letter"]


def rule_names(bits: int) -> list[str]:
    """The names of the rules in ``bits``, in ``RULES`` order (a new list each time)."""
    return list(_rule_names(bits))


@cache
def _rule_names(bits: int) -> tuple[str, ...]:
    return tuple(name for name in RULES if bits & RULE_BITS[name])


def is_cjk(ch: str) -> bool:
    """A CJK ideograph (unified, extensions, compatibility) — the characters that match without boundaries."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x3134F
        or 0xF900 <= cp <= 0xFAFF
        or cp == 0x3007
    )


#: any CJK ideograph (``is_cjk``), for a search at C speed
CJK_PATTERN = re.compile("[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


@dataclass(frozen=True, slots=True)
class RuleConfig:
    """Which rules are on for which lexicon category: ``per_category`` names the categories set explicitly,
    every other category gets ``default``. Parsed from ``SIEVE_TEXT_RULES`` by ``parse``."""

    default: int = ALL_BITS
    per_category: Mapping[str, int] | None = None

    def bits(self, category: str) -> int:
        if self.per_category:
            return self.per_category.get(category, self.default)
        return self.default

    @classmethod
    def parse(cls, spec: str) -> RuleConfig:
        """``category=rule,rule;*=rule,...``: ``*`` is every other category; a list may say ``all``, ``none``
        and ``-rule`` (``*=all,-pinyin``). An empty spec: every rule on everywhere. ``ValueError`` names what is
        wrong."""
        default = ALL_BITS
        per: dict[str, int] = {}
        for part in spec.split(";"):
            part = part.strip()
            if not part:
                continue
            category, sep, names = part.partition("=")
            category = category.strip()
            if not sep or not category:
                raise ValueError(f"expected 'category=rule,rule' or '*=rule,...', got {part!r}")
            bits = cls._bits(names)
            if category == "*":
                default = bits
            else:
                per[category] = bits
        return cls(default, per or None)

    @staticmethod
    def _bits(names: str) -> int:
        bits = 0
        for raw in names.split(","):
            name = raw.strip()
            if not name:
                continue
            if name == "all":
                bits = ALL_BITS
            elif name == "none":
                bits = 0
            elif name.startswith("-") and name[1:] in RULE_BITS:
                bits &= ~RULE_BITS[name[1:]]
            elif name in RULE_BITS:
                bits |= RULE_BITS[name]
            else:
                raise ValueError(f"unknown rule {name!r} (rules: {', '.join(RULES)}, all, none, -rule)")
        return bits


@dataclass(frozen=True, slots=True)
class Folded:
    """A text normalised and folded by the rules: ``normalized`` (text, offsets back to the original) and, per
    normalised character, the bits of the rules that changed it (``None``: no rule changed anything)."""

    normalized: Normalized
    masks: tuple[int, ...] | None


# --- the tables -------------------------------------------------------------------------------------------------

#: old and variant CJK forms OpenCC's dictionaries leave as they are (checked against t2s, tw2s, hk2s, jp2t)
_VARIANTS_EXTRA = {
    "囯": "国", "吿": "告", "兎": "兔", "靑": "青", "塲": "场", "虵": "蛇", "㑹": "会", "鎗": "枪",
    "砲": "炮", "礮": "炮", "賍": "赃", "婬": "淫", "寳": "宝", "叅": "参", "緖": "绪", "槪": "概",
    "硏": "研", "衞": "卫", "敎": "教", "眞": "真", "戶": "户", "卽": "即", "旣": "既", "麽": "么",
    "菸": "烟", "姦": "奸", "汙": "污", "叄": "叁", "粧": "妆", "傌": "骂", "氷": "冰", "歺": "歹",
    "冐": "冒", "冩": "写", "咊": "和", "秊": "年", "鎚": "锤", "鑚": "钻", "錬": "炼", "縂": "总",
    "愽": "博", "躶": "裸", "勅": "敕", "皷": "鼓", "釼": "剑", "劔": "剑", "刼": "劫", "獃": "呆",
}  # fmt: skip

_CJK_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2A6DF))


@cache
def _cjk_table() -> dict[int, str]:
    """Ideograph -> its simplified / standard form (one character), for ``str.translate``."""
    import opencc  # the C++ library; loaded on first use (a worker builds its Matcher once)

    chars = "".join(chr(cp) for low, high in _CJK_RANGES for cp in range(low, high + 1))
    table: dict[int, str] = {}

    def convert(config: str, text: str) -> list[str]:
        # one character a line: OpenCC converts character by character, no phrase spans two lines
        out = opencc.OpenCC(config).convert("\n".join(text)).split("\n")
        return out if len(out) == len(text) else list(text)

    t2s = convert("t2s", chars)
    for source, target in zip(chars, t2s, strict=True):
        if len(target) == 1 and target != source:
            table[ord(source)] = target
    variants = [convert("tw2s", chars), convert("hk2s", chars), convert("t2s", "".join(_one(convert("jp2t", chars))))]
    for i, source in enumerate(chars):
        if ord(source) in table or _simplified(source):
            continue
        for converted in variants:
            target = converted[i]
            if len(target) == 1 and target != source:
                table[ord(source)] = target
                break
    for source, target in _VARIANTS_EXTRA.items():
        table[ord(source)] = target
    return table


def _simplified(ch: str) -> bool:
    """A character of GB 2312, the simplified Chinese set: an ordinary character of Chinese text, whatever the
    Japanese or regional dictionaries make of it (欠 is Japanese for 缺, and "owe" in Chinese)."""
    try:
        ch.encode("gb2312")
    except UnicodeEncodeError:
        return False
    return True


def _one(items: list[str]) -> list[str]:
    return [item if len(item) == 1 else "\ufffd" for item in items]


@cache
def _cjk_sources() -> frozenset[str]:
    return frozenset(chr(cp) for cp in _cjk_table())


@cache
def _cjk_source_class() -> re.Pattern[str]:
    """Any ideograph ``_cjk_table`` changes (and any character beyond the BMP: ``_char_class``), found at C speed."""
    return _char_class(_cjk_sources())


@cache
def _cjk_rule() -> dict[str, int]:
    """Which rule a change of ``_cjk_table`` is: t2s when OpenCC's t2s does it, else variant."""
    import opencc

    converter = opencc.OpenCC("t2s")
    return {chr(cp): (T2S if converter.convert(chr(cp)) == target else VARIANT) for cp, target in _cjk_table().items()}


#: look-alikes of Latin letters that the confusables data leaves out or maps elsewhere (its skeletons map some
#: lower-case Greek and Cyrillic letters to other look-alikes, such as kappa to kra): Cyrillic, Greek, Armenian
#: and small capitals, as they are used to disguise Latin words
_LATIN_EXTRA = {
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d", "һ": "h", "ь": "b",
    "п": "n", "г": "r", "ш": "w", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ѡ": "w", "ү": "y", "ѵ": "v",
    "А": "a", "В": "b", "Е": "e", "К": "k", "М": "m", "Н": "h", "О": "o", "Р": "p", "С": "c", "Т": "t",
    "У": "y", "Х": "x", "Ѕ": "s", "І": "i", "Ј": "j", "Ь": "b", "Ԛ": "q", "Ԝ": "w", "Ү": "y",
    "α": "a", "β": "b", "γ": "y", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "σ": "o", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
    "Α": "a", "Β": "b", "Ε": "e", "Ζ": "z", "Η": "h", "Ι": "i", "Κ": "k", "Μ": "m", "Ν": "n", "Ο": "o",
    "Ρ": "p", "Τ": "t", "Υ": "y", "Χ": "x",
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "զ": "q", "ց": "g",
    "ɑ": "a", "ɡ": "g", "ɩ": "i", "ı": "i", "ȷ": "j", "ʏ": "y", "ɪ": "i", "ᴄ": "c", "ᴏ": "o", "ᴜ": "u",
    "ᴠ": "v", "ᴡ": "w", "ᴢ": "z", "ʀ": "r", "ɴ": "n", "ʜ": "h", "ᴋ": "k", "ᴍ": "m", "ᴛ": "t", "ᴘ": "p",
    "ꜱ": "s", "ʙ": "b", "ᴅ": "d", "ᴇ": "e", "ꜰ": "f", "ʟ": "l", "ᴊ": "j",
}  # fmt: skip


@cache
def _confusables() -> tuple[dict[str, str], dict[str, str]]:
    """(look-alike -> Latin letter, look-alike -> CJK ideograph), from the Unicode confusables data that the
    ``confusable-homoglyphs`` wheel ships. Only one code point to one; what NFKC already folds is left to it;
    kana and Hangul letters are not taken for ideographs (Japanese and Korean text would change)."""
    data = json.loads(resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text("utf-8"))
    latin: dict[str, str] = {}
    cjk: dict[str, str] = {}
    for target, entries in data.items():
        if len(target) != 1:
            continue
        if target.isascii() and target.isalpha():
            for entry in entries:
                c = entry["c"]
                if len(c) == 1 and not c.isascii() and not unicodedata.normalize("NFKC", c).casefold().isascii():
                    latin.setdefault(c, target.lower())
        elif is_cjk(target):
            for entry in entries:
                c = entry["c"]
                cp = ord(c) if len(c) == 1 else 0
                if (0x2E80 <= cp <= 0x2FDF or 0x31C0 <= cp <= 0x31EF) and unicodedata.normalize("NFKC", c) != target:
                    cjk.setdefault(c, target)
    # digits of other scripts that look like Latin letters (Devanagari zero ...) are no disguise of a letter
    latin = {c: t for c, t in latin.items() if not unicodedata.category(c).startswith("N")}
    latin.update(_LATIN_EXTRA)
    # letters in boxes and circles that NFKC leaves alone (🅲🅰🆂🅸🅽🅾, 🅒🅐🅢🅘🅝🅞, 🇨🇦🇸🇮🇳🇴 as fancy-text tools write them)
    for first in _BOXED_LETTERS:
        latin.update((chr(first + k), chr(ord("a") + k)) for k in range(26))
    return latin, cjk


#: the first code point (A) of each run of 26 boxed or circled Latin letters without a decomposition: negative
#: circled, negative squared, regional indicator symbols
_BOXED_LETTERS = (0x1F150, 0x1F170, 0x1F1E6)


#: symbols standing for letters; 1, !, | stand for i or l and stay "1" (the lexicon side expands them)
LEET_SYMBOLS = {"@": "a", "$": "s", "!": "1", "|": "1", "+": "t", "€": "e", "¡": "1"}
LEET_DIGITS = {"0": "o", "1": "1", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g"}
_SYMBOLS = "".join(LEET_SYMBOLS)
#: the placeholder for i or l
AMBIGUOUS = "1"


@cache
def _special() -> tuple[frozenset[str], frozenset[str]]:
    """(the characters the contextual rewrite looks at, the look-alikes): leet digits and symbols in every form that
    triggers the rule (``_leet_forms``), and the look-alikes of Latin letters and of ideographs. A text without
    look-alikes needs the contextual rewrite only where ``_leet_near_letter`` finds a leet character next to a Latin
    letter."""
    latin, cjk = _confusables()
    return frozenset({*_leet_forms(), *latin, *cjk}), frozenset(latin.keys() | cjk.keys())


#: planes 0 and 1, where every character NFKC turns into an ASCII letter, digit or symbol lies
_PLANES_0_1 = range(0x20000)


@cache
def _ascii_forms() -> dict[str, str]:
    """Every character of planes 0 and 1 that NFKC turns into one ASCII character (or one leet symbol: € ¡) -> that
    character (one pass over the planes, shared by the leet and Latin-letter tables)."""
    forms: dict[str, str] = {}
    for ch in map(chr, _PLANES_0_1):
        plain = unicodedata.normalize("NFKC", ch)
        if len(plain) == 1 and (plain.isascii() or plain in LEET_SYMBOLS):
            forms[ch] = plain
    return forms


@cache
def _leet_forms() -> frozenset[str]:
    """The digits and symbols that make a word next to a Latin letter a leet candidate: every form NFKC turns into
    one of ``LEET_SYMBOLS`` or ``LEET_DIGITS`` (full-width ０ ＠, mathematical 𝟎, circled ⓪), but not superscripts
    and subscripts (m³, CO₂: units and formulas), nor the full-width or small ！ and ｜ of Chinese punctuation
    (they would send most Chinese chat down the slow path for nothing)."""
    leet = LEET_SYMBOLS.keys() | LEET_DIGITS.keys()
    forms: set[str] = set()
    for ch, plain in _ascii_forms().items():
        if plain not in leet:
            continue
        if unicodedata.decomposition(ch).startswith(("<super>", "<sub>")):
            continue
        if plain in "!|" and ch != plain:
            continue
        forms.add(ch)
    return frozenset(forms)


@cache
def _latin_forms() -> frozenset[str]:
    """Every character that is a Latin letter once NFKC-folded (``_latin_letter``): ASCII, full-width,
    mathematical, circled, small capitals with a decomposition ..."""
    found = {ch for ch, plain in _ascii_forms().items() if "a" <= plain.casefold() <= "z"}
    # and the few whose NFKC is a letter outside ASCII that casefolds into it (ß -> ss, as _latin_letter has it)
    found.update(ch for ch in map(chr, range(0x80, 0x2000)) if ch not in found and _is_latin_letter(ch))
    return frozenset(found)


def _exact_class(chars: Iterable[str]) -> str:
    """A regular-expression character class of exactly ``chars`` (ranges of consecutive code points)."""
    points = sorted({ord(c) for c in chars})
    ranges: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        low, high = (f"\\U{points[k]:08x}" for k in (i, j))
        ranges.append(low if i == j else f"{low}-{high}")
        i = j + 1
    return f"[{''.join(ranges)}]"


def _with_beyond_bmp(bmp_class: str) -> str:
    """A class of ``_exact_class`` widened by every character beyond the BMP (one range after its bitmap)."""
    return bmp_class[:-1] + "\\U00010000-\\U0010ffff]"


@cache
def _leet_near_letter() -> re.Pattern[str]:
    """A leet digit or symbol (``_leet_forms``) next to a Latin letter (``_latin_forms``: p0rn, ｐ０ｒｎ, 𝐩0𝐫𝐧);
    "!" and "¡" only before one (after a word they are punctuation). The pattern starts with one class of the
    BMP's leet characters and of every character beyond it (a bitmap and a range: a search skips at C speed to the
    few digits and symbols of a text); a lookbehind then keeps the leet ones beyond the BMP (𝟎)."""
    leet_bmp, leet_beyond = _exact_classes(_leet_forms())
    letter = "(?:{}|{})".format(*_exact_classes(_latin_forms()))
    lead = _with_beyond_bmp(leet_bmp)
    beside = f"(?<={letter}.)(?<![!¡])|(?={letter})"
    # or one character of a word spelled out (p.0.r.n, h e r 0): two single letters after it, or before it, each
    # behind one separator
    spelled = f"(?=(?P<sep>{_SEPARATOR}){letter}(?P=sep){letter})|(?<={letter}{_SEPARATOR}{letter}{_SEPARATOR}.)"
    return re.compile(f"{lead}(?<={leet_bmp}|{leet_beyond})(?:{beside}|{spelled})")


#: a separator between the characters of a word spelled out: not part of a word, not a line break
_SEPARATOR = "(?:[^\\w\\n@$!|+€¡]|_)"


def _exact_classes(chars: Iterable[str]) -> tuple[str, str]:
    """``_exact_class`` of the ``chars`` in the BMP, and of those beyond it (a class of the BMP only is a bitmap)."""
    chars = list(chars)
    return _exact_class(c for c in chars if ord(c) <= 0xFFFF), _exact_class(c for c in chars if ord(c) > 0xFFFF)


def _rewrite(text: str, contextual: frozenset[str], grams: frozenset[str] | None) -> tuple[str, list[int]] | None:
    """The contextual rewrite, one code point for one: (rewritten text, rule bits per original character), or
    None when nothing changed. Only the words around the ``contextual`` characters are looked at. Words are maximal
    runs of letters, digits, leet symbols and invisible characters, or a word spelled out (p.0.r.n); leet and Latin
    look-alikes are folded only in a word with at least one Latin letter (or a word made only of look-alikes: an
    all-Cyrillic ``ѕех``, or a single one next to a Latin word)."""
    latin, cjk = _confusables()
    n = len(text)
    out = _Rewritten(text)
    done = 0  # everything before this index has been looked at
    for i in compress(range(n), map(contextual.__contains__, text)):
        if i < done:
            continue
        target = cjk.get(text[i])
        if target is not None:
            out.put(i, target, CONFUSABLE)
            done = i + 1
            continue
        if (i == 0 or not _in_word(text[i - 1])) and (i + 1 == n or not _in_word(text[i + 1])):  # alone
            units = _spelled_out(text, i, done)
            if units is not None:  # one character of a word spelled out: p.0.r.n
                done = units[-1] + 1
                out.fold(units, latin, grams)
                continue
            if text[i] not in latin:
                continue  # a digit or symbol on its own ("5 %", "！")
        start, end = i, i
        while start > done and _in_word(text[start - 1]):
            start -= 1
        while end < n and _in_word(text[end]):
            end += 1
        done = max(end, i + 1)
        if end > start:
            out.fold(range(start, end), latin, grams)
    return out.result()


class _Rewritten:
    """The text being rewritten: its characters and each one's rule bits, copied at the first change."""

    __slots__ = ("chars", "masks", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.chars: list[str] | None = None
        self.masks: list[int] = []

    def put(self, at: int, char: str, bits: int) -> None:
        if self.chars is None:
            self.chars, self.masks = list(self.text), [0] * len(self.text)
        self.chars[at] = char
        self.masks[at] = bits

    def fold(self, places: Sequence[int], latin: dict[str, str], grams: frozenset[str] | None) -> None:
        """Reads the word at ``places`` (consecutive, or the characters of a word spelled out) by ``_fold_word``."""
        current = self.text if self.chars is None else self.chars
        word = "".join(current[k] for k in places)
        found = _fold_word(word, current, places[0], places[-1] + 1, latin, grams)
        if found is not None:
            offset, letters, bits = found
            for k, letter, bit in zip(places[offset:], letters, bits, strict=False):
                self.put(k, letter, bit)

    def result(self) -> tuple[str, list[int]] | None:
        return ("".join(self.chars), self.masks) if self.chars is not None else None


#: a word spelled out holds this many characters at least, each behind at most _SPELLED_GAP separators
_SPELLED_UNITS = 3
_SPELLED_GAP = 3


def _spelled_out(text: str, i: int, done: int) -> list[int] | None:
    """The places of the characters of a word spelled out around ``text[i]`` (single word characters, each behind
    one to ``_SPELLED_GAP`` separators: p.0.r.n, h e r 0 i n), or None when there is no such word of
    ``_SPELLED_UNITS`` characters or more, one of them a Latin letter, none before ``done``."""
    units = [i]
    k = i
    while True:  # to the left
        j, gap = k - 1, 0
        while j >= done and gap < _SPELLED_GAP and _separator(text[j]):
            j, gap = j - 1, gap + 1
        if gap == 0 or j < done or not _in_word(text[j]) or (j > 0 and _in_word(text[j - 1])):
            break
        units.insert(0, j)
        k = j
    k, n = i, len(text)
    while True:  # to the right
        j, gap = k + 1, 0
        while j < n and gap < _SPELLED_GAP and _separator(text[j]):
            j, gap = j + 1, gap + 1
        if gap == 0 or j >= n or not _in_word(text[j]) or (j + 1 < n and _in_word(text[j + 1])):
            break
        units.append(j)
        k = j
    if len(units) < _SPELLED_UNITS or not any(_latin_letter(text[k]) for k in units):
        return None
    return units


@cache
def _separator(ch: str) -> bool:
    """A character between those of a word spelled out: not of a word, no letter or digit (an ideograph ends it),
    no line break."""
    return not _in_word(ch) and not ch.isalnum() and ch not in "\n\r"


@cache
def _word_fold() -> tuple[dict[int, str], dict[str, int]]:
    """(for ``str.translate``: each look-alike of a Latin letter and each leet digit or symbol, in any form NFKC
    folds, as the letter it stands for, "1" for i or l; each of them -> its rule's bit)."""
    latin, _ = _confusables()
    table: dict[int, str] = {}
    bits: dict[str, int] = {}
    for ch in _ascii_forms():
        leet = _leet(ch)
        if leet is not None:
            table[ord(ch)] = leet
            bits[ch] = LEET  # also for a "1" kept as it is: a hit through it used the rule
    for ch, letter in latin.items():
        table[ord(ch)] = letter
        bits[ch] = CONFUSABLE
    return table, bits


def _fold_word(
    word: str, chars: str | list[str], start: int, end: int, latin: dict[str, str], grams: frozenset[str] | None
) -> tuple[int, str, list[int]] | None:
    """The leet and look-alike reading of the ``word`` that ``chars[start:end]`` holds (spelled out, its characters
    only): (where it starts in the word, its letters, the rule of each), or None when the word is not one to read
    so, or (with ``grams``) its reading lies inside no Latin lexicon word, whole or without the symbols at its ends
    (5G, 4K, 7pm; p0rn!!! is p0rn)."""
    table, kinds = _word_fold()
    bits = [kinds.get(c, 0) for c in word]
    if not any(bits) or not _eligible(chars, word, start, end, latin):
        return None
    new = word.translate(table)
    if grams is None or _worth(new, grams):
        return 0, new, bits
    a, b = 0, len(new)
    while a < b and _leet_symbol(word[a]):
        a += 1
    while b > a and _leet_symbol(word[b - 1]):
        b -= 1
    if (a, b) == (0, len(new)) or not any(bits[a:b]) or not _worth(new[a:b], grams):
        return None
    return a, new[a:b], bits[a:b]


@cache
def _in_word(ch: str) -> bool:
    """A character of a word for the contextual rewrite (not an ideograph, nor a CJK look-alike)."""
    latin, cjk = _confusables()
    if ch in cjk or is_cjk(ch):
        return False
    if ch in LEET_SYMBOLS or ch in latin or unicodedata.normalize("NFKC", ch) in LEET_SYMBOLS or _latin_letter(ch):
        return True  # a Latin letter in any form NFKC folds (ⓟ is a symbol to Unicode)
    category = unicodedata.category(ch)
    return category[0] in "LNM" or category == "Cf"


def _is_latin_letter(ch: str) -> bool:
    """A Latin letter once NFKC-folded (ａ, 𝐚, ⓐ, ſ ...)."""
    folded = unicodedata.normalize("NFKC", ch)
    return len(folded) == 1 and "a" <= folded.casefold() <= "z"


_latin_letter = cache(_is_latin_letter)


def _near_latin(chars: str | list[str], start: int, end: int, latin: dict[str, str]) -> bool:
    """Whether the nearest word before or after chars[start:end] (past blanks) ends / starts with a Latin letter
    or a look-alike of one."""
    before = start - 1
    while before >= 0 and chars[before] in " \t":
        before -= 1
    after = end
    while after < len(chars) and chars[after] in " \t":
        after += 1
    return any(
        0 <= k < len(chars) and k not in range(start, end) and (_latin_letter(chars[k]) or chars[k] in latin)
        for k in (before, after)
    )


@cache
def _latin_class() -> re.Pattern[str]:
    return re.compile("{}|{}".format(*_exact_classes(_latin_forms())))


def _eligible(chars: str | list[str], word: str, start: int, end: int, latin: dict[str, str]) -> bool:
    """A word (``chars[start:end]``) with a Latin letter, or of look-alikes only in a text that is not Greek,
    Cyrillic or Armenian (no other letter of those scripts in it: ``как`` in a Russian sentence stays): two letters
    or more (ѕех), or one next to a Latin word (buy α gun)."""
    if _latin_class().search(word) is not None:
        return True
    letters = [c for c in word if unicodedata.category(c)[0] == "L" or c in latin]  # 🅲 is a symbol to Unicode
    if not letters or not all(c in latin for c in letters):
        return False
    if any(0x0370 <= ord(c) <= 0x058F and c not in latin and unicodedata.category(c)[0] == "L" for c in chars):
        return False
    return len(letters) > 1 or _near_latin(chars, start, end, latin)


@cache
def _leet_symbol(ch: str) -> bool:
    """A leet symbol in any form NFKC folds (＠, ！): at the ends of a word it may be punctuation."""
    return unicodedata.normalize("NFKC", ch) in LEET_SYMBOLS


def _leet(ch: str) -> str | None:
    """The letter a digit or leet symbol (in any form NFKC folds) stands for ("1" for i or l), else None."""
    plain = unicodedata.normalize("NFKC", ch)
    return LEET_SYMBOLS.get(plain) or LEET_DIGITS.get(plain)


def _worth(new: str, grams: frozenset[str]) -> bool:
    """Whether a word's reading may lie inside a Latin lexicon word (its letters as NFKC folds them: 𝐩𝐨𝐫𝐧 is porn)."""
    plain = new.casefold()
    if not plain.isascii():
        plain = unicodedata.normalize("NFKC", plain).casefold()
    return not (plain.isascii() and plain.isalnum()) or _in_some_key(plain, grams)


def _in_some_key(word: str, grams: frozenset[str]) -> bool:
    """Whether ``word`` (rewritten, one word of the text) may be part of a Latin lexicon word whose pieces are
    ``grams`` (``key_grams``): a single letter (spelled out) always, two letters only as a word of its own in the
    lexicon (``qq``, not the ``ak`` of 4K inside ``fake``), else every three letters in a row in a key."""
    if len(word) < 3:
        return len(word) == 1 or word in grams
    return grams.issuperset([word[i : i + 3] for i in range(len(word) - 2)])


def key_grams(keys: Iterable[str], words: Iterable[str]) -> frozenset[str]:
    """For ``fold``'s ``grams``: the pieces of three characters of the Latin runs of the folded lexicon keys,
    and the words of two letters of the lexicon words (a hit holds whole words of the text)."""
    grams: set[str] = set()
    for key in keys:
        for run in re.findall(r"[a-z0-9]+", key):
            grams.update(run[i : i + 3] for i in range(len(run) - 2))
    for word in words:
        plain = unicodedata.normalize("NFKC", word).casefold()
        grams.update(token for token in re.findall(r"[a-z0-9]+", plain) if len(token) == 2)
    return frozenset(grams)


def _plus(text: str, rewritten: tuple[str, list[int]] | None) -> tuple[str, list[int]] | None:
    """The ``letter`` rule's one symbol: a plus sign for 加 ("add") before a CJK character (+微信), or before a
    Latin letter where it starts a word (+V信, +QQ); not in 5+3, C++, +86."""
    chars = list(rewritten[0]) if rewritten is not None else list(text)
    masks = rewritten[1] if rewritten is not None else [0] * len(text)
    changed = False
    for i in range(len(text) - 1):
        if text[i] not in "+＋":
            continue
        after = text[i + 1]
        starts_word = i == 0 or not text[i - 1].isalnum()
        if is_cjk(after) or (starts_word and _latin_letter(after)):
            chars[i] = "加"
            masks[i] = LETTER
            changed = True
    return ("".join(chars), masks) if changed else rewritten


#: blocks whose characters NFKC turns into ideographs (Kangxi and CJK radicals, enclosed and compatibility forms)
_NFKC_TO_CJK_RANGES = ((0x2E80, 0x2FDF), (0x3200, 0x33FF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


@cache
def _anywhere() -> frozenset[str]:
    """The characters that send a text to the rules wherever they stand: look-alikes, the ideographs of the CJK
    table and the characters NFKC turns into one of them (a Kangxi radical ⾺ for 馬), and the ``letter`` rule's
    plus signs. The other characters a rule may change (leet digits and symbols) count only next to a Latin
    letter (``_leet_near_letter``): "5 %", "2024" or "!" after a word change nothing."""
    sources = _cjk_sources()
    through_nfkc = {
        chr(cp)
        for low, high in _NFKC_TO_CJK_RANGES
        for cp in range(low, high + 1)
        if not sources.isdisjoint(unicodedata.normalize("NFKC", chr(cp)))
    }
    return frozenset(_special()[1] | sources | through_nfkc | {"+", "＋"})


@cache
def _char_class(chars: frozenset[str]) -> re.Pattern[str]:
    """One regular-expression character class of the `chars` of the Basic Multilingual Plane, and every character
    outside it: a class of the BMP only is a bitmap searched at C speed (thousands of ranges beyond it are tried
    one by one)."""
    return re.compile(_with_beyond_bmp(_exact_class(c for c in chars if ord(c) <= 0xFFFF)))


@cache
def _anywhere_class() -> re.Pattern[str]:
    """Any character of ``_anywhere`` in the BMP, or any character beyond it (``_char_class``)."""
    return _char_class(_anywhere())


def needs_fold(text: str) -> bool:
    """Whether a rule may change ``text``; when not, ``fold(text)`` is ``normalize(text)`` with no rule bits. Two
    searches at C speed: for a character of ``_anywhere`` (the few beyond the BMP checked one by one), and for a
    leet character next to a Latin letter."""
    anywhere, pattern = _anywhere(), _anywhere_class()
    found = pattern.search(text)
    while found is not None:
        if found.group() in anywhere:
            return True
        found = pattern.search(text, found.end())
    return _leet_near_letter().search(text) is not None


def fold(text: str, grams: frozenset[str] | None = None, special: bool = False) -> Folded:
    """Normalise ``text`` (``normalize``) after the contextual rewrite, then fold CJK forms; the rule bits of
    every normalised character that a rule changed. With ``grams`` (``key_grams`` of the lexicon), a word is
    rewritten only when its rewritten form may lie inside a Latin lexicon word (a hit must hold whole words).
    ``special``: the caller knows that ``needs_fold(text)``."""
    contextual, looks = _special()
    if not special and not needs_fold(text):
        return Folded(normalize(text), None)
    needs_rewrite = not looks.isdisjoint(text) or _leet_near_letter().search(text) is not None
    rewritten = _rewrite(text, contextual, grams) if needs_rewrite else None
    if "+" in text or "＋" in text:
        rewritten = _plus(text, rewritten)
    if rewritten is None:
        normalized = normalize(text)
        pre: list[int] | None = None
    else:
        normalized = normalize(rewritten[0])
        pre = rewritten[1]
    plain = normalized.text
    rules = _cjk_rule()
    changed = [(m.start(), rules[ch]) for m in _cjk_source_class().finditer(plain) if (ch := m.group()) in rules]
    if pre is None and not changed:
        return Folded(normalized, None)
    offsets = normalized.offsets
    masks = list(map(pre.__getitem__, offsets)) if pre is not None else [0] * len(plain)
    if changed:
        for i, rule in changed:
            masks[i] |= rule
        normalized = Normalized(plain.translate(_cjk_table()), offsets, normalized.ends)
    return Folded(normalized, tuple(masks) if any(masks) else None)
