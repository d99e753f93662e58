"""Rules for strings that come from outside and end up in PostgreSQL or Redis, shared by every service.

Every string field a request carries is checked before anything is stored:

- **Length**: every string and every repeated field has a cap (the callers name theirs); a value over it is
  INVALID_ARGUMENT naming the field.
- **Storable**: PostgreSQL `text` cannot hold U+0000, so no string field that may reach it may contain one
  (`text_problem`). Lone surrogates cannot arrive: protobuf refuses a `string` field that is not valid UTF-8
  while parsing (`sieve.rpc.malformed` turns that into INVALID_ARGUMENT naming the field).
- **Identifiers** (keys, ids, names, URLs) are one printable line: no control characters, no line breaks
  (`printable=True`); free text (a TEXT task's text, a dead-letter error filter) may hold any character but
  U+0000.

Error messages quote at most a short prefix of the offending value (`shown`): a status message is sent as a
gRPC trailer, and a quoted megabyte would exceed the peer's metadata limit.
"""

from __future__ import annotations

import uuid

from sieve.errors import InvalidInput

SHOWN_CHARS = 40
#: the longest spelling of a UUID that `uuid.UUID` reads: "urn:uuid:" and 36 characters
MAX_UUID_CHARS = 45


def storable(value: str) -> str:
    """Text PostgreSQL can store: U+0000 (which no text column holds) becomes U+FFFD. For text Sieve writes itself
    from what a peer said (a nack reason, an error message); callers' input is refused instead."""
    return value.replace("\x00", "\ufffd")


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`repr` of a value for an error message, cut to `limit` characters."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"... ({len(value)} characters)"


def text_problem(
    value: str, *, max_chars: int | None = None, max_bytes: int | None = None, printable: bool = False
) -> str | None:
    """What is wrong with a string that is to be stored (None: nothing).

    `max_chars` / `max_bytes` cap its length (in characters / UTF-8 bytes); `printable` refuses control
    characters, line breaks and other non-printable characters (identifiers, URLs); U+0000 is always refused."""
    if max_chars is not None and len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    if max_bytes is not None and len(value) > max_bytes // 4:  # shorter: cannot be over it in UTF-8
        try:
            if len(value.encode()) > max_bytes:
                return f"is larger than {max_bytes} bytes"
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
    if printable:
        if not value.isprintable():
            return "must be printable (no control characters or line breaks)"
    elif "\x00" in value:
        return "must not contain U+0000 (NUL): PostgreSQL cannot store it"
    return None


def parse_uuid(raw: str, field: str, what: str = "task id") -> uuid.UUID:
    """A UUID from its text (any spelling `uuid.UUID` reads, at most 45 characters), or InvalidInput naming
    `field`. Compare and store `str()` of the result, never the raw text."""
    if len(raw) > MAX_UUID_CHARS:
        raise InvalidInput(field, f"{shown(raw)} is not a {what} (too long)")
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise InvalidInput(field, f"{shown(raw)} is not a {what}") from None


__all__ = ["MAX_UUID_CHARS", "SHOWN_CHARS", "parse_uuid", "shown", "text_problem"]
