"""Unit tests of the disguise rules (worker_svc.text.rules, variants, phonetic) through the Matcher: each folding
finds the word and its hit points at the original characters, names the rule, and keeps ordinary text alone;
the rules switch per category; Latin words hit only on word boundaries of the original text."""

from __future__ import annotations

from typing import cast

import asyncpg
import pytest

from sieve.settings import Settings, SettingsError
from worker_svc.lexicon import Lexicon
from worker_svc.text import Matcher, RuleConfig, fold, normalize
from worker_svc.text.lexicon_file import load_lexicon_file
from worker_svc.text.matcher import Hit, LexiconEntry, MatchResult, Verdict
from worker_svc.text.rules import RULES


def _matcher(*words: tuple[str, str, int], rules: str = "") -> Matcher:
    return Matcher([LexiconEntry(w, c, s) for w, c, s in words], rules=RuleConfig.parse(rules))


@pytest.fixture(scope="module")
def default_matcher() -> Matcher:
    return Matcher(load_lexicon_file())


def _only_hit(result: MatchResult, original: str) -> Hit:
    assert len(result.hits) == 1, result.hits
    hit = result.hits[0]
    assert original[hit.start : hit.end] == hit.matched_text
    return hit


# --- each folding: the word is found, the hit is the disguised spelling in the original, the rule is named ---

FOLDINGS = [
    # (rule, lexicon word, disguised spelling)
    ("t2s", "赌博", "賭博"),
    ("t2s", "网络赌场", "網絡賭場"),
    ("variant", "卖大麻", "売大麻"),
    ("variant", "约炮", "约砲"),
    ("variant", "冰毒", "氷毒"),
    ("confusable", "casino", "cаsinо"),  # Cyrillic а and о
    ("confusable", "porn", "ρorn"),  # Greek rho
    ("confusable", "cocaine", "ϲοϲаіnе"),  # every letter a look-alike
    ("confusable", "老虎机", "老⻁机"),  # a CJK radical for the ideograph it looks like
    ("confusable", "casino", "🅲🅰🆂🅸🅽🅾"),  # boxed letters NFKC leaves alone (symbols to Unicode)
    ("confusable", "porn", "🅟🅞🅡🅝"),  # negative circled
    ("confusable", "buy weed", "buy 🇼🇪🇪🇩"),  # regional indicator letters
    ("leet", "fake passport", "f@ke p4ssp0rt"),
    ("leet", "cocaine", "c0ca1ne"),  # 1 for i
    ("leet", "phishing", "ph1sh!ng"),  # 1 and ! for i
    ("leet", "heroin", "h3ro|n"),  # | for i
    ("leet", "casino", "ca$ino"),
    ("leet", "buy a gun", "8uy 4 9un"),
    ("leet", "buy a gun", "buy @ gun"),
    ("leet", "porn", "ｐ０ｒｎ"),  # full-width digits count too
    ("leet", "porn", "𝐩0𝐫𝐧"),  # beside mathematical bold letters
    ("leet", "porn", "ⓟ0ⓡⓝ"),  # beside circled letters (a symbol to Unicode, a letter once NFKC-folded)
    ("leet", "porn", "p𝟎rn"),  # a mathematical digit
    ("leet", "fake passport", "ｆ＠ｋｅ ｐａｓｓｐｏｒｔ"),  # a full-width at sign
    ("leet", "porn", "p.0.r.n"),  # spelled out, one character at a time
    ("leet", "heroin", "h e r 0 i n"),
    ("leet", "cocaine", "c-0-c-a-1-n-e"),
    ("leet", "free money", "f.r.3.3 m.0.n.3.y"),
    ("letter", "加微信", "加V信"),
    ("letter", "加微信", "加vx"),
    ("letter", "约炮", "约P"),
    ("letter", "加微信", "+微信"),  # a plus sign for 加
    ("letter", "加微信", "+V信"),
    ("letter", "六合彩", "六h彩"),
    ("letter", "时时彩", "SSC"),  # all initials, in a Chinese text
    ("decompose", "枪支", "木仓支"),
    ("decompose", "赌博", "贝者博"),
    ("decompose", "毒品", "毒口口口"),
    ("pinyin", "冰毒", "bing毒"),
    ("pinyin", "冰毒", "冰du"),
    ("pinyin", "赌博", "du bo"),
    ("pinyin", "免费领取", "MianFei领取"),
    ("homophone", "赌博", "堵博"),
    ("homophone", "冰毒", "兵毒"),
]


