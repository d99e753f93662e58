"""The worker's lexicon: loaded from PostgreSQL into a Matcher, reloaded when the table changes.

The first start with an empty table loads the shipped default lexicon file. A change is noticed at once by
LISTEN on `sieve_lexicon` (the table's trigger notifies: `watch`) and, as a fallback, by `check`, which looks at the
version row and reloads when it moved: the worker's `lexicon-check` job, every `lexicon_check_interval_s`, and
run as soon as possible on each notification (worker_svc/app.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable

import asyncpg

from sieve.settings import Settings
from worker_svc.text import LexiconEntry, Matcher, RuleConfig, fold, load_lexicon_file

log = logging.getLogger("sieve.worker.lexicon")
#: how often the LISTEN connection is looked at, and the wait before opening it again after an error
POLL_S = 5.0


async def seed_default_lexicon(pool: asyncpg.Pool, settings: Settings) -> int:
    """Loads the shipped lexicon into an empty table (once, even with many workers starting)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1)", zlib.crc32(f"sieve-lexicon:{settings.database_schema}".encode())
        )
        if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM lexicon)"):
            return 0
        entries = load_lexicon_file()
        await conn.executemany(
            "INSERT INTO lexicon (word, category, severity) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            [(e.word, e.category, e.severity) for e in entries],
        )
        log.info("loaded the default lexicon: %d words", len(entries))
        return len(entries)


class Lexicon:
    """Holds the current Matcher built from the lexicon in PostgreSQL; `start` loads it (seeding the default
    lexicon into an empty table), `check` and `watch` keep it fresh."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        try:
            self.rules = RuleConfig.parse(settings.text_rules)
        except ValueError as exc:
            raise ValueError(f"SIEVE_TEXT_RULES: {exc}") from None
        self.matcher = Matcher(())
        self.version = -1
        self._changed = asyncio.Event()
        self._checking = asyncio.Lock()

    async def load(self) -> None:
        async with self.pool.acquire() as conn:
            version = await conn.fetchval("SELECT version FROM lexicon_version")
            rows = await conn.fetch("SELECT word, category, severity FROM lexicon")
        entries = [LexiconEntry(r["word"], r["category"], r["severity"]) for r in rows]
        # building folds every word and its spellings (and, the first time, loads the rule tables): not on the loop
        self.matcher = await asyncio.to_thread(self._build, entries, version)
        self.version = version
        log.info("lexicon version %d loaded: %d words", version, self.matcher.size)

    def _build(self, entries: list[LexiconEntry], version: int) -> Matcher:
        """The Matcher of these entries; a word that is nothing once normalised (only separators and invisible
        characters: LexiconService refuses most, not every one) is left out with a warning, not the lexicon."""

        def build(chosen: list[LexiconEntry]) -> Matcher:
            return Matcher(
                chosen,
                block_severity=self.settings.block_severity,
                version=version,
                rules=self.rules,
                review_severity=self.settings.review_severity,
            )

        try:
            return build(entries)
        except ValueError:
            kept = [e for e in entries if fold(e.word).normalized.text]
            left_out = sorted({e.word for e in entries} - {e.word for e in kept})
            log.warning(
                "lexicon version %d: left out %d words that match nothing: %r", version, len(left_out), left_out[:20]
            )
            return build(kept)

    async def start(self) -> None:
        await seed_default_lexicon(self.pool, self.settings)
        await self.load()

    async def check(self) -> str:
        """Reloads the lexicon when its version row moved (one check at a time); what it found."""
        async with self._checking:
            version = await self.pool.fetchval("SELECT version FROM lexicon_version")
            if version == self.version:
                return f"version {version} is loaded"
            await self.load()
            return f"version {self.version} loaded: {self.matcher.size} words"

    async def watch(self, changed: Callable[[], None] | None = None) -> None:
        """Listens for NOTIFY sieve_lexicon; on each notification, and once each time it starts listening (what
        changed meanwhile), calls `changed` (the worker: its lexicon-check job, as soon as possible) or, without
        one, `check`. Until cancelled; a lost connection is opened again after POLL_S."""
        conn: asyncpg.Connection | None = None
        while True:
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.settings.database_url)
                    await conn.add_listener("sieve_lexicon", lambda *_: self._changed.set())
                    self._changed.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):  # not wait_for: in 3.11 it can swallow a cancel
                        await self._changed.wait()
                if not self._changed.is_set():
                    continue
                self._changed.clear()
                if changed is not None:
                    changed()
                else:
                    await self.check()
            except asyncio.CancelledError:
                if conn is not None:
                    await conn.close()
                raise
            except Exception as exc:
                log.warning("lexicon watch: %s", exc)
                conn = None
                await asyncio.sleep(POLL_S)
