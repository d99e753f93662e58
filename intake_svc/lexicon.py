"""LexiconService: operators list, add, remove, import and export the lexicon's words (sieve/db/lexicon.py).

Served by the intake process beside IntakeService; every method is operator-only (sieve/rpc/auth.py) and so
audited (sieve/rpc/audit.py: who, the request, the outcome). A request is checked whole before anything is
written: a bad word, category or severity, a word twice, too many words, a bad page token is INVALID_ARGUMENT
naming the field (`words[3].severity`), and nothing changes. Each answer carries the lexicon version after the
call; the workers reload within seconds of a change (worker_svc/lexicon.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from sieve.db.lexicon import MAX_PAGE_SIZE, BadPageToken, LexiconStore, Word
from sieve.errors import InvalidInput
from sieve.fields import shown, text_problem
from sieve.rpc.status import abort, invalid_argument
from sieve.v1 import lexicon_pb2, lexicon_pb2_grpc

LEXICON_SERVICE_NAME: str = lexicon_pb2.DESCRIPTOR.services_by_name["LexiconService"].full_name

#: longest word, in characters
MAX_WORD_CHARS = 100
#: most words one request may carry
MAX_WORDS = 100_000
#: what a category is: a lowercase letter, then lowercase letters, digits, '_' or '-'; 40 at most
CATEGORY = re.compile(r"[a-z][a-z0-9_-]{0,39}")
MIN_SEVERITY, MAX_SEVERITY = 1, 5
#: the longest page token ListLexicon hands out (a word, base64)
MAX_PAGE_TOKEN_CHARS = 4 * MAX_WORD_CHARS * 4


def word_problem(word: str) -> str | None:
    if not word:
        return "is required (a non-empty word)"
    if word != word.strip():
        return f"{shown(word)} has blanks around it"
    problem = text_problem(word, max_chars=MAX_WORD_CHARS, printable=True)
    if problem is None and not any(unicodedata.category(c)[0] in "LN" for c in word):
        # the worker matches words without their separators and punctuation: such a word would be nothing
        return f"{shown(word)} has no letter or digit"
    return problem


def category_problem(category: str) -> str | None:
    if CATEGORY.fullmatch(category) is None:
        return (
            f"{shown(category)} is not a category name: a lowercase letter, then lowercase letters, digits, '_' or "
            "'-', at most 40"
        )
    return None


def checked_words(words: Sequence[lexicon_pb2.LexiconWord], field: str = "words") -> list[Word]:
    """The request's words, or InvalidInput naming the first bad field."""
    if not words:
        raise InvalidInput(field, "is required: at least one word")
    if len(words) > MAX_WORDS:
        raise InvalidInput(field, f"at most {MAX_WORDS} words per call, got {len(words)}")
    seen: dict[str, int] = {}
    out: list[Word] = []
    for i, w in enumerate(words):
        problem = word_problem(w.word)
        if problem is not None:
            raise InvalidInput(f"{field}[{i}].word", problem)
        problem = category_problem(w.category)
        if problem is not None:
            raise InvalidInput(f"{field}[{i}].category", problem)
        if not MIN_SEVERITY <= w.severity <= MAX_SEVERITY:
            raise InvalidInput(
                f"{field}[{i}].severity", f"must be {MIN_SEVERITY} to {MAX_SEVERITY} (higher worse), got {w.severity}"
            )
        if w.word in seen:
            raise InvalidInput(f"{field}[{i}].word", f"{shown(w.word)} is also {field}[{seen[w.word]}]")
        seen[w.word] = i
        out.append(Word(w.word, w.category, w.severity))
    return out


def word_message(w: Word) -> lexicon_pb2.LexiconWord:
    updated = None
    if w.updated_at is not None:
        updated = timestamp_pb2.Timestamp()
        updated.FromDatetime(w.updated_at)
    return lexicon_pb2.LexiconWord(word=w.word, category=w.category, severity=w.severity, updated_at=updated)


