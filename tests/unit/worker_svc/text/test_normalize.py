"""Unit tests of worker_svc.text.normalize: folding of disguised text and the map back to the original."""

from __future__ import annotations

import random

import pytest

from worker_svc.text.normalize import Normalized, _fold_char, _normalize_general, normalize, normalize_word


def _assert_offsets_are_consistent(original: str, normalized: Normalized) -> None:
    assert len(normalized.offsets) == len(normalized.text) == len(normalized.ends)
    for offset, end in zip(normalized.offsets, normalized.ends, strict=True):
        assert 0 <= offset < end <= len(original)
    assert list(normalized.offsets) == sorted(normalized.offsets)


def test_full_width_letters_and_ideographic_space_fold_to_plain_ascii() -> None:
    # Given full-width letters separated by U+3000 ideographic space
    original = "ｆｒｅｅ　ｍｏｎｅｙ"

    # When it is normalised
    normalized = normalize(original)

    # Then the letters are half-width and the space is gone
    assert normalized.text == "freemoney"
    _assert_offsets_are_consistent(original, normalized)


def test_nfkc_folds_compatibility_characters() -> None:
    assert normalize("①②３").text == "123"
    assert normalize("ﬁle").text == "file"


def test_upper_case_folds_to_lower_case_including_special_casings() -> None:
    assert normalize("CaSiNo").text == "casino"
    assert normalize("STRASSE").text == normalize("straße").text == "strasse"


def test_zero_width_and_format_characters_are_removed() -> None:
    # Given a word with a zero-width space, a zero-width joiner, a BOM and a soft hyphen inside
    original = "敏\u200b感\u200d\ufeff词\u00ad"

    normalized = normalize(original)

    assert normalized.text == "敏感词"
    # Then each kept character still points at its own original position
    assert normalized.offsets == (0, 2, 5)


@pytest.mark.parametrize("disguised", ["敏 感 词", "敏.感.词", "敏*感-词", "敏_感/词", "敏，感。词", "敏\t感\n词"])
def test_separators_between_chinese_characters_are_dropped(disguised: str) -> None:
    assert normalize(disguised).text == "敏感词"


@pytest.mark.parametrize("disguised", ["S.E.X", "s e x", "ｓｅｘ", "S|E~X", "s\\e*x"])
def test_separators_and_width_tricks_between_latin_letters_are_dropped(disguised: str) -> None:
    assert normalize(disguised).text == "sex"


def test_offsets_point_at_the_original_characters_past_removed_separators() -> None:
    # Given a text with separators between the characters of a word
    original = "a 敏.感.词"

    normalized = normalize(original)

    # Then the normalised characters map back to their original positions
    assert normalized.text == "a敏感词"
    assert normalized.offsets == (0, 2, 4, 6)
    assert [original[i] for i in normalized.offsets] == ["a", "敏", "感", "词"]
    # And a normalised range maps to the original span including the separators
    assert normalized.span(1, 4) == (2, 7)
    assert original[2:7] == "敏.感.词"


def test_a_character_that_expands_maps_all_its_pieces_to_the_same_original_index() -> None:
    # Given a ligature that NFKC expands to two letters
    original = "xﬁy"

    normalized = normalize(original)

    assert normalized.text == "xfiy"
    assert normalized.offsets == (0, 1, 1, 2)
    assert normalized.ends == (1, 2, 2, 3)


def test_combining_marks_compose_with_their_base_and_the_span_covers_them() -> None:
    # Given a decomposed é (e + combining acute) and a precomposed é
    decomposed = "cafe\u0301!"
    precomposed = "café!"

    # Then both normalise the same way
    assert normalize(decomposed).text == normalize(precomposed).text == "café"
    # And the composed character spans both original code points
    normalized = normalize(decomposed)
    assert normalized.span(3, 4) == (3, 5)


def test_strike_through_decoration_is_stripped() -> None:
    assert normalize("s\u0336e\u0336x\u0336").text == "sex"


def test_mixed_scripts_and_digits_are_kept() -> None:
    assert normalize("我在Casino里赌博 ２４小时").text == "我在casino里赌博24小时"


def test_empty_and_separator_only_texts_normalise_to_nothing() -> None:
    assert normalize("") == Normalized("", (), ())
    assert normalize(" .-*\u200b ").text == ""


def test_lexicon_words_are_normalised_like_texts() -> None:
    assert normalize_word("Free Money") == "freemoney"
    assert normalize_word("敏 感 词") == "敏感词"
    assert normalize_word("加QQ") == normalize("加 Ｑ Ｑ").text


def test_span_rejects_an_empty_or_out_of_range_normalised_range() -> None:
    normalized = normalize("abc")
    with pytest.raises(ValueError):
        normalized.span(1, 1)
    with pytest.raises(ValueError):
        normalized.span(0, 4)


def test_fast_and_general_paths_agree_on_random_tricky_texts() -> None:
    # Given random texts mixing letters, separators, invisible characters, expansions and marks
    alphabet = "aB敏感词 .-*\u3000ｆＸ１\u200b\u00adﬁ㈱ß\u0301\u0336e\u0308İ\ufe0f❤한"
    rng = random.Random(20240601)
    for _ in range(2000):
        original = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))

        # When normalised by the public entry point and by the general (slow) path
        normalized = normalize(original)
        general = _normalize_general(original, [_fold_char(ch) for ch in original])

        # Then both agree and every normalised character maps inside the original text
        assert normalized == general, original
        _assert_offsets_are_consistent(original, normalized)
        # And normalising each original span again gives back the same characters
        for start, end in set(zip(normalized.offsets, normalized.ends, strict=True)):
            assert normalize(original[start:end]).text in normalized.text
