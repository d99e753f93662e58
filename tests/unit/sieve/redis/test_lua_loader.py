"""Unit tests of the Lua script loader (sieve.redis.lua) and of the shipped scripts' shape.

The loader: `--@requires` headers resolved in dependency order, each include once, a missing include or a cycle
refused with the path to it. The shipped scripts: each loads; every script binds its KEYS and ARGV to the names
its header lists, at its top, and indexes them nowhere else (includes never touch them); the KEYS count in a
file name is the highest key bound; the status-code table the scripts return (includes/codes.lua) is Python's
ScriptCode, and every code a script names exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sieve.errors import ScriptCode
from sieve.redis import lua
from sieve.redis.lua import INCLUDES_DIR, LUA_DIR, ScriptLoadError, assemble, key_count, requires, resolve
from sieve.redis.queue_store import QueueStore

SHIPPED = sorted(LUA_DIR.glob("*.lua"))
INCLUDES = sorted(INCLUDES_DIR.glob("*.lua"))
_COUNTED = re.compile(r"(?P<name>[A-Za-z]+)-(?P<count>\d+)\.lua")
_BLOCK_COMMENT = re.compile(r"--\[(=*)\[.*?\]\1\]", re.DOTALL)
_LINE_COMMENT = re.compile(r"--[^\n]*")
#: a header line naming one KEYS or ARGV binding: "KEYS[12]  lockKey  what it is", "ARGV[9..]  raws  ..."
_HEADER_BINDING = re.compile(r"^\s+(?P<kind>KEYS|ARGV)\[(?P<index>[^\]]+)\]\s+(?P<name>[A-Za-z]\w*)\s", re.MULTILINE)
_CODE_LINE = re.compile(r"^\s*(?P<name>[A-Z_]+)\s*=\s*(?P<value>-?\d+),", re.MULTILINE)


def _write(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / f"{name}.lua").write_text(body)
    return folder


def _code_only(source: str) -> str:
    """Lua source without its comments (the headers document KEYS[n] in prose)."""
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", source))


def _script_name(path: Path) -> str:
    match = _COUNTED.fullmatch(path.name)
    return match.group("name") if match else path.stem


def _header(path: Path) -> str:
    header = _BLOCK_COMMENT.search(path.read_text())
    assert header is not None, f"{path.name} has no header comment"
    return header.group(0)


def _code_lines(path: Path) -> list[str]:
    """The script's own lines of code (no comments, no blank lines, no --@requires)."""
    return [line for line in _code_only(path.read_text()).splitlines() if line.strip()]


def _bindings(path: Path) -> tuple[list[str], list[str]]:
    """(the binding lines at the top of a script: those that read KEYS or ARGV, up to its first other line of
    code; the code lines after them)."""
    lines = _code_lines(path)
    top = 0
    while top < len(lines) and re.search(r"\b(KEYS|ARGV)\b", lines[top]):
        top += 1
    return lines[:top], lines[top:]


# --- resolving --requires ---------------------------------------------------------------------------


def test_a_required_include_is_inlined_where_the_requires_line_was(tmp_path: Path) -> None:
    includes = _write(tmp_path, helper="local function helper() return 1 end\n")
    out = assemble("-- a script\n--@requires helper\n\nreturn helper()\n", "main", includes)
    assert out == "-- a script\nlocal function helper() return 1 end\n\nreturn helper()\n"


def test_includes_come_in_dependency_order_each_once(tmp_path: Path) -> None:
    # Given b requires a, c requires a and b, and the script requires c, a and b
    includes = _write(
        tmp_path,
        a="local A = 1 -- from a\n",
        b="--@requires a\nlocal B = A + 1 -- from b\n",
        c="--@requires a, b\nlocal C = A + B -- from c\n",
    )
    # When it is assembled
    out = assemble("--@requires c\n--@requires a b\nreturn C\n", "main", includes)
    # Then each body appears once, after what it requires, and no requires line is left
    for name in "abc":
        assert out.count(f"-- from {name}") == 1
    assert out.index("-- from a") < out.index("-- from b") < out.index("-- from c") < out.index("return C")
    assert "@requires" not in out


def test_resolve_lists_every_include_needed_directly_or_not_after_its_requirements(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="-- a\n", b="--@requires a\n-- b\n", c="--@requires b\n-- c\n", d="-- d\n")
    assert [name for name, _ in resolve(["c", "d"], "main", includes)] == ["a", "b", "c", "d"]


def test_requires_reads_names_separated_by_commas_or_blanks_each_once() -> None:
    assert requires("--@requires a, b c\nlocal x = 1\n--@requires b,d\n") == ["a", "b", "c", "d"]


def test_a_requires_line_with_a_bad_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScriptLoadError, match=r"'a\.lua' is not an include name"):
        assemble("--@requires a.lua\n", "main", _write(tmp_path))


def test_an_include_cycle_raises_and_names_the_path(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="--@requires b\n", b="--@requires a\n")
    with pytest.raises(ScriptLoadError, match="cycle: main -> a -> b -> a"):
        assemble("--@requires a\n", "main", includes)


def test_an_include_that_requires_itself_is_a_cycle(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="--@requires a\n")
    with pytest.raises(ScriptLoadError, match="cycle: main -> a -> a"):
        assemble("--@requires a\n", "main", includes)


