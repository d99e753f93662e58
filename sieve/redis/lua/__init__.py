"""Loads Sieve's Lua scripts: one file per atomic state change, helpers inlined from `includes/`.

A script or an include names the includes it needs on a line of its own, outside any comment:

    --@requires parseEntry, countOutstanding

(names separated by commas or blanks; several such lines add up). The loader inlines every include a script
needs, directly or through other includes, once each and each after its own requirements (depth first, in
the order they are named), where the script's first `--@requires` line stood. A missing include or a cycle is
a ScriptLoadError that names the path to it.

File names end in `-<number of KEYS>` where the count is fixed; every script binds its KEYS and ARGV to named
locals at its top (`tests/unit/sieve/redis/test_lua_loader.py` checks both). The status codes the scripts
return are `includes/codes.lua`, the same table as `sieve.errors.ScriptCode` (checked by the same tests).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent
INCLUDES_DIR = LUA_DIR / "includes"
_REQUIRES = re.compile(r"^--@requires[ \t]+([^\n]*?)[ \t]*$", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class ScriptLoadError(ValueError):
    """A Lua script or one of its includes could not be assembled."""


def requires(text: str, name: str = "<script>") -> list[str]:
    """The includes `text` names on its `--@requires` lines, in order, each once."""
    out: list[str] = []
    for line in _REQUIRES.findall(text):
        for inc in re.split(r"[,\s]+", line.strip()):
            if not _NAME.fullmatch(inc):
                raise ScriptLoadError(f"{name}: {inc!r} is not an include name (in --@requires {line})")
            if inc not in out:
                out.append(inc)
    return out


def _read_include(name: str, needed_by: str, includes_dir: Path) -> str:
    path = includes_dir / f"{name}.lua"
    if not path.is_file():
        raise ScriptLoadError(f"{needed_by}: no include named {name!r} (looked for {path})")
    return path.read_text()


def resolve(needs: list[str], name: str = "<script>", includes_dir: Path = INCLUDES_DIR) -> list[tuple[str, str]]:
    """Every include that `needs` requires, directly or not, as (name, source) in an order where each comes after
    the includes it requires; raises ScriptLoadError on a missing include or a cycle."""
    done: dict[str, str] = {}

    def visit(inc: str, path: tuple[str, ...]) -> None:
        if inc in path:
            raise ScriptLoadError(f"include cycle: {' -> '.join((*path, inc))}")
        if inc in done:
            return
        text = _read_include(inc, path[-1], includes_dir)
        for dep in requires(text, inc):
            visit(dep, (*path, inc))
        done[inc] = text

    for inc in needs:
        visit(inc, (name,))
    return list(done.items())


def _body(text: str) -> str:
    """An include's text without its `--@requires` lines."""
    return _REQUIRES.sub("", text).lstrip("\n")


def assemble(text: str, name: str = "<script>", includes_dir: Path = INCLUDES_DIR) -> str:
    """Returns `text` with the includes it requires inlined (each once, in dependency order) where its first
    `--@requires` line stood, raising ScriptLoadError on a missing include or a cycle."""
    first = _REQUIRES.search(text)
    if first is None:
        return text
    bodies = "".join(
        _body(source).rstrip("\n") + "\n\n" for _, source in resolve(requires(text, name), name, includes_dir)
    )
    rest = _REQUIRES.sub("", text[first.end() :]).lstrip("\n")
    return text[: first.start()] + bodies + rest


def script_path(name: str) -> Path:
    """The file of the script `<name>.lua` or `<name>-<n>.lua`."""
    matches = [p for p in LUA_DIR.glob(f"{name}*.lua") if re.fullmatch(rf"{re.escape(name)}(-\d+)?\.lua", p.name)]
    if len(matches) != 1:
        raise ScriptLoadError(f"expected one script named {name}, found {[p.name for p in matches]}")
    return matches[0]


@cache
def load(name: str) -> str:
    """The assembled source of `<name>.lua` or `<name>-<n>.lua`."""
    path = script_path(name)
    return assemble(path.read_text(), path.name)


def key_count(name: str) -> int | None:
    """The KEYS count in the script's file name, or None for scripts with a variable count."""
    found = re.fullmatch(rf"{re.escape(name)}-(\d+)\.lua", script_path(name).name)
    return int(found.group(1)) if found else None
