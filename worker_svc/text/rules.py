"""The disguise-folding rules of the matcher, and the folded view of a text they give (``fold``).

``worker_svc.text.normalize`` folds what is never meaningful (width, case, separators, invisible
characters). The rules here fold what is *usually* a disguise, and each of them can be switched per
lexicon category (``RuleConfig``, the ``SIEVE_TEXT_RULES`` setting) and is named in every hit it made
possible. Rules that rewrite the text (``fold``), one original code point to one, so that the map back to
the original characters stays exact:

* ``t2s`` traditional Chinese characters to simplified ones (OpenCC's ``t2s`` dictionary, character by
  character: 賭博 -> 赌博);
* ``variant`` CJK variant forms to the standard one (OpenCC's Taiwan, Hong Kong and Japanese shinjitai
  variant dictionaries, and a small table of old forms they do not cover: 靑 -> 青, 砲 -> 炮);
* ``confusable`` look-alike letters to their Latin skeleton inside Latin-script words (Cyrillic ``а``,
  Greek ``ο`` … in ``cаsinο``; the Unicode confusables table, ``confusable-homoglyphs``' data), and CJK
  radicals and strokes to the ideograph they look like (⺟ -> 母);
* ``leet`` digits and symbols for letters inside a word that has Latin letters (``f@ke p4ssport``,
  ``c0ca1ne``): ``4 @`` -> a, ``3 €`` -> e, ``0`` -> o, ``5 $`` -> s, ``7 +`` -> t, ``8`` -> b, ``9`` -> g;
  ``1 ! |`` stand for either ``i`` or ``l`` and are kept as ``1``, which the lexicon side expands
  (``worker_svc.text.variants``). A number on its own (``5 000``, ``2026``) is never touched.

Rules that add spellings to the lexicon side (``worker_svc.text.variants``, ``worker_svc.text.phonetic``):
``letter`` (a Latin letter for a character: 加V信, 约p), ``decompose`` (a character written as its parts:
木仓 for 枪), ``pinyin`` (the pinyin of a CJK word in Latin letters) and ``homophone`` (other characters of
the same pinyin). Hits that need ``pinyin``, ``homophone`` or ``letter`` are fuzzier: ``FUZZY_RULES``, their
severity is lowered so that they are never more than REVIEW.

``Folded.masks[i]`` holds the bits (``RULE_BITS``) of the rules that changed normalised character ``i``;
``masks`` is ``None`` when no rule changed anything (the common case, which costs one regular-expression
scan and one ``str.translate`` more than ``normalize``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from worker_svc.text.normalize import Normalized, normalize

__all__ = [
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


def rule_names(bits: int) -> list[str]:
    """The names of the rules in ``bits``, in ``RULES`` order."""
    return [name for name in RULES if bits & RULE_BITS[name]]


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
        if ord(source) in table:
            continue
        for converted in variants:
            target = converted[i]
            if len(target) == 1 and target != source:
                table[ord(source)] = target
                break
    for source, target in _VARIANTS_EXTRA.items():
        table[ord(source)] = target
    return table


def _one(items: list[str]) -> list[str]:
    return [item if len(item) == 1 else "\ufffd" for item in items]


@cache
def _cjk_rule() -> dict[str, int]:
    """Which rule a change of ``_cjk_table`` is: t2s when OpenCC's t2s does it, else variant."""
    import opencc

    converter = opencc.OpenCC("t2s")
    return {chr(cp): (T2S if converter.convert(chr(cp)) == target else VARIANT) for cp, target in _cjk_table().items()}


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
    return {c: t for c, t in latin.items() if not unicodedata.category(c).startswith("N")}, cjk


