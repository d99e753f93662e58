"""A text's result as the worker stores it: the hits JSON holds each hit's fields as `dataclasses.asdict` gives
them (in the matcher's order), an empty list when nothing matched, and the details JSON the match time and the
lexicon version the text was matched against."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict

from sieve.db.tasks import Started
from worker_svc.detection import detect_text
from worker_svc.text import LexiconEntry, Matcher

TEXTS = ["这里有 赌.博 和 ｃａｓｉｎｏ 的广告", "hello world", "加 微 信 免费领取 赌博", ""]


def test_the_stored_hits_and_details_are_the_matchers_own() -> None:
    matcher = Matcher(
        [
            LexiconEntry("赌博", "gambling", 3),
            LexiconEntry("casino", "gambling", 2),
            LexiconEntry("加微信", "spam", 1),
            LexiconEntry("免费领取", "spam", 1),
        ],
        version=7,
    )
    for text in TEXTS[:3]:
        task = Started(uuid.uuid4(), "TEXT", 1, text, None, None, None)
        outcome = detect_text(task, matcher, "w1")
        expected = [asdict(h) for h in matcher.match(text).hits]
        assert json.loads(outcome.hits_json) == expected
        assert (outcome.hits_json == "[]") == (not expected)
        details = json.loads(outcome.details_json)
        assert list(details) == ["timings_ms", "lexicon_version"] and list(details["timings_ms"]) == ["match"]
        assert details["lexicon_version"] == 7
        assert isinstance(details["timings_ms"]["match"], float) and details["timings_ms"]["match"] >= 0
    # texts with hits were in the sample, and the positions point into the original text
    first = json.loads(
        detect_text(Started(uuid.uuid4(), "TEXT", 1, TEXTS[0], None, None, None), matcher, "w").hits_json
    )
    assert {h["word"] for h in first} == {"赌博", "casino"}
    assert all(TEXTS[0][h["start"] : h["end"]] == h["matched_text"] for h in first)


def test_a_disguised_word_is_stored_with_the_rules_it_needed() -> None:
    matcher = Matcher([LexiconEntry("赌博", "gambling", 3), LexiconEntry("casino", "gambling", 2)], version=7)
    text = "網上賭博 and c4sino"

    stored = json.loads(detect_text(Started(uuid.uuid4(), "TEXT", 1, text, None, None, None), matcher, "w").hits_json)

    assert [(h["word"], h["matched_text"], h["rules"]) for h in stored] == [
        ("赌博", "賭博", ["t2s"]),
        ("casino", "c4sino", ["leet"]),
    ]
    assert all(text[h["start"] : h["end"]] == h["matched_text"] for h in stored)
