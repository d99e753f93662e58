"""The README's table of every setting, made from `sieve/settings.py` (its `#:` comments and defaults).

`python -m sieve.settings_doc` prints it; tests/unit/sieve/test_settings.py checks that the README holds it as printed,
so a new setting cannot go undocumented.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from sieve.settings import ENV_PREFIX, Settings

BEGIN = "<!-- settings-table: begin (python -m sieve.settings_doc) -->"
END = "<!-- settings-table: end -->"


def _comments() -> dict[str, str]:
    """Each field's `#:` comment; a field right under another without one of its own shares the one above."""
    source = Path(__file__).with_name("settings.py").read_text()
    lines = source.splitlines()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    docs: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        i = node.lineno - 2
        comment: list[str] = []
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if not comment and i >= 0 and docs and re.match(r"\s+\w+: .+=", lines[i]):
            comment = [list(docs.values())[-1]]
        docs[node.target.id] = " ".join(comment)
    return docs


def _shown(value: object) -> str:
    if value == "":
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def markdown_table() -> str:
    docs = _comments()
    defaults = Settings()
    rows = ["| variable | default | what it is |", "| --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        text = docs.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{ENV_PREFIX}{f.name.upper()}` | `{_shown(getattr(defaults, f.name))}` | {text} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