@pytest.mark.parametrize(("rule", "word", "disguised"), FOLDINGS)
def test_a_folding_finds_the_word_and_points_at_the_original_characters(rule: str, word: str, disguised: str) -> None:
    # Given the word in a lexicon, and a text that hides it between other characters
    matcher = _matcher((word, "x", 3))
    original = f"【广告】 {disguised}，私聊"

    # When the text is matched
    hit = _only_hit(matcher.match(original), original)

    # Then the hit is the lexicon word, its span is exactly the disguised spelling, and it names the rule
    assert hit.word == word
    assert hit.matched_text == disguised
    assert (hit.start, hit.end) == (original.index(disguised), original.index(disguised) + len(disguised))
    assert hit.rules == [rule]


def test_a_plain_hit_names_no_rule() -> None:
    original = "这里有赌博和 casino"
    result = _matcher(("赌博", "x", 3), ("casino", "x", 2)).match(original)

    assert [(h.word, h.rules) for h in result.hits] == [("赌博", []), ("casino", [])]


def test_two_rules_in_one_word_are_both_named() -> None:
    original = "buy ϲ0caine now"  # a Greek lunate sigma for c, and 0 for o
    hit = _only_hit(_matcher(("cocaine", "drugs", 3)).match(original), original)

    assert hit.matched_text == "ϲ0caine"
    assert hit.rules == ["confusable", "leet"]


def test_traditional_characters_with_separators_map_back_to_the_original() -> None:
    original = "他們在 賭.博，还有網 絡 賭 場"
    result = _matcher(("赌博", "x", 3), ("网络赌场", "x", 3)).match(original)

    assert [(h.word, h.matched_text, h.rules) for h in result.hits] == [
        ("赌博", "賭.博", ["t2s"]),
        ("网络赌场", "網 絡 賭 場", ["t2s"]),
    ]


def test_a_kangxi_radical_of_a_traditional_character_is_folded_like_the_character() -> None:
    original = "看⿈⾊网站吗"  # U+2FC8 (黃) and U+2F8A (色): NFKC makes them ideographs, t2s the simplified word

    hit = _only_hit(_matcher(("黄色网站", "porn", 3)).match(original), original)

    assert (hit.matched_text, hit.rules) == ("⿈⾊网站", ["t2s"])


@pytest.mark.parametrize(
    "text",
    [
        "Meet at 5 pm, room 204!",
        "价格 120 元，好评！",
        "5+3 = 8",
        "＋86 电话",
        "5 m³ of water, CO₂ levels",  # superscripts and subscripts are units and formulas
        "新品！iPhone｜Pro",  # the full-width ！ and ｜ are Chinese punctuation
    ],
)
def test_text_with_digits_and_symbols_but_no_disguise_folds_as_normalize_does(text: str) -> None:
    folded = fold(text)

    assert folded.normalized == normalize(text) and folded.masks is None


def test_the_fold_keeps_one_normalised_character_per_original_one() -> None:
    original = "ｃ４ｓｉｎｏ 賭博 ѕех"
    folded = fold(original)

    assert folded.normalized.text == "casino赌博sex"
    assert folded.masks is not None
    spans = [folded.normalized.span(i, i + 1) for i in range(len(folded.normalized.text))]
    assert [original[a:b] for a, b in spans] == list("ｃ４ｓｉｎｏ賭博ѕех")


# --- what the rules leave alone -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "价格5000元，2026年12月2日发货",
        "call 555 0100 at 7pm, 4 adults and 2 kids",
        "room 2 0 4, 5 a day, at 7 p m",  # single digits and letters between spaces spell nothing
        "COVID-19 cases fell 3% in Q3; win 10 iPhone 15 cases",
        "Привет, как дела? Всё хорошо",  # Cyrillic words stay Cyrillic
        "Καλημέρα από την Αθήνα",
    ],
)
def test_numbers_and_other_scripts_are_not_rewritten(default_matcher: Matcher, text: str) -> None:
    result = default_matcher.match(text)

    assert result.hits == ()
    assert result.normalized_text == normalize(text).text


