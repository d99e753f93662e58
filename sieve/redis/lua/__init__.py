"""Loads Sieve's Lua scripts: one file per atomic state change, helpers inlined from `includes/`.

A line `--- @include "name"` is replaced by `includes/name.lua`, each helper at most once per script;
an include cycle is an error. File names end in `-<number of KEYS>` where the count is fixed.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^--- @include "([A-Za-z0-9_]+)"\s*$', re.MULTILINE)


class ScriptLoadError(ValueError):
    """A Lua script or one of its includes could not be assembled."""


def _expand(name: str, text: str, included: set[str], stack: tuple[str, ...], includes_dir: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        inc = match.group(1)
        if inc in stack:
            raise ScriptLoadError(f"include cycle: {' -> '.join((*stack, inc))}")
        if inc in included:
            return ""
        path = includes_dir / f"{inc}.lua"
        if not path.exists():
            raise ScriptLoadError(f"{name}: no include named {inc!r}")
        body = _expand(inc, path.read_text(), included, (*stack, inc), includes_dir)
        included.add(inc)
        return body

    return _INCLUDE.sub(replace, text)


def assemble(text: str, name: str = "<script>", includes_dir: Path = LUA_DIR / "includes") -> str:
    """Returns `text` with its includes inlined (each once), raising ScriptLoadError on a cycle."""
    return _expand(name, text, set(), (name,), includes_dir)


@cache
def load(name: str) -> str:
    """The assembled source of `<name>.lua` or `<name>-<n>.lua`."""
    matches = [p for p in LUA_DIR.glob(f"{name}*.lua") if re.fullmatch(rf"{name}(-\d+)?\.lua", p.name)]
    if len(matches) != 1:
        raise ScriptLoadError(f"expected one script named {name}, found {[p.name for p in matches]}")
    return assemble(matches[0].read_text(), matches[0].name)


def key_count(name: str) -> int | None:
    """The KEYS count in the script's file name, or None for scripts with a variable count."""
    for path in LUA_DIR.glob(f"{name}*.lua"):
        found = re.fullmatch(rf"{name}-(\d+)\.lua", path.name)
        if found:
            return int(found.group(1))
    return None
