"""Spellings a lexicon word gets besides its own (the lexicon side of the ``leet``, ``letter`` and ``decompose``
rules of ``worker_svc.text.rules``), each the folded text of a key of the matcher and the rule it needs.

* ``leet``: ``1``, ``!`` and ``|`` stand for ``i`` or ``l``; the text keeps them as ``1`` and a Latin word gets
  the spellings with ``1`` for its ``i``/``l`` (all of them for up to ``MAX_AMBIGUOUS`` such letters, else one
  at a time and all at once), and a phrase's one-letter words as digits (``buy 4 gun``).
* ``letter``: a Latin letter standing for a character: ``LETTERS`` (V for 微, P for 炮 …, the well-known ones,
  in words of two characters or more) and, in words of three CJK characters or more, the initial of a
  character's pinyin (加w信, 六h彩); at most two characters of a word, and at least one stays a character; and a
  word of three characters or more as the initials of all of them (lhc for 六合彩), which like pinyin hits only in
  a text with CJK characters (``worker_svc.text.phonetic.plausible``).
* ``decompose``: a character written as its parts (``DECOMPOSE``: 木仓 for 枪, 弓长 for 张), one character at a
  time and all of them at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations, product

from worker_svc.text.rules import AMBIGUOUS, is_cjk

__all__ = ["DECOMPOSE", "LETTERS", "decomposed", "initialisms", "leet_spellings", "leet_words", "letter_spellings"]

MAX_AMBIGUOUS = 5

#: letters well known to stand for a character in Chinese text (加V信 for 加微信, 约P for 约炮)
LETTERS: dict[str, str] = {
    "微": "vw", "威": "vw", "信": "x", "炮": "p", "博": "b", "赌": "d", "毒": "d", "品": "p", "色": "s",
    "情": "q", "裸": "l", "聊": "l", "援": "y", "交": "j", "约": "y", "码": "m", "彩": "c", "钱": "q",
    "粉": "f", "单": "d", "骗": "p", "诈": "z", "黄": "h", "嫖": "p", "娼": "c", "妓": "j", "群": "q",
}  # fmt: skip

#: characters as their parts (left-right or top-bottom), for the characters of the default lexicon and common
#: ones; the parts are ordinary characters (or radicals that have a code point of their own)
DECOMPOSE: dict[str, str] = {
    "赌": "贝者", "博": "十尃", "品": "口口口", "冰": "冫水", "海": "氵每", "洛": "氵各", "枪": "木仓",
    "炸": "火乍", "药": "艹约", "雷": "雨田", "管": "竹官", "砍": "石欠", "诈": "讠乍", "骗": "马扁",
    "洗": "氵先", "钱": "钅戋", "假": "亻叚", "证": "讠正", "情": "忄青", "裸": "衤果", "聊": "耳卯",
    "援": "扌爰", "约": "纟勺", "炮": "火包", "视": "礻见", "频": "步页", "信": "亻言", "领": "令页",
    "取": "耳又", "码": "石马", "红": "纟工", "赚": "贝兼", "颠": "真页", "政": "正攵", "权": "木又",
    "煽": "火扇", "动": "云力", "敏": "每攵", "感": "咸心", "词": "讠司", "彩": "采彡", "球": "王求",
    "机": "木几", "吗": "口马", "啡": "口非", "粉": "米分", "吸": "口及", "猪": "犭者", "盘": "舟皿",
    "票": "西示", "现": "王见", "贷": "代贝", "秒": "禾少", "批": "扌比", "购": "贝勾", "站": "立占",
    "张": "弓长", "好": "女子", "妈": "女马", "明": "日月", "林": "木木", "吧": "口巴", "加": "力口",
    "婊": "女表", "嫖": "女票", "娼": "女昌", "妓": "女支", "奸": "女干", "弹": "弓单", "烟": "火因",
    "赃": "贝庄", "偷": "亻俞", "抢": "扌仓", "爆": "火暴", "物": "牛勿", "微": "彳敚", "枚": "木攵",
    "秘": "禾必", "汉": "氵又", "淫": "氵㸒", "妹": "女未", "鸡": "又鸟", "狗": "犭句", "毒": "龶母",
    "裂": "列衣", "搞": "扌高", "诱": "讠秀", "惑": "或心", "拐": "扌另", "卖": "十买", "粮": "米良",
    "骰": "骨殳", "输": "车俞", "钞": "钅少", "砂": "石少", "晶": "日日日",
}  # fmt: skip


def leet_spellings(key: str) -> Iterator[str]:
    """The spellings of a folded Latin key with ``1`` for some of its ``i`` and ``l`` (not the key itself)."""
    positions = [i for i, ch in enumerate(key) if ch in "il"]
    if not positions:
        return
    choices: list[tuple[bool, ...]]
    if len(positions) <= MAX_AMBIGUOUS:
        choices = [c for c in product((False, True), repeat=len(positions)) if any(c)]
    else:
        choices = [tuple(i == k for i in range(len(positions))) for k in range(len(positions))]
        choices.append((True,) * len(positions))
    for choice in choices:
        chars = list(key)
        for position, replaced in zip(positions, choice, strict=True):
            if replaced:
                chars[position] = AMBIGUOUS
        yield "".join(chars)


#: a word of one letter written as a digit or a symbol (buy 4 gun, buy @ gun)
_LEET_LETTER_WORDS = {"a": ("4", "@"), "o": ("0",)}


def leet_words(word: str) -> list[str]:
    """A lexicon phrase with its one-letter words as digits or symbols (``buy a gun`` -> ``buy 4 gun``,
    ``buy @ gun``)."""
    parts = word.split(" ")
    if len(parts) < 2 or not any(p.lower() in _LEET_LETTER_WORDS for p in parts):
        return []
    options = [_LEET_LETTER_WORDS.get(p.lower(), (p,)) for p in parts]
    return [" ".join(choice) for choice in product(*options)]


def initialisms(key: str, initials: dict[str, str]) -> list[str]:
    """A folded key of three CJK characters or more (and nothing else) as the initials of their pinyin
    (六合彩 -> lhc, 时时彩 -> ssc)."""
    if len(key) < 3 or not all(ch in initials for ch in key):
        return []
    return ["".join(initials[ch] for ch in key)]


def letter_spellings(key: str, initials: dict[str, str]) -> Iterator[str]:
    """A folded key with one or two of its CJK characters as a Latin letter (see the module docstring);
    ``initials`` gives the initial of each character's pinyin."""
    cjk = [i for i, ch in enumerate(key) if is_cjk(ch)]
    if len(cjk) < 2:
        return
    options: dict[int, str] = {}
    for i in cjk:
        letters = set(LETTERS.get(key[i], ""))
        if len(cjk) >= 3 and key[i] in initials:
            letters.add(initials[key[i]])
        if letters:
            options[i] = "".join(sorted(letters))
    most = 2 if len(cjk) >= 3 else 1
    for count in range(1, most + 1):
        for chosen in combinations(sorted(options), count):
            if count >= len(cjk):
                continue
            for picked in product(*(options[i] for i in chosen)):
                chars = list(key)
                for i, letter in zip(chosen, picked, strict=True):
                    chars[i] = letter
                yield "".join(chars)


def decomposed(key: str) -> Iterator[str]:
    """A folded key with one of its characters as its parts, and with all of them at once."""
    positions = [i for i, ch in enumerate(key) if DECOMPOSE.get(ch, ch) != ch]
    for i in positions:
        yield key[:i] + DECOMPOSE[key[i]] + key[i + 1 :]
    if len(positions) > 1:
        yield "".join(DECOMPOSE.get(ch, ch) for ch in key)