def test_a_word_of_look_alikes_is_read_as_latin_outside_greek_and_cyrillic_text() -> None:
    matcher = _matcher(("sex", "x", 3))

    assert [h.matched_text for h in matcher.match("free ѕех chat").hits] == ["ѕех"]  # all Cyrillic
    assert matcher.match("Привет, как дела? ѕех").hits == ()  # a Russian sentence


@pytest.mark.parametrize(
    "text",
    [
        "最近流感病毒很多，注意防护",  # 病毒 bìng dú: not 冰毒 bīng dú
        "士兵毒死了害虫",  # 兵毒 is cut out of 士兵
        "我在读博士",  # 读博 cut out of 博士
        "Du博士明天来开会",
        "他很会看人",  # 看 kàn is no 砍 kǎn
        "买Q币充值",  # Q is no letter for 枪
        "微信号+86 138 0000 0000，C++ 和 5+3 都行",  # no plus sign for 加 here
        "换个彩色Q版头像",  # 彩色|Q版: no 色Q for 色情
        "Auguste Dupin solved the case",  # pinyin of 毒品 in an English sentence
        "强制执行的照片",
    ],
)
def test_ordinary_words_that_sound_like_lexicon_words_do_not_hit(default_matcher: Matcher, text: str) -> None:
    assert default_matcher.match(text).hits == ()


def test_pinyin_in_latin_letters_only_needs_a_chinese_text_or_a_pinyin_one() -> None:
    matcher = _matcher(("赌博", "gambling", 3), ("时时彩", "gambling", 3))

    assert [h.matched_text for h in matcher.match("一起 dubo 吗").hits] == ["dubo"]  # a Chinese text
    assert [h.matched_text for h in matcher.match("dubo wangzhan").hits] == ["dubo"]  # a text in pinyin
    assert matcher.match("Dubo is a surname, Dubois too").hits == ()  # an English one
    assert matcher.match("the SSC results are out").hits == ()


def test_fuzzy_hits_are_never_more_than_review() -> None:
    matcher = _matcher(("冰毒", "drugs", 3), ("海洛因", "drugs", 3))

    plain = matcher.match("出售冰毒")
    by_sound = matcher.match("出售bing毒和兵毒")

    assert plain.verdict is Verdict.BLOCK
    assert by_sound.verdict is Verdict.REVIEW
    assert {(h.matched_text, h.severity) for h in by_sound.hits} == {("bing毒", 2), ("兵毒", 2)}


# --- rules switched per category ------------------------------------------------------------------------------


def test_the_rule_setting_is_parsed() -> None:
    config = RuleConfig.parse("drugs=t2s,leet; spam=none; *=all,-pinyin")

    assert config.bits("drugs") == RuleConfig.parse("*=t2s,leet").default
    assert config.bits("spam") == 0
    assert (
        config.bits("gambling") == config.default == RuleConfig.parse("*=all").default & ~(1 << RULES.index("pinyin"))
    )
    assert RuleConfig.parse("").bits("anything") == RuleConfig().default


@pytest.mark.parametrize("spec", ["drugs=t2s,bogus", "=t2s", "drugs"])
def test_a_bad_rule_setting_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        RuleConfig.parse(spec)


def test_the_worker_refuses_an_unknown_rule_naming_the_setting() -> None:
    settings = Settings.from_env({"SIEVE_TEXT_RULES": "drugs=t2s,nope"})  # well formed, unknown rule

    with pytest.raises(ValueError, match="SIEVE_TEXT_RULES: unknown rule 'nope'"):
        Lexicon(cast("asyncpg.Pool", None), settings)
    assert (
        Lexicon(cast("asyncpg.Pool", None), Settings.from_env({"SIEVE_TEXT_RULES": "drugs=t2s"})).rules.bits("drugs")
        == RuleConfig.parse("*=t2s").default
    )


