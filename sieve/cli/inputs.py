"""What `sieve submit` sends: texts (arguments, lines of files) and images (files, directories, globs), each with
the idempotency key that makes submitting it again return the same task.

A text's key is its content hash; an image's is its file name and its content hash — so re-running a submit of a
folder after an interruption resubmits nothing that was accepted, and a file changed since gets a task of its own.
"""

from __future__ import annotations

import glob
import hashlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sieve.cli.client import CliError, ExitCode

#: the image files a directory is searched for (the formats the intake accepts)
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp"})
#: the intake's limit on an idempotency key (intake_svc/validation.py MAX_IDEMPOTENCY_KEY)
MAX_KEY = 200


@dataclass(frozen=True)
class Item:
    """One task to submit: where it came from (shown in the summary), its payload and its key."""

    source: str
    text: str | None = None
    image: bytes | None = None
    key: str = ""

    @property
    def size(self) -> int:
        return len(self.image) if self.image is not None else len((self.text or "").encode())


def _digest(data: bytes, length: int) -> str:
    return hashlib.sha256(data).hexdigest()[:length]


def text_key(prefix: str, text: str) -> str:
    return f"{prefix}:text:{_digest(text.encode(), 32)}"


def image_key(prefix: str, name: str, data: bytes) -> str:
    """`prefix:file:<name>:<16 hex of the content's SHA-256>`; a long name keeps its end (the file's own name)."""
    room = MAX_KEY - len(prefix) - len(":file::") - 16
    return f"{prefix}:file:{name[-room:]}:{_digest(data, 16)}"


def _shown(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 40 else flat[:39] + "…"


def texts(arguments: Iterable[str], files: Iterable[str], prefix: str | None) -> Iterator[Item]:
    """The texts given as arguments, then each non-empty line of each file ("-": standard input)."""
    for text in arguments:
        yield Item(_shown(text), text=text, key=text_key(prefix, text) if prefix else "")
    for path in files:
        try:
            lines = sys.stdin.read().splitlines() if path == "-" else Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--file {path}: cannot read it: {exc}", ExitCode.USAGE) from None
        for number, line in enumerate(lines, 1):
            if line.strip():
                yield Item(f"{path}:{number}", text=line, key=text_key(prefix, line) if prefix else "")


def image_paths(patterns: Iterable[str]) -> list[Path]:
    """Each pattern as a file, a directory (its image files, recursively, by name) or a glob; in order, once each."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            matches = [path]
        else:
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matches:
                raise CliError(f"--image {pattern}: no such file, directory or matching files", ExitCode.USAGE)
        found.update(dict.fromkeys(matches))
    return list(found)


def images(paths: Iterable[Path], prefix: str | None) -> Iterator[Item]:
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CliError(f"--image {path}: cannot read it: {exc.strerror}", ExitCode.USAGE) from None
        yield Item(str(path), image=data, key=image_key(prefix, path.as_posix(), data) if prefix else "")


def batches(items: list[Item], size: int, max_bytes: int) -> list[list[Item]]:
    """`items` in order, in batches of at most `size` items and `max_bytes` of payload (an item alone may pass it)."""
    out: list[list[Item]] = []
    current: list[Item] = []
    held = 0
    for item in items:
        if current and (len(current) >= size or held + item.size > max_bytes):
            out.append(current)
            current, held = [], 0
        current.append(item)
        held += item.size
    if current:
        out.append(current)
    return out


__all__ = ["IMAGE_SUFFIXES", "Item", "batches", "image_key", "image_paths", "images", "text_key", "texts"]
