"""The worker's lexicon: the shipped default loads on first start, and a change of the table is picked
up without a restart."""

from __future__ import annotations

import asyncio

import asyncpg

from sieve.settings import Settings
from worker_svc.lexicon import Lexicon
from worker_svc.text import load_lexicon_file


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