def test_the_settings_refuse_a_malformed_rule_setting() -> None:
    assert Settings.from_env({"SIEVE_TEXT_RULES": "drugs=t2s,leet;*=all"}).text_rules == "drugs=t2s,leet;*=all"
    with pytest.raises(SettingsError, match="SIEVE_TEXT_RULES"):
        Settings.from_env({"SIEVE_TEXT_RULES": "drugs t2s"})


@pytest.mark.parametrize(("rule", "word", "disguised"), FOLDINGS)
def test_a_rule_switched_off_for_a_category_finds_nothing_there_and_stays_on_elsewhere(
    rule: str, word: str, disguised: str
) -> None:
    # Given the same word in two lexicons: one whose category has the rule off, one with every rule on
    off = _matcher((word, "drugs", 3), rules=f"drugs=all,-{rule}")
    on = _matcher((word, "gambling", 3), rules=f"drugs=all,-{rule}")
    original = f"看这里 {disguised} 吧"

    # Then the disguised spelling is found only where the rule is on, and the plain word everywhere
    assert off.match(original).hits == ()
    assert [h.word for h in on.match(original).hits] == [word]
    assert [h.word for h in off.match(f"看这里 {word} 吧").hits] == [word]


def test_all_rules_off_is_plain_matching() -> None:
    matcher = _matcher(("赌博", "gambling", 3), ("casino", "gambling", 2), rules="*=none")

    assert matcher.match("賭博 c4sino 堵博 dubo 贝者博").hits == ()
    assert [h.word for h in matcher.match("赌博 casino").hits] == ["赌博", "casino"]


def test_a_traditional_lexicon_word_matches_itself_with_t2s_off() -> None:
    # the word folds like the text, so its own spelling needs no rule
    matcher = _matcher(("賭博", "gambling", 3), rules="*=none")

    hit = _only_hit(matcher.match("他们在賭博"), "他们在賭博")
    assert hit.rules == []


# --- Latin words hit only on word boundaries of the original text ---------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "the heroine of the film",
        "she put coins in the moneybox",
        "buy weedkiller for the garden",
        "tax-free Moneyball",
        "we offer a free moneyback guarantee",
        "I wanted to buy a gunmetal grey one",
        "John's ex-wife moved to Essex",
        "this is exactly it",
        "He's a hero in his hometown",  # two words: a blank splits heroin where it has none
        "a free moneyclip",
    ],
)
def test_a_latin_word_inside_a_longer_word_does_not_hit(text: str) -> None:
    matcher = _matcher(
        ("heroin", "drugs", 3),
        ("free money", "spam", 1),
        ("buy weed", "drugs", 2),
        ("buy a gun", "x", 3),
        ("sex", "x", 3),
    )

    assert matcher.match(text).hits == ()


@pytest.mark.parametrize(
    ("text", "matched"),
    [
        ("-> S.E.X <-", "S.E.X"),
        ("s e x", "s e x"),
        ("play c-a-s-i-n-o games", "c-a-s-i-n-o"),
        ("online casinos are open", "casino"),  # an English plural still ends the word
        ("the casino's lights", "casino"),
        ("去casino玩", "casino"),  # CJK characters are no letters
        ("casino2024 bonus", "casino"),  # nor are digits
        ("(casino)", "casino"),
        ("h e r o i n for sale", "h e r o i n"),  # spelled out
        ("her.oin", "her.oin"),  # other separators split it as they like
        ("free\n money today", "free\n money"),  # the lexicon word's own blank
    ],
)
def test_a_latin_word_on_word_boundaries_hits(text: str, matched: str) -> None:
    matcher = _matcher(("sex", "x", 3), ("casino", "x", 2), ("heroin", "x", 3), ("free money", "x", 1))

    assert [h.matched_text for h in matcher.match(text).hits] == [matched]


def test_cjk_words_match_without_boundaries() -> None:
    matcher = _matcher(("赌博", "x", 3))

    assert [h.matched_text for h in matcher.match("网上赌博网站").hits] == ["赌博"]
