"""`sieve lexicon ls|add|rm|import|export` against the real intake (LexiconService), a real worker, real Redis and
PostgreSQL: the words and versions it shows, files it writes that the worker's own loader reads, imports merged and
replacing, refusals naming the field, and a word added here blocking the next text a worker matches."""

from __future__ import annotations

import json
from pathlib import Path

from sieve.v1 import intake_pb2
from tests.integration.conftest import Platform
from tests.integration.sieve.cli.conftest import Sieve, json_of
from tests.security.auth_stack import eventually
from worker_svc.text import load_lexicon_file

DEVICE = "AA-BB-CC-DD-EE-41"


async def test_words_are_listed_added_and_removed(platform: Platform, sieve: Sieve) -> None:
    s = platform.settings
    # Given the default lexicon the worker seeded
    listed = json_of(await sieve(s, "lexicon", "ls", "-n", "10", "-o", "json"))
    default = len(load_lexicon_file())
    assert listed["total"] == default and len(listed["words"]) == 10 and listed["next_page_token"]
    everything = json_of(await sieve(s, "lexicon", "ls", "--all", "-o", "json"))
    assert len(everything["words"]) == default and not everything["next_page_token"]
    assert [w["word"] for w in everything["words"]][:10] == [w["word"] for w in listed["words"]]

    # When two words are added (once more: the second time they are updated)
    added = json_of(await sieve(s, "lexicon", "add", "zorblax", "quuxplode", "-c", "probe", "-s", "4", "-o", "json"))
    assert (added["added"], added["updated"]) == (2, 0) and added["version"] > listed["version"]
    again = await sieve(s, "lexicon", "add", "zorblax", "-c", "fraud", "-s", "2")
    assert again.exit_code == 0 and "added 0, updated 1: lexicon version" in again.stdout

    # Then they are listed by prefix and category, with the version
    mine = json_of(await sieve(s, "lexicon", "ls", "-p", "zor", "-o", "json"))
    assert [(w["word"], w["category"], w["severity"]) for w in mine["words"]] == [("zorblax", "fraud", 2)]
    table = await sieve(s, "lexicon", "ls", "-c", "probe")
    assert table.exit_code == 0 and "quuxplode" in table.stdout and "1 of 1 words, lexicon version" in table.stdout

    # And removing names what was not there
    removed = json_of(await sieve(s, "lexicon", "rm", "zorblax", "quuxplode", "nothere", "-o", "json"))
    assert removed["removed"] == 2 and removed["not_found"] == ["nothere"]
    plain = await sieve(s, "lexicon", "rm", "nothere")
    assert plain.exit_code == 0 and "removed 0" in plain.stdout and "not there: nothere" in plain.stderr

    # A bad word, category or severity is the server's refusal naming the field (exit 2), and changes nothing
    for args, field in (
        (("add", "ok", "-c", "Bad Name", "-s", "3"), "words[0].category"),
        (("add", "ok", "-c", "test", "-s", "9"), "words[0].severity"),
        (("add", "...", "-c", "test", "-s", "3"), "words[0].word"),
    ):
        bad = await sieve(s, "lexicon", *args)
        assert bad.exit_code == 2 and field in bad.stderr and "Traceback" not in bad.output, bad
    assert json_of(await sieve(s, "lexicon", "ls", "-o", "json"))["total"] == default


async def test_export_writes_files_the_worker_reads_and_import_merges_or_replaces(
    platform: Platform, sieve: Sieve, tmp_path: Path
) -> None:
    s = platform.settings
    # Given the lexicon exported as TSV (to a file) and as JSON (to stdout)
    tsv = tmp_path / "lexicon.tsv"
    written = await sieve(s, "lexicon", "export", str(tsv))
    assert written.exit_code == 0 and "written to" in written.stderr
    entries = load_lexicon_file(tsv)  # the worker's own loader reads it
    exported = json.loads((await sieve(s, "lexicon", "export", "-o", "json")).stdout)
    assert [(e.word, e.category, e.severity) for e in entries] == [
        (w["word"], w["category"], w["severity"]) for w in exported["words"]
    ]
    assert tsv.read_text().startswith(f"# Sieve lexicon, version {exported['version']}\n")

    # When a file with one new word and one changed one is imported (merged, from stdin)
    first = entries[0]
    merged_tsv = f"word\tcategory\tseverity\nblorptastic\tspam\t2\n{first.word}\t{first.category}\t5\n"
    merged = json_of(await sieve(s, "lexicon", "import", "-", "-o", "json", stdin=merged_tsv))
    assert (merged["added"], merged["updated"], merged["removed"]) == (1, 1, 0)
    after = json_of(await sieve(s, "lexicon", "ls", "--all", "-o", "json"))
    assert after["total"] == len(entries) + 1 and after["version"] == merged["version"]

    # And a JSON file replaces the whole lexicon (asked first; --yes to go on)
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"words": [{"word": "onlyword", "category": "test", "severity": 3}]}))
    declined = await sieve(s, "lexicon", "import", str(small), "--replace", stdin="n\n")
    assert declined.exit_code == 1
    assert json_of(await sieve(s, "lexicon", "ls", "-o", "json"))["total"] == len(entries) + 1
    replaced = await sieve(s, "lexicon", "import", str(small), "--replace", "--yes")
    assert replaced.exit_code == 0 and "added 1, updated 0, removed" in replaced.stdout
    only = json_of(await sieve(s, "lexicon", "export", "-o", "json"))
    assert only["words"] == [{"word": "onlyword", "category": "test", "severity": 3}]

    # The TSV written first brings the lexicon back as it was
    restored = json_of(await sieve(s, "lexicon", "import", str(tsv), "--replace", "-y", "-o", "json"))
    assert restored["removed"] == 1 and restored["added"] == len(entries)

    # A malformed file is refused before anything is sent (exit 2, the line named)
    broken = tmp_path / "broken.tsv"
    broken.write_text("word\tcategory\tseverity\nfoo\tspam\tlots\n")
    bad = await sieve(s, "lexicon", "import", str(broken))
    assert bad.exit_code == 2 and "line 2" in bad.stderr and "severity" in bad.stderr


async def test_a_word_added_here_blocks_the_next_text_a_running_worker_matches(
    platform: Platform, sieve: Sieve
) -> None:
    s = platform.settings
    # Given a text the lexicon does not know
    before = json_of(await sieve(s, "submit", "-d", DEVICE, "the frobnicator is here", "--wait", "-o", "json"))
    assert before["results"][0]["verdict"] == "PASS"
    # When an operator adds its word
    added = json_of(await sieve(s, "lexicon", "add", "frobnicator", "-c", "fraud", "-s", "3", "-o", "json"))

    async def loaded() -> bool:
        return platform.workers[0].lexicon.version >= added["version"]

    await eventually(loaded, 5, "the worker did not load the new version")
    # Then the next task is blocked on it, and its result names the version
    after = json_of(await sieve(s, "submit", "-d", DEVICE, "the frobnicator is back", "--wait", "-o", "json"))
    task_id = after["results"][0]["task_id"]
    task = (await platform.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
    assert task.result.verdict == 3 and [h.word for h in task.result.hits] == ["frobnicator"]
    assert task.result.lexicon_version == added["version"]
    shown = json_of(await sieve(s, "get", task_id, "-o", "json"))
    assert int(shown["result"]["lexicon_version"]) == added["version"], shown