def test_a_missing_include_raises_and_names_it_and_who_needs_it(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="-- a\n")
    with pytest.raises(ScriptLoadError, match="main: no include named 'nowhere'"):
        assemble("--@requires a, nowhere\n", "main", includes)


def test_a_missing_include_required_by_an_include_raises_and_names_that_include(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="--@requires gone\n")
    with pytest.raises(ScriptLoadError, match="a: no include named 'gone'"):
        assemble("--@requires a\n", "main", includes)


def test_lines_that_only_look_like_requires_are_left_alone(tmp_path: Path) -> None:
    includes = _write(tmp_path)
    text = '-- @requires a\n  --@requires a\nlocal s = "--@requires a"\n'
    assert assemble(text, "main", includes) == text


def test_loading_an_unknown_script_raises() -> None:
    with pytest.raises(ScriptLoadError, match="expected one script named noSuchScript"):
        lua.load("noSuchScript")


# --- the shipped scripts ---------------------------------------------------------------------------------


def test_every_script_the_queue_store_uses_is_shipped_once() -> None:
    names = [_script_name(p) for p in SHIPPED]
    assert len(names) == len(set(names))
    assert set(QueueStore._SCRIPTS) <= set(names)
    for name in QueueStore._SCRIPTS:
        assert lua.load(name)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_script_loads_with_each_include_it_needs_inlined_once(path: Path) -> None:
    source = lua.load(_script_name(path))
    assert "@requires" not in source
    code = _code_only(source)
    for name, text in resolve(requires(path.read_text(), path.name), path.name):
        assert code.count(_code_only(text).strip()) == 1, name


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_script_binds_keys_and_argv_at_its_top_and_indexes_them_nowhere_else(path: Path) -> None:
    top, rest = _bindings(path)
    assert top, f"{path.name} binds no KEYS or ARGV at its top"
    for line in top:
        assert re.match(r"local [A-Za-z]\w* = ", line), f"{path.name}: not a binding: {line!r}"
    below = [line for line in rest if re.search(r"\b(KEYS|ARGV)\b", line)]
    assert below == [], f"{path.name} reads KEYS or ARGV below its bindings"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_header_lists_exactly_the_names_the_script_binds(path: Path) -> None:
    listed = {m.group("name"): (m.group("kind"), m.group("index")) for m in _HEADER_BINDING.finditer(_header(path))}
    top, _ = _bindings(path)
    bound = {re.match(r"local (\w+) = ", line).group(1): line for line in top}  # type: ignore[union-attr]
    assert set(listed) == set(bound), path.name
    for name, (kind, index) in listed.items():
        line = bound[name]
        assert kind in line, (path.name, name, line)
        if index.isdigit():
            assert f"{kind}[{index}]" in line, (path.name, name, line)
        elif index.endswith(".."):  # a variable tail: slice(ARGV, n)
            assert f"slice({kind}, {index[:-2]})" in line, (path.name, name, line)


@pytest.mark.parametrize("path", [p for p in SHIPPED if _COUNTED.fullmatch(p.name)], ids=lambda p: p.name)
def test_the_keys_count_in_the_file_name_is_the_keys_the_script_binds(path: Path) -> None:
    match = _COUNTED.fullmatch(path.name)
    assert match is not None
    name, count = match.group("name"), int(match.group("count"))
    top, _ = _bindings(path)
    # Given the keys bound one by one, and the device block (KEYS[1..11]) where the script takes one
    used = [int(n) for line in top for n in re.findall(r"KEYS\[(\d+)\]", line)]
    if any("deviceBlock(KEYS" in line for line in top):
        used += range(1, 12)
    # Then they are KEYS[1..count], each once, as the file name and the header say
    assert sorted(used) == list(range(1, count + 1)), path.name
    documented = [int(n) for n in re.findall(r"KEYS\[(?:\d+\.\.)?(\d+)\]", _header(path))]
    assert max(documented) == count
    assert key_count(name) == count


def test_a_script_without_a_count_in_its_name_has_a_variable_key_count() -> None:
    assert key_count("recountPending") is None
    assert "slice(KEYS, 3)" in lua.load("recountPending")


@pytest.mark.parametrize("path", INCLUDES, ids=lambda p: p.name)
def test_an_include_takes_everything_as_arguments_never_from_keys_or_argv(path: Path) -> None:
    assert not re.search(r"\b(KEYS|ARGV)\b", _code_only(path.read_text())), path.name


@pytest.mark.parametrize("path", INCLUDES, ids=lambda p: p.name)
def test_every_include_resolves(path: Path) -> None:
    assert [name for name, _ in resolve([path.stem])][-1] == path.stem


# --- the status codes ------------------------------------------------------------------------------------


def test_the_lua_code_table_is_pythons_script_code() -> None:
    table = {
        m.group("name"): int(m.group("value"))
        for m in _CODE_LINE.finditer(_code_only((INCLUDES_DIR / "codes.lua").read_text()))
    }
    assert table == {code.name: code.value for code in ScriptCode}


def test_the_codes_are_distinct() -> None:
    assert len({code.value for code in ScriptCode}) == len(ScriptCode)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_code_a_script_returns_is_in_the_table_and_required(path: Path) -> None:
    used = set(re.findall(r"\bCODE\.([A-Z_]+)", _code_only(path.read_text())))
    assert used <= set(ScriptCode.__members__), path.name
    if used:
        assert "codes" in requires(path.read_text()), path.name
