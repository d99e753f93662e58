"""The lexicon table (migration 0001) as operators change it: every SQL statement of LexiconService lives here.

The table's statement trigger bumps `lexicon_version` and notifies `sieve_lexicon` on every INSERT, UPDATE or
DELETE; each change here runs in one transaction and reads the version it made before committing, so the answer
names the version the workers will load. A change that would touch nothing (removing words none of which are
there) runs no statement, and leaves the version as it is. The worker's reading and seeding of the table is in
worker_svc/lexicon.py.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

#: most words one listing page holds, and the default
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    category: str
    severity: int
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Page:
    words: list[Word]
    next_page_token: str
    version: int
    total: int


@dataclass(frozen=True, slots=True)
class Change:
    """What a change did, and the lexicon version after it."""

    version: int
    added: int = 0
    updated: int = 0
    removed: int = 0
    not_found: tuple[str, ...] = ()


class BadPageToken(ValueError):
    """A page token this store did not hand out."""


def encode_page_token(word: str) -> str:
    return base64.urlsafe_b64encode(word.encode()).decode().rstrip("=")


def decode_page_token(token: str) -> str:
    try:
        word = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadPageToken(token[:40]) from None
    if "\x00" in word:  # no word holds one (PostgreSQL's text cannot)
        raise BadPageToken(token[:40])
    return word


_UPSERT = """
    INSERT INTO lexicon (word, category, severity, updated_at)
    SELECT u.word, u.category, u.severity, now()
    FROM unnest($1::text[], $2::text[], $3::smallint[]) AS u(word, category, severity)
    ON CONFLICT (word) DO UPDATE SET category = EXCLUDED.category, severity = EXCLUDED.severity, updated_at = now()
    RETURNING (xmax = 0) AS inserted
"""


def _rows(r: asyncpg.Record) -> Word:
    return Word(r["word"], r["category"], r["severity"], r["updated_at"])


class LexiconStore:
    """The lexicon through one asyncpg pool on the service's schema."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def version(self) -> int:
        return int(await self.pool.fetchval("SELECT version FROM lexicon_version"))

    async def page(self, category: str = "", word_prefix: str = "", limit: int = 0, page_token: str = "") -> Page:
        """Words matching the filters, by word, from after the page token's word."""
        limit = max(1, min(limit or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE))
        after = decode_page_token(page_token) if page_token else None
        filters = (category or None, word_prefix or None)
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                """
                SELECT word, category, severity, updated_at FROM lexicon
                WHERE ($1::text IS NULL OR category = $1) AND ($2::text IS NULL OR starts_with(word, $2))
                  AND ($3::text IS NULL OR word > $3)
                ORDER BY word LIMIT $4
                """,
                *filters,
                after,
                limit + 1,
            )
            total = await conn.fetchval(
                "SELECT count(*) FROM lexicon "
                "WHERE ($1::text IS NULL OR category = $1) AND ($2::text IS NULL OR starts_with(word, $2))",
                *filters,
            )
            version = await conn.fetchval("SELECT version FROM lexicon_version")
        words = [_rows(r) for r in rows[:limit]]
        token = encode_page_token(words[-1].word) if len(rows) > limit else ""
        return Page(words, token, int(version), int(total))

    async def export(self) -> tuple[list[Word], int]:
        """Every word, by word, and the version they make (one snapshot)."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch("SELECT word, category, severity, updated_at FROM lexicon ORDER BY word")
            version = await conn.fetchval("SELECT version FROM lexicon_version")
        return [_rows(r) for r in rows], int(version)

    async def upsert(self, words: Sequence[Word], *, replace: bool = False) -> Change:
        """Adds the words or sets their category and severity; with `replace`, every other word is removed."""
        async with self.pool.acquire() as conn, conn.transaction():
            removed = 0
            if replace:
                removed = len(
                    await conn.fetch(
                        "DELETE FROM lexicon AS l WHERE NOT EXISTS "
                        "(SELECT 1 FROM unnest($1::text[]) AS u(word) WHERE u.word = l.word) RETURNING l.word",
                        [w.word for w in words],
                    )
                )
            rows = await conn.fetch(
                _UPSERT, [w.word for w in words], [w.category for w in words], [w.severity for w in words]
            )
            added = sum(1 for r in rows if r["inserted"])
            version = await conn.fetchval("SELECT version FROM lexicon_version")
        return Change(int(version), added=added, updated=len(rows) - added, removed=removed)

    async def remove(self, words: Sequence[str]) -> Change:
        """Removes the words that are there; names the others."""
        async with self.pool.acquire() as conn, conn.transaction():
            present = {
                r["word"]
                for r in await conn.fetch(
                    "SELECT word FROM lexicon WHERE word = ANY($1::text[]) FOR UPDATE", list(words)
                )
            }
            if present:
                await conn.execute("DELETE FROM lexicon WHERE word = ANY($1::text[])", list(present))
            version = await conn.fetchval("SELECT version FROM lexicon_version")
        return Change(int(version), removed=len(present), not_found=tuple(w for w in words if w not in present))


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "BadPageToken",
    "Change",
    "LexiconStore",
    "Page",
    "Word",
    "decode_page_token",
    "encode_page_token",
]