class LexiconServicer(lexicon_pb2_grpc.LexiconServiceServicer):
    def __init__(self, store: LexiconStore) -> None:
        self.store = store

    async def ListLexicon(
        self, request: lexicon_pb2.ListLexiconRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> lexicon_pb2.ListLexiconResponse:
        try:
            if request.category:
                problem = category_problem(request.category)
                if problem is not None:
                    raise InvalidInput("category", problem)
            if request.word_prefix:
                problem = text_problem(request.word_prefix, max_chars=MAX_WORD_CHARS, printable=True)
                if problem is not None:
                    raise InvalidInput("word_prefix", problem)
            if request.page_size > MAX_PAGE_SIZE:
                raise InvalidInput("page_size", f"at most {MAX_PAGE_SIZE}, got {request.page_size}")
            if len(request.page_token) > MAX_PAGE_TOKEN_CHARS:
                raise InvalidInput("page_token", "is not one ListLexicon handed out (too long)")
            try:
                page = await self.store.page(
                    request.category, request.word_prefix, request.page_size, request.page_token
                )
            except BadPageToken:
                raise InvalidInput("page_token", "is not one ListLexicon handed out") from None
        except InvalidInput as exc:
            await abort(context, invalid_argument(exc.field, exc.description))
            raise
        return lexicon_pb2.ListLexiconResponse(
            words=[word_message(w) for w in page.words],
            next_page_token=page.next_page_token,
            version=page.version,
            total=page.total,
        )

    async def AddWords(
        self, request: lexicon_pb2.AddWordsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> lexicon_pb2.AddWordsResponse:
        words = await self._checked(request.words, context)
        change = await self.store.upsert(words)
        return lexicon_pb2.AddWordsResponse(version=change.version, added=change.added, updated=change.updated)

    async def RemoveWords(
        self, request: lexicon_pb2.RemoveWordsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> lexicon_pb2.RemoveWordsResponse:
        words = list(request.words)
        try:
            if not words:
                raise InvalidInput("words", "is required: at least one word")
            if len(words) > MAX_WORDS:
                raise InvalidInput("words", f"at most {MAX_WORDS} words per call, got {len(words)}")
            for i, word in enumerate(words):
                problem = word_problem(word)
                if problem is not None:
                    raise InvalidInput(f"words[{i}]", problem)
        except InvalidInput as exc:
            await abort(context, invalid_argument(exc.field, exc.description))
            raise
        change = await self.store.remove(list(dict.fromkeys(words)))
        return lexicon_pb2.RemoveWordsResponse(
            version=change.version, removed=change.removed, not_found=list(change.not_found)
        )

    async def ImportLexicon(
        self, request: lexicon_pb2.ImportLexiconRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> lexicon_pb2.ImportLexiconResponse:
        if request.mode not in (lexicon_pb2.IMPORT_MODE_MERGE, lexicon_pb2.IMPORT_MODE_REPLACE):
            await abort(context, invalid_argument("mode", "is required: IMPORT_MODE_MERGE or IMPORT_MODE_REPLACE"))
        words = await self._checked(request.words, context)
        change = await self.store.upsert(words, replace=request.mode == lexicon_pb2.IMPORT_MODE_REPLACE)
        return lexicon_pb2.ImportLexiconResponse(
            version=change.version, added=change.added, updated=change.updated, removed=change.removed
        )

    async def ExportLexicon(
        self, request: lexicon_pb2.ExportLexiconRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> lexicon_pb2.ExportLexiconResponse:
        words, version = await self.store.export()
        return lexicon_pb2.ExportLexiconResponse(words=[word_message(w) for w in words], version=version)

    async def _checked(
        self, words: Sequence[lexicon_pb2.LexiconWord], context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[Word]:
        try:
            return checked_words(words)
        except InvalidInput as exc:
            await abort(context, invalid_argument(exc.field, exc.description))
            raise


__all__ = ["LEXICON_SERVICE_NAME", "LexiconServicer", "checked_words"]