#: symbols standing for letters; 1, !, | stand for i or l and stay "1" (the lexicon side expands them)
LEET_SYMBOLS = {"@": "a", "$": "s", "!": "1", "|": "1", "+": "t", "€": "e", "¡": "1"}
LEET_DIGITS = {"0": "o", "1": "1", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g"}
#: the placeholder for i or l
AMBIGUOUS = "1"


@cache
def _trigger() -> re.Pattern[str]:
    """A text can need the contextual rewrite only where this matches: a digit or leet symbol next to a Latin
    letter (half- or full-width), or a look-alike character."""
    latin, cjk = _confusables()
    letter = "A-Za-zＡ-Ｚａ-ｚ"
    leet = "0-9０-９" + re.escape("".join(LEET_SYMBOLS))
    looks = re.escape("".join(sorted({*latin, *cjk})))
    return re.compile(f"[{letter}][{leet}]|[{leet}][{letter}]|[{looks}]")


def _rewrite(text: str) -> tuple[str, list[int]] | None:
    """The contextual rewrite, one code point for one: (rewritten text, rule bits per original character), or
    None when nothing changed. Words are maximal runs of letters, digits, leet symbols and invisible characters;
    leet and Latin look-alikes are folded only in a word with at least one Latin letter (or a word made only of
    look-alikes, such as an all-Cyrillic ``ѕех``)."""
    latin, cjk = _confusables()
    chars = list(text)
    masks = [0] * len(chars)
    changed = False
    n = len(chars)
    i = 0
    while i < n:
        ch = chars[i]
        target = cjk.get(ch)
        if target is not None:
            chars[i] = target
            masks[i] = CONFUSABLE
            changed = True
            i += 1
            continue
        if not _in_word(ch, latin):
            i += 1
            continue
        j = i
        while j < n and _in_word(chars[j], latin) and chars[j] not in cjk:
            j += 1
        changed = _rewrite_word(chars, masks, i, j, latin) or changed
        i = j
    return ("".join(chars), masks) if changed else None


def _in_word(ch: str, latin: dict[str, str]) -> bool:
    if ch in LEET_SYMBOLS or ch in latin:
        return True
    if is_cjk(ch):
        return False
    category = unicodedata.category(ch)
    return category[0] in "LNM" or category == "Cf"


def _latin_letter(ch: str) -> bool:
    folded = unicodedata.normalize("NFKC", ch)
    return len(folded) == 1 and "a" <= folded.casefold() <= "z"


def _rewrite_word(chars: list[str], masks: list[int], start: int, end: int, latin: dict[str, str]) -> bool:
    word = chars[start:end]
    has_latin = any(_latin_letter(c) for c in word)
    letters = [c for c in word if unicodedata.category(c)[0] == "L"]
    if not has_latin and not (len(letters) >= 2 and all(c in latin for c in letters)):
        return False
    changed = False
    for k in range(start, end):
        c = chars[k]
        look = latin.get(c)
        if look is not None:
            chars[k] = look
            masks[k] = CONFUSABLE
            changed = True
            continue
        digit = unicodedata.normalize("NFKC", c)
        leet = LEET_SYMBOLS.get(c) or LEET_DIGITS.get(digit)
        if leet is not None and leet != digit:
            chars[k] = leet
            masks[k] = LEET
            changed = True
        elif leet is not None:
            masks[k] = LEET  # "1": kept, but a hit through it used the rule
            changed = True
    return changed


def fold(text: str) -> Folded:
    """Normalise ``text`` (``normalize``) after the contextual rewrite, then fold CJK forms; the rule bits of
    every normalised character that a rule changed."""
    rewritten = _rewrite(text) if _trigger().search(text) is not None else None
    if rewritten is None:
        normalized = normalize(text)
        pre: list[int] | None = None
    else:
        normalized = normalize(rewritten[0])
        pre = rewritten[1]
    plain = normalized.text
    folded = plain.translate(_cjk_table())
    if pre is None and folded == plain:
        return Folded(normalized, None)
    offsets = normalized.offsets
    masks = [pre[offset] for offset in offsets] if pre is not None else [0] * len(plain)
    if folded != plain:
        rules = _cjk_rule()
        for i, (a, b) in enumerate(zip(plain, folded, strict=True)):
            if a != b:
                masks[i] |= rules[a]
        normalized = Normalized(folded, offsets, normalized.ends)
    return Folded(normalized, tuple(masks) if any(masks) else None)
