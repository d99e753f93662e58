"""Loading of lexicon files: the tab-separated ``word / category / severity`` format.

This module owns the on-disk lexicon format and the default lexicon shipped with the worker
(``lexicon_default.tsv``, next to this module). The format is UTF-8 text (a BOM is tolerated):

* blank lines and lines whose first non-blank character is ``#`` are ignored;
* the first other line is the header ``word<TAB>category<TAB>severity``;
* every following line has exactly three tab-separated fields; the word may contain spaces, and
  the severity is an integer.

Errors raise ``ValueError`` naming the file and the 1-based line number.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from worker_svc.text.matcher import LexiconEntry

__all__ = ["DEFAULT_LEXICON_NAME", "load_lexicon_file", "parse_lexicon"]

DEFAULT_LEXICON_NAME = "lexicon_default.tsv"
_HEADER = ("word", "category", "severity")


def load_lexicon_file(path: Path | None = None) -> list[LexiconEntry]:
    """Read a lexicon file; without ``path``, the default lexicon shipped with this package."""
    if path is None:
        resource = resources.files("worker_svc.text").joinpath(DEFAULT_LEXICON_NAME)
        return parse_lexicon(resource.read_text(encoding="utf-8-sig"), source=DEFAULT_LEXICON_NAME)
    return parse_lexicon(Path(path).read_text(encoding="utf-8-sig"), source=str(path))


def parse_lexicon(content: str, source: str = "<lexicon>") -> list[LexiconEntry]:
    """Parse the text of a lexicon file (see the module docstring for the format)."""
    entries: list[LexiconEntry] = []
    header_seen = False
    for lineno, raw in enumerate(content.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = [field.strip() for field in raw.split("\t")]
        if not header_seen:
            if tuple(field.lower() for field in fields) != _HEADER:
                raise ValueError(
                    f"{source}, line {lineno}: expected the header 'word<TAB>category<TAB>severity', got {raw!r}"
                )
            header_seen = True
            continue
        if len(fields) != 3:
            raise ValueError(f"{source}, line {lineno}: expected 3 tab-separated fields, got {len(fields)}")
        word, category, severity_text = fields
        if not word:
            raise ValueError(f"{source}, line {lineno}: empty word")
        if not category:
            raise ValueError(f"{source}, line {lineno}: empty category")
        try:
            severity = int(severity_text)
        except ValueError:
            raise ValueError(f"{source}, line {lineno}: severity must be an integer, got {severity_text!r}") from None
        entries.append(LexiconEntry(word=word, category=category, severity=severity))
    return entries
