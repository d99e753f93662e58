"""The lexicon files of `sieve lexicon import|export`: the TSV the worker's own loader reads, and JSON; a malformed
file is a usage error naming the file and the line (or the item)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from sieve.cli.client import CliError, ExitCode
from sieve.cli.lexicon import json_of, parse_json, parse_tsv, tsv_of
from sieve.v1 import lexicon_pb2
from worker_svc.text.lexicon_file import load_lexicon_file, parse_lexicon

WORDS = [
    lexicon_pb2.LexiconWord(word="赌博", category="gambling", severity=3),
    lexicon_pb2.LexiconWord(word="buy weed", category="drugs", severity=2),
]


def _triples(words: list[lexicon_pb2.LexiconWord]) -> list[tuple[str, str, int]]:
    return [(w.word, w.category, w.severity) for w in words]


def test_tsv_written_is_read_back_by_the_worker_and_by_import() -> None:
    text = tsv_of(WORDS, 7)
    assert text.startswith("# Sieve lexicon, version 7\nword\tcategory\tseverity\n")
    assert [(e.word, e.category, e.severity) for e in parse_lexicon(text)] == _triples(WORDS)
    assert _triples(parse_tsv(text, "x.tsv")) == _triples(WORDS)


def test_the_shipped_default_lexicon_reads_as_the_worker_reads_it() -> None:
    text = resources.files("worker_svc.text").joinpath("lexicon_default.tsv").read_text(encoding="utf-8-sig")
    assert _triples(parse_tsv(text, "default")) == [(e.word, e.category, e.severity) for e in load_lexicon_file()]


def test_json_written_is_read_back_and_a_bare_list_reads_too() -> None:
    data = json_of(WORDS, 7)
    assert data["version"] == 7
    assert _triples(parse_json(json.dumps(data), "x.json")) == _triples(WORDS)
    assert _triples(parse_json(json.dumps(data["words"]), "x.json")) == _triples(WORDS)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("foo\tspam\t1\n", "x.tsv, line 1"),  # no header
        ("word\tcategory\tseverity\nfoo\tspam\n", "x.tsv, line 2"),
        ("# c\nword\tcategory\tseverity\n\nfoo\tspam\tmany\n", "x.tsv, line 4"),
    ],
)
def test_a_malformed_tsv_is_a_usage_error_naming_the_line(content: str, where: str) -> None:
    with pytest.raises(CliError) as bad:
        parse_tsv(content, "x.tsv")
    assert bad.value.code is ExitCode.USAGE and bad.value.message.startswith(where)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("{not json", "x.json: not JSON"),
        ('{"words": 3}', "x.json: expected"),
        ('[{"category": "spam", "severity": 1}]', "x.json: words[0]"),
        ('[{"word": "a", "category": "spam", "severity": "1"}]', "x.json: words[0].severity"),
        ('[{"word": "a", "category": "spam", "severity": true}]', "x.json: words[0].severity"),
    ],
)
def test_a_malformed_json_file_is_a_usage_error_naming_the_item(content: str, where: str) -> None:
    with pytest.raises(CliError) as bad:
        parse_json(content, "x.json")
    assert bad.value.code is ExitCode.USAGE and bad.value.message.startswith(where)
