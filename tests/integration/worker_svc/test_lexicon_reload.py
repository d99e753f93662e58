"""The worker's lexicon: the shipped default loads on first start, and a change of the table is picked
up without a restart."""

from __future__ import annotations

import asyncio

import asyncpg

from sieve.settings import Settings
from worker_svc.lexicon import Lexicon
from worker_svc.text import Verdict, load_lexicon_file


async def test_the_first_start_loads_the_default_lexicon_once(settings: Settings, pg: asyncpg.Pool) -> None:
    first, second = Lexicon(pg, settings), Lexicon(pg, settings)
    await asyncio.gather(first.start(), second.start())
    assert await pg.fetchval("SELECT count(*) FROM lexicon") == len(load_lexicon_file())
    assert first.matcher.size == second.matcher.size > 50


async def test_a_new_word_is_matched_after_the_table_changes(settings: Settings, pg: asyncpg.Pool) -> None:
    # Given a running worker lexicon that does not know a word
    lexicon = Lexicon(pg, settings)
    await lexicon.start()
    watcher = asyncio.create_task(lexicon.watch())
    try:
        assert not lexicon.matcher.match("the zorblax protocol").hits
        await asyncio.sleep(0.3)  # the watcher is listening
        # When an operator adds it
        await pg.execute("INSERT INTO lexicon (word, category, severity) VALUES ('zorblax', 'test', 3)")
        # Then it is matched soon after, without a restart
        for _ in range(100):
            if lexicon.matcher.match("the zorblax protocol").hits:
                break
            await asyncio.sleep(0.05)
        hits = lexicon.matcher.match("the Z.O.R.B.L.A.X protocol").hits
        assert [h.word for h in hits] == ["zorblax"]
    finally:
        watcher.cancel()


async def test_the_verdict_thresholds_are_the_settings(settings: Settings, pg: asyncpg.Pool) -> None:
    # Given words of severity 1, 2 and 4, and a worker that blocks from 4 and reviews from 2
    await pg.execute(
        "INSERT INTO lexicon (word, category, severity) VALUES ('lowword', 'test', 1), ('midword', 'test', 2), "
        "('topword', 'test', 4)"
    )
    lexicon = Lexicon(pg, settings.replace(block_severity=4, review_severity=2))
    await lexicon.start()
    # Then a severity-1 hit passes (still reported), 2 is reviewed, 4 blocked
    low = lexicon.matcher.match("a lowword here")
    assert low.verdict is Verdict.PASS and [h.word for h in low.hits] == ["lowword"]
    assert lexicon.matcher.match("a midword here").verdict is Verdict.REVIEW
    assert lexicon.matcher.match("a topword here").verdict is Verdict.BLOCK
    # And with the defaults (block 3, review 1) the same words are REVIEW, REVIEW, BLOCK
    default = Lexicon(pg, settings)
    await default.start()
    assert [default.matcher.match(f"a {w} here").verdict for w in ("lowword", "midword", "topword")] == [
        Verdict.REVIEW,
        Verdict.REVIEW,
        Verdict.BLOCK,
    ]


async def test_a_word_that_is_nothing_once_normalised_is_left_out_not_the_lexicon(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    # Given a Hangul filler (a letter to Unicode, dropped by normalisation) beside an ordinary word
    await pg.execute(
        "INSERT INTO lexicon (word, category, severity) VALUES ($1, 'test', 3), ('zorblax', 'test', 3)", "\u3164"
    )
    # Then the worker still loads the lexicon, without it
    lexicon = Lexicon(pg, settings)
    await lexicon.start()
    assert lexicon.matcher.size == 1 and [h.word for h in lexicon.matcher.match("a zorblax").hits] == ["zorblax"]
