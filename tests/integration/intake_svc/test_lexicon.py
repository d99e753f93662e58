"""LexiconService against the real intake (loopback gRPC, real PostgreSQL and Redis): list, add, remove, import,
export with the version each change makes, refusals that name the field and change nothing, the audit trail of
every call, and a change reaching a running worker within seconds (the next result names the new version)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import grpc
import pytest

from sieve import rpc
from sieve.v1 import intake_pb2, lexicon_pb2, lexicon_pb2_grpc, types_pb2
from tests.integration.conftest import Platform, wait_final

DEVICE = "AA-BB-CC-DD-EE-31"


def word(w: str, category: str = "test", severity: int = 3) -> lexicon_pb2.LexiconWord:
    return lexicon_pb2.LexiconWord(word=w, category=category, severity=severity)


@pytest.fixture
async def lexicon(platform: Platform) -> lexicon_pb2_grpc.LexiconServiceStub:
    channel = rpc.channel(platform.settings.intake_addr, platform.settings)
    yield lexicon_pb2_grpc.LexiconServiceStub(channel)
    await channel.close()


async def version(pg: asyncpg.Pool) -> int:
    return int(await pg.fetchval("SELECT version FROM lexicon_version"))


async def test_words_are_added_listed_paged_removed_imported_and_exported_with_their_versions(
    platform: Platform, lexicon: lexicon_pb2_grpc.LexiconServiceStub
) -> None:
    # Given the default lexicon the worker seeded
    before = await lexicon.ExportLexicon(lexicon_pb2.ExportLexiconRequest())
    assert len(before.words) > 50 and before.version == await version(platform.pg)

    # When words are added (one new, one already there with a new severity)
    added = await lexicon.AddWords(
        lexicon_pb2.AddWordsRequest(words=[word("zorblax"), word(before.words[0].word, "spam", 1)])
    )
    # Then the answer says which and names the version they made
    assert (added.added, added.updated) == (1, 1) and added.version > before.version
    assert added.version == await version(platform.pg)
    row = await platform.pg.fetchrow("SELECT category, severity FROM lexicon WHERE word = $1", before.words[0].word)
    assert (row["category"], row["severity"]) == ("spam", 1)

    # Listing filters by category and prefix, pages by word, and counts every match
    only = await lexicon.ListLexicon(lexicon_pb2.ListLexiconRequest(category="test", word_prefix="zor"))
    assert [(w.word, w.category, w.severity) for w in only.words] == [("zorblax", "test", 3)]
    assert only.total == 1 and only.version == added.version and only.words[0].updated_at.seconds > 0
    seen: list[str] = []
    token = ""
    while True:
        page = await lexicon.ListLexicon(lexicon_pb2.ListLexiconRequest(page_size=7, page_token=token))
        assert len(page.words) <= 7 and page.total == len(before.words) + 1
        seen += [w.word for w in page.words]
        token = page.next_page_token
        if not token:
            break
    exported = await lexicon.ExportLexicon(lexicon_pb2.ExportLexiconRequest())
    assert seen == [w.word for w in exported.words] and len(seen) == len(before.words) + 1

    # Removing names the words that were not there; removing nothing leaves the version
    removed = await lexicon.RemoveWords(lexicon_pb2.RemoveWordsRequest(words=["zorblax", "not-there"]))
    assert removed.removed == 1 and list(removed.not_found) == ["not-there"] and removed.version > added.version
    nothing = await lexicon.RemoveWords(lexicon_pb2.RemoveWordsRequest(words=["not-there"]))
    assert nothing.removed == 0 and nothing.version == removed.version

    # Import: merging keeps the rest, replacing makes the import the whole lexicon
    merged = await lexicon.ImportLexicon(
        lexicon_pb2.ImportLexiconRequest(
            words=[word("alpha"), word("beta", "fraud", 2)], mode=lexicon_pb2.IMPORT_MODE_MERGE
        )
    )
    assert (merged.added, merged.updated, merged.removed) == (2, 0, 0)
    replaced = await lexicon.ImportLexicon(
        lexicon_pb2.ImportLexiconRequest(
            words=[word("beta", "fraud", 5), word("gamma")], mode=lexicon_pb2.IMPORT_MODE_REPLACE
        )
    )
    assert (replaced.added, replaced.updated, replaced.removed) == (1, 1, len(before.words) + 1)
    final = await lexicon.ExportLexicon(lexicon_pb2.ExportLexiconRequest())
    assert [(w.word, w.category, w.severity) for w in final.words] == [("beta", "fraud", 5), ("gamma", "test", 3)]
    assert final.version == replaced.version == await version(platform.pg)

    # And every call is in the audit log as an operator action, with its request and outcome
    rows = await platform.pg.fetch(
        "SELECT method, outcome, target FROM audit_events WHERE method LIKE '/sieve.v1.LexiconService/%' ORDER BY id"
    )
    methods = [r["method"].rsplit("/", 1)[1] for r in rows]
    assert methods.count("AddWords") == 1 and methods.count("ImportLexicon") == 2 and "ExportLexicon" in methods
    assert all(r["outcome"] == "OK" for r in rows)
    assert any("zorblax" in r["target"] for r in rows if r["method"].endswith("/AddWords"))


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (lexicon_pb2.AddWordsRequest(), "words"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok"), word("")]), "words[1].word"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok"), word(" padded")]), "words[1].word"),
        (lexicon_pb2.AddWordsRequest(words=[word("line\nbreak")]), "words[0].word"),
        (lexicon_pb2.AddWordsRequest(words=[word("x" * 101)]), "words[0].word"),
        (lexicon_pb2.AddWordsRequest(words=[word("...")]), "words[0].word"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok", "Not A Name")]), "words[0].category"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok", "")]), "words[0].category"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok", severity=0)]), "words[0].severity"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok", severity=6)]), "words[0].severity"),
        (lexicon_pb2.AddWordsRequest(words=[word("ok"), word("ok")]), "words[1].word"),
        (lexicon_pb2.ImportLexiconRequest(words=[word("ok")]), "mode"),
        (lexicon_pb2.ImportLexiconRequest(words=[], mode=lexicon_pb2.IMPORT_MODE_REPLACE), "words"),
        (
            lexicon_pb2.ImportLexiconRequest(
                words=[word("ok"), word("bad", severity=9)], mode=lexicon_pb2.IMPORT_MODE_REPLACE
            ),
            "words[1].severity",
        ),
        (lexicon_pb2.RemoveWordsRequest(), "words"),
        (lexicon_pb2.RemoveWordsRequest(words=["ok", ""]), "words[1]"),
        (lexicon_pb2.ListLexiconRequest(category="BAD!"), "category"),
        (lexicon_pb2.ListLexiconRequest(page_size=1001), "page_size"),
        (lexicon_pb2.ListLexiconRequest(page_token="!!not-a-token"), "page_token"),
        (lexicon_pb2.ListLexiconRequest(page_token="AA"), "page_token"),  # a NUL
    ],
)
async def test_a_bad_request_is_refused_naming_the_field_and_changes_nothing(
    platform: Platform, lexicon: lexicon_pb2_grpc.LexiconServiceStub, request_: object, field: str
) -> None:
    before = await lexicon.ExportLexicon(lexicon_pb2.ExportLexiconRequest())
    method = {
        lexicon_pb2.AddWordsRequest: lexicon.AddWords,
        lexicon_pb2.ImportLexiconRequest: lexicon.ImportLexicon,
        lexicon_pb2.RemoveWordsRequest: lexicon.RemoveWords,
        lexicon_pb2.ListLexiconRequest: lexicon.ListLexicon,
    }[type(request_)]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await method(request_)  # type: ignore[operator]
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith(f"{field}: ")
    after = await lexicon.ExportLexicon(lexicon_pb2.ExportLexiconRequest())
    assert after == before


async def test_a_change_reaches_every_running_worker_within_seconds_and_the_next_result_names_its_version(
    platform: Platform, lexicon: lexicon_pb2_grpc.LexiconServiceStub
) -> None:
    # Given three running workers that have loaded the lexicon, and a text none of its words is in
    await platform.add_worker(worker_id="worker-2")
    await platform.add_worker(worker_id="worker-3")
    spec = intake_pb2.TaskSpec(device_id=DEVICE, type=types_pb2.TASK_TYPE_TEXT, text="the quuxplode protocol")
    first = await wait_final(
        platform.intake, (await platform.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id
    )
    assert first.result.verdict == types_pb2.VERDICT_PASS
    assert first.result.lexicon_version == await version(platform.pg)
    await asyncio.sleep(0.3)  # every worker is listening

    # When an operator adds the word through the RPC
    began = time.perf_counter()
    added = await lexicon.AddWords(lexicon_pb2.AddWordsRequest(words=[word("quuxplode", "fraud", 4)]))
    # Then each worker has loaded that version within seconds (LISTEN; the periodic check is 5 s away)
    took_ms: dict[str, float] = {}
    while len(took_ms) < len(platform.workers):
        for w in platform.workers:
            if w.worker_id not in took_ms and w.lexicon.version >= added.version:
                took_ms[w.worker_id] = (time.perf_counter() - began) * 1000
        assert time.perf_counter() - began < 3, f"not every worker loaded version {added.version}: {took_ms}"
        await asyncio.sleep(0.005)
    print(f"lexicon change -> loaded by each worker (ms): {sorted(round(v) for v in took_ms.values())}")
    assert all(w.lexicon.matcher.version == added.version for w in platform.workers)

    # And the next task's result shows the new word's hit and the version that found it
    second = await wait_final(
        platform.intake, (await platform.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id
    )
    assert second.status == types_pb2.TASK_STATUS_SUCCEEDED
    assert second.result.verdict == types_pb2.VERDICT_BLOCK
    assert [(h.word, h.category, h.severity) for h in second.result.hits] == [("quuxplode", "fraud", 4)]
    assert second.result.lexicon_version == added.version
    stored = await platform.pg.fetchval(
        "SELECT details->>'lexicon_version' FROM results WHERE task_id = $1::uuid", second.task_id
    )
    assert int(stored) == added.version
