"""Unit tests of the Lua script loader (sieve.redis.lua): `--- @include` inlining (each helper once, cycles
and missing helpers refused) and the shipped scripts (each loads; the KEYS count in a file name is the
highest KEYS[n] its body uses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sieve.redis import lua
from sieve.redis.lua import LUA_DIR, ScriptLoadError, assemble, key_count
from sieve.redis.queue_store import QueueStore

SHIPPED = sorted(LUA_DIR.glob("*.lua"))
_COUNTED = re.compile(r"(?P<name>[A-Za-z]+)-(?P<count>\d+)\.lua")
_KEY_INDEX = re.compile(r"KEYS\[(\d+)\]")
_BLOCK_COMMENT = re.compile(r"--\[(=*)\[.*?\]\1\]", re.DOTALL)
_LINE_COMMENT = re.compile(r"--[^\n]*")


def _write(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / f"{name}.lua").write_text(body)
    return folder


def _code_only(source: str) -> str:
    """Lua source without its comments (the headers document KEYS[n] in prose)."""
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", source))


def test_an_include_is_replaced_by_the_helper_body(tmp_path: Path) -> None:
    includes = _write(tmp_path, helper="local function helper() return 1 end\n")
    out = assemble('--- @include "helper"\nreturn helper()\n', "main", includes)
    assert out == "local function helper() return 1 end\n\nreturn helper()\n"


def test_a_helper_included_twice_is_inlined_once(tmp_path: Path) -> None:
    # Given b includes a, and the script includes a, b and a again
    includes = _write(
        tmp_path,
        a="local A = 1 -- from a\n",
        b='--- @include "a"\nlocal B = A + 1 -- from b\n',
    )
    script = '--- @include "a"\n--- @include "b"\n--- @include "a"\nreturn B\n'
    # When it is assembled
    out = assemble(script, "main", includes)
    # Then a's body appears once, before b's, and no include line is left
    assert out.count("-- from a") == 1
    assert out.count("-- from b") == 1
    assert out.index("-- from a") < out.index("-- from b")
    assert "@include" not in out


def test_a_helper_included_only_through_another_helper_is_inlined_before_it(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="-- body a\n", b='--- @include "a"\n-- body b\n')
    out = assemble('--- @include "b"\n--- @include "a"\n', "main", includes)
    assert out.count("-- body a") == 1
    assert out.index("-- body a") < out.index("-- body b")


def test_an_include_cycle_raises_and_names_the_path(tmp_path: Path) -> None:
    includes = _write(tmp_path, a='--- @include "b"\n', b='--- @include "a"\n')
    with pytest.raises(ScriptLoadError, match="cycle: main -> a -> b -> a"):
        assemble('--- @include "a"\n', "main", includes)


def test_a_helper_that_includes_itself_is_a_cycle(tmp_path: Path) -> None:
    includes = _write(tmp_path, a='--- @include "a"\n')
    with pytest.raises(ScriptLoadError, match="cycle"):
        assemble('--- @include "a"\n', "main", includes)


def test_a_missing_include_raises_and_names_it(tmp_path: Path) -> None:
    includes = _write(tmp_path, a="-- a\n")
    with pytest.raises(ScriptLoadError, match="'nowhere'"):
        assemble('--- @include "a"\n--- @include "nowhere"\n', "main", includes)


def test_a_missing_include_inside_a_helper_raises(tmp_path: Path) -> None:
    includes = _write(tmp_path, a='--- @include "gone"\n')
    with pytest.raises(ScriptLoadError, match="'gone'"):
        assemble('--- @include "a"\n', "main", includes)


def test_lines_that_only_look_like_includes_are_left_alone(tmp_path: Path) -> None:
    includes = _write(tmp_path)
    text = '-- @include "a"\nlocal s = "--- @include \\"a\\""\n'
    assert assemble(text, "main", includes) == text


def test_loading_an_unknown_script_raises() -> None:
    with pytest.raises(ScriptLoadError, match="expected one script named noSuchScript"):
        lua.load("noSuchScript")


def test_every_script_the_queue_store_uses_is_shipped_once() -> None:
    names = [_COUNTED.fullmatch(p.name).group("name") if _COUNTED.fullmatch(p.name) else p.stem
             for p in SHIPPED]
    assert len(names) == len(set(names))
    assert set(QueueStore._SCRIPTS) <= set(names)
    for name in QueueStore._SCRIPTS:
        assert lua.load(name)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_script_loads_with_its_includes_inlined(path: Path) -> None:
    name = _COUNTED.fullmatch(path.name).group("name") if _COUNTED.fullmatch(path.name) else path.stem
    source = lua.load(name)
    assert "@include" not in source
    # every helper a script includes is defined exactly once in the assembled source
    for inc in re.findall(r'^--- @include "(\w+)"', path.read_text(), re.MULTILINE):
        assert source.count(f"local function {inc}(") == 1, inc


@pytest.mark.parametrize(
    "path", [p for p in SHIPPED if _COUNTED.fullmatch(p.name)], ids=lambda p: p.name)
def test_the_keys_count_in_the_file_name_is_the_highest_key_the_script_uses(path: Path) -> None:
    match = _COUNTED.fullmatch(path.name)
    assert match is not None
    name, count = match.group("name"), int(match.group("count"))
    # Given the assembled source without comments
    body = _code_only(lua.load(name))
    used = [int(n) for n in _KEY_INDEX.findall(body)]
    # Then the highest literal KEYS[n] is the count the file name promises
    assert used, f"{path.name} uses no literal KEYS[n]"
    assert max(used) == count
    assert key_count(name) == count


@pytest.mark.parametrize(
    "path", [p for p in SHIPPED if _COUNTED.fullmatch(p.name)], ids=lambda p: p.name)
def test_the_header_documents_the_keys_count_in_the_file_name(path: Path) -> None:
    match = _COUNTED.fullmatch(path.name)
    assert match is not None
    header = _BLOCK_COMMENT.search(path.read_text())
    assert header is not None, f"{path.name} has no header"
    documented = [int(n) for n in re.findall(r"KEYS\[(?:\d+\.\.)?(\d+)\]", header.group(0))]
    assert max(documented) == int(match.group("count"))


def test_a_script_without_a_count_in_its_name_has_a_variable_key_count() -> None:
    assert key_count("rankDevices") is None
    assert "#KEYS" in lua.load("rankDevices")
