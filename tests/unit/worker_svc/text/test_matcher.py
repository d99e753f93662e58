"""Unit tests of worker_svc.text.matcher and lexicon_file: hits, spans, verdicts, default lexicon."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker_svc.text.lexicon_file import load_lexicon_file
from worker_svc.text.matcher import Hit, LexiconEntry, Matcher, MatchResult, Verdict


def _matcher(*words: tuple[str, str, int], block_severity: int = 3) -> Matcher:
    return Matcher([LexiconEntry(word, category, severity) for word, category, severity in words], block_severity)


def _words(result: MatchResult) -> list[str]:
    return [hit.word for hit in result.hits]


def _assert_hits_map_back(original: str, hits: tuple[Hit, ...]) -> None:
    for hit in hits:
        assert 0 <= hit.start < hit.end <= len(original)
        assert original[hit.start : hit.end] == hit.matched_text


@pytest.fixture(scope="module")
def default_matcher() -> Matcher:
    return Matcher(load_lexicon_file())


def test_a_plain_word_is_found_with_its_original_span() -> None:
    matcher = _matcher(("赌博", "gambling", 3))
    original = "他们在赌博。"

    result = matcher.match(original)

    assert result.hits == (Hit("赌博", "gambling", 3, 3, 5, "赌博"),)
    assert result.verdict is Verdict.BLOCK


@pytest.mark.parametrize("disguised", ["敏 感 词", "敏.感.词", "敏*感-词", "敏\u200b感\u200d词"])
def test_separators_between_chinese_characters_do_not_hide_a_word(disguised: str) -> None:
    # Given a lexicon with 敏感词 and a text that hides it with separators or invisible characters
    matcher = _matcher(("敏感词", "test", 2))
    original = f"这是{disguised}吗"

    # When the text is matched
    result = matcher.match(original)

    # Then the word is found and its span is the disguised spelling, separators included
    assert _words(result) == ["敏感词"]
    hit = result.hits[0]
    assert hit.matched_text == disguised
    assert original[hit.start : hit.end] == hit.matched_text


def test_full_width_text_with_an_ideographic_space_matches_a_two_word_entry() -> None:
    matcher = _matcher(("free money", "spam", 1))
    original = "Get ｆｒｅｅ　ｍｏｎｅｙ now"

    result = matcher.match(original)

    assert _words(result) == ["free money"]
    assert result.hits[0].matched_text == "ｆｒｅｅ　ｍｏｎｅｙ"
    _assert_hits_map_back(original, result.hits)


@pytest.mark.parametrize("disguised", ["SEX", "S.E.X", "ｓｅｘ", "s e x", "s\u0336e\u0336x\u0336"])
def test_case_width_and_separators_do_not_hide_a_latin_word(disguised: str) -> None:
    matcher = _matcher(("sex", "adult", 3))

    result = matcher.match(f"-> {disguised} <-")

    assert _words(result) == ["sex"]
    assert result.hits[0].matched_text == disguised


def test_upper_case_lexicon_words_match_lower_case_text() -> None:
    matcher = _matcher(("CASINO", "gambling", 2))

    assert _words(matcher.match("an online casino")) == ["CASINO"]


def test_every_hit_maps_back_to_the_original_text() -> None:
    # Given a lexicon and a text mixing widths, separators, invisible characters and scripts
    matcher = _matcher(("赌博", "gambling", 3), ("casino", "gambling", 2), ("毒品", "drugs", 3), ("k粉", "drugs", 3))
    original = "Ｃａｓｉｎｏ 里 赌\u200b博, 卖 毒-品 和 Ｋ 粉!"

    result = matcher.match(original)

    # Then every hit's span is exactly its matched text in the original
    assert _words(result) == ["casino", "赌博", "毒品", "k粉"]
    _assert_hits_map_back(original, result.hits)
    assert [hit.matched_text for hit in result.hits] == ["Ｃａｓｉｎｏ", "赌\u200b博", "毒-品", "Ｋ 粉"]


def test_overlapping_words_are_all_found() -> None:
    # Given lexicon words that overlap each other (CJK words match anywhere; a Latin word only on word
    # boundaries, so the overlapping Latin words are whole words here)
    matcher = _matcher(
        ("赌博", "x", 1), ("博彩", "x", 1), ("赌博彩", "x", 1), ("free money", "x", 1), ("money laundering", "x", 1)
    )

    result = matcher.match("赌博彩票 free money laundering")

    # Then all of them are found, sorted by start and longest first
    assert [(hit.word, hit.start, hit.end) for hit in result.hits] == [
        ("赌博彩", 0, 3),
        ("赌博", 0, 2),
        ("博彩", 1, 3),
        ("free money", 5, 15),
        ("money laundering", 10, 26),
    ]


def test_a_word_repeated_in_the_text_gives_one_hit_per_occurrence() -> None:
    matcher = _matcher(("刷单", "fraud", 2))
    original = "刷单，刷 单，还是刷单"

    result = matcher.match(original)

    assert [(hit.start, hit.end) for hit in result.hits] == [(0, 2), (3, 6), (9, 11)]
    _assert_hits_map_back(original, result.hits)


def test_chinese_and_latin_words_in_one_text_are_both_found() -> None:
    matcher = _matcher(("赌博", "gambling", 3), ("casino", "gambling", 2))

    result = matcher.match("我在casino里赌博")

    assert [(hit.word, hit.matched_text) for hit in result.hits] == [("casino", "casino"), ("赌博", "赌博")]


def test_words_with_digits_match_full_width_digits() -> None:
    matcher = _matcher(("日赚1000", "spam", 2))

    assert _words(matcher.match("日赚１０００元")) == ["日赚1000"]


def test_an_empty_lexicon_always_passes() -> None:
    matcher = Matcher([])

    result = matcher.match("赌博 casino")

    assert matcher.size == 0
    assert result.hits == ()
    assert result.verdict is Verdict.PASS
    assert result.normalized_text == "赌博casino"


def test_an_empty_text_passes() -> None:
    matcher = _matcher(("赌博", "gambling", 3))

    result = matcher.match("")

    assert result == MatchResult((), Verdict.PASS, "")


def test_a_text_of_separators_only_passes() -> None:
    assert _matcher(("赌博", "gambling", 3)).match(" ... \u200b ").verdict is Verdict.PASS


def test_verdict_is_pass_without_hits_review_below_block_severity_and_block_at_it() -> None:
    matcher = _matcher(("加微信", "spam", 1), ("刷单", "fraud", 2), ("诈骗", "fraud", 3))

    assert matcher.match("今天天气很好").verdict is Verdict.PASS
    assert matcher.match("请加微信").verdict is Verdict.REVIEW
    assert matcher.match("加微信刷单").verdict is Verdict.REVIEW
    assert matcher.match("加微信, 专业诈骗").verdict is Verdict.BLOCK


def test_block_severity_is_configurable() -> None:
    matcher = _matcher(("刷单", "fraud", 2), block_severity=2)

    assert matcher.block_severity == 2
    assert matcher.match("刷单").verdict is Verdict.BLOCK


def test_hits_below_the_review_severity_pass_and_are_still_reported() -> None:
    entries = [LexiconEntry("加微信", "spam", 1), LexiconEntry("刷单", "fraud", 2), LexiconEntry("诈骗", "fraud", 4)]
    matcher = Matcher(entries, block_severity=4, review_severity=2)

    assert matcher.review_severity == 2
    low = matcher.match("请加微信")
    assert low.verdict is Verdict.PASS and _words(low) == ["加微信"]
    assert matcher.match("加微信刷单").verdict is Verdict.REVIEW
    assert matcher.match("专业诈骗").verdict is Verdict.BLOCK


def test_a_review_severity_above_the_block_severity_is_refused() -> None:
    with pytest.raises(ValueError, match="above the block severity"):
        Matcher([], block_severity=2, review_severity=3)


def test_verdict_values_match_the_protobuf_enum() -> None:
    assert (Verdict.PASS.value, Verdict.REVIEW.value, Verdict.BLOCK.value) == (1, 2, 3)


def test_duplicate_lexicon_words_keep_the_highest_severity() -> None:
    # Given the same word twice (once disguised) with different categories and severities
    matcher = _matcher(("刷单", "spam", 1), ("刷 单", "fraud", 3), ("刷单", "other", 2))

    result = matcher.match("刷单")

    # Then the matcher holds one word, reported with the most severe entry
    assert matcher.size == 1
    assert [(hit.word, hit.category, hit.severity) for hit in result.hits] == [("刷 单", "fraud", 3)]


def test_a_lexicon_word_with_spaces_or_punctuation_matches_the_plain_spelling() -> None:
    matcher = _matcher(("free-money", "spam", 1))

    assert _words(matcher.match("freemoney")) == ["free-money"]


def test_a_lexicon_word_that_normalises_to_nothing_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty once normalised"):
        _matcher(("***", "x", 1))


def test_an_expanded_character_gives_one_hit_per_original_span() -> None:
    # Given a ligature that expands to "ff", and a lexicon word "f"
    matcher = _matcher(("f", "x", 1))

    result = matcher.match("ﬀ")

    assert [(hit.start, hit.end, hit.matched_text) for hit in result.hits] == [(0, 1, "ﬀ")]


def test_the_normalised_text_is_reported() -> None:
    assert _matcher(("x", "x", 1)).match("Ａ b.C").normalized_text == "abc"


def test_the_default_lexicon_loads_with_more_than_fifty_entries_of_severity_one_to_three() -> None:
    entries = load_lexicon_file()

    assert len(entries) > 50
    assert all(1 <= entry.severity <= 3 for entry in entries)
    assert all(entry.word and entry.category for entry in entries)
    assert {"gambling", "drugs", "violence", "fraud", "adult", "spam"} <= {entry.category for entry in entries}


def test_the_default_lexicon_words_are_distinct_once_normalised() -> None:
    entries = load_lexicon_file()

    assert Matcher(entries).size == len(entries)


def test_the_default_lexicon_finds_disguised_chinese_and_english_words(default_matcher: Matcher) -> None:
    original = "我在Ｃａｓｉｎｏ里赌 博, 还有 FREE MONEY 和 敏.感.词"

    result = default_matcher.match(original)

    assert {hit.word for hit in result.hits} >= {"casino", "赌博", "free money", "敏感词"}
    assert result.verdict is Verdict.BLOCK
    _assert_hits_map_back(original, result.hits)


def test_the_default_lexicon_passes_an_ordinary_text(default_matcher: Matcher) -> None:
    assert default_matcher.match("今天下午三点开会，讨论下季度的产品计划。").verdict is Verdict.PASS


def test_a_lexicon_file_is_read_skipping_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "lexicon.tsv"
    path.write_text(
        "# comment\n\nword\tcategory\tseverity\n赌博\tgambling\t3\n\n# more\nfree money\tspam\t1\n", "utf-8"
    )

    entries = load_lexicon_file(path)

    assert entries == [LexiconEntry("赌博", "gambling", 3), LexiconEntry("free money", "spam", 1)]


def test_a_non_integer_severity_is_rejected_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "lexicon.tsv"
    path.write_text("word\tcategory\tseverity\n赌博\tgambling\t3\ncasino\tgambling\thigh\n", "utf-8")

    with pytest.raises(ValueError, match="line 3"):
        load_lexicon_file(path)


def test_a_line_without_three_fields_is_rejected_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "lexicon.tsv"
    path.write_text("word\tcategory\tseverity\ncasino gambling 2\n", "utf-8")

    with pytest.raises(ValueError, match="line 2"):
        load_lexicon_file(path)


def test_a_lexicon_file_without_the_header_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "lexicon.tsv"
    path.write_text("赌博\tgambling\t3\n", "utf-8")

    with pytest.raises(ValueError, match="line 1: expected the header"):
        load_lexicon_file(path)


@pytest.mark.parametrize(
    ("read", "word"),
    [
        ("Free moneyfor everyone", "free money"),
        ("getfree money now", "free money"),
        ("the casinoand bar", "casino"),
        ("Freshcoffeeandpastriesmoneylaunderinginside", "money laundering"),  # every space lost
        ("All itemshalfpricethisweekbaccarat", "baccarat"),
    ],
)
def test_in_text_read_from_an_image_a_short_word_glued_to_a_latin_word_does_not_hide_it(
    read: str, word: str, default_matcher: Matcher
) -> None:
    matcher = default_matcher
    # OCR missed the space: the word still hits in OCR text, at its own characters, and not in a typed text
    result = matcher.match(read, ocr=True)
    assert _words(result) == [word]
    _assert_hits_map_back(read, result.hits)
    assert matcher.match(read).hits == ()


@pytest.mark.parametrize("read", ["heroine", "moneybox", "Free moneyback", "casinoroyale", "begun", "pornography"])
def test_in_text_read_from_an_image_a_latin_word_inside_an_ordinary_word_still_does_not_hit(read: str) -> None:
    matcher = _matcher(
        ("heroin", "drugs", 3), ("free money", "spam", 2), ("casino", "gambling", 2), ("gun", "weapons", 3)
    )
    assert matcher.match(read, ocr=True).hits == ()
