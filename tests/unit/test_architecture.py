"""The code's shape, read from its syntax trees (nothing is imported): no import cycles, services that do not import
one another, and one way into Redis.

What counts as an import: every `import` and `from ... import` statement of a module, wherever it stands (at the
top, inside a function, under `if TYPE_CHECKING:`): a type-only dependency is still a dependency, and a cycle of
them is a cycle in the design. Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`, so it depends on
those packages too, unless the importing module is inside them. The project's modules are those of `sieve` and of
the four services; the generated stubs (`sieve/v1`) are among them.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("intake_svc", "scheduler_svc", "registry_svc", "worker_svc")
PACKAGES = ("sieve", *SERVICES)
#: the Redis layer: the key schema, the stores, the Lua scripts and the connection
REDIS_LAYER = "sieve.redis"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


@functools.cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return found


def _imported_names(module: Module) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of everything `module` imports: `import a.b` gives a.b; `from a import b` gives a.b
    (which may be a module or a name in a)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source, node.lineno
            for alias in node.names:
                yield f"{source}.{alias.name}", node.lineno


def _project_module(name: str) -> str | None:
    """The project module that importing `name` runs last (the longest known prefix), None for a third party."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _packages_above(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def dependencies() -> dict[str, dict[str, int]]:
    """module -> {project module it depends on: line of the first import that makes it so}."""
    graph: dict[str, dict[str, int]] = {}
    for module in modules().values():
        edges: dict[str, int] = {}
        own = {module.name, *_packages_above(module.name)}
        for name, line in _imported_names(module):
            target = _project_module(name)
            if target is None:
                continue
            for dependency in (target, *_packages_above(target)):
                if dependency not in own and dependency in modules():
                    edges.setdefault(dependency, line)
        graph[module.name] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(cycle: list[str]) -> str:
    graph = dependencies()
    members = set(cycle)
    lines = [
        f"  {m} -> {t} ({modules()[m].rel}:{line})"
        for m in cycle
        for t, line in sorted(graph[m].items())
        if t in members
    ]
    return "\n".join(lines)


def _top(name: str) -> str:
    return name.split(".", 1)[0]


# --- (a) no import cycles ---------------------------------------------------------------------------------
def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_project_has_no_import_cycle() -> None:
    cycles = _cycles(dependencies())
    assert not cycles, "import cycles:\n" + "\n\n".join(_describe(c) for c in cycles)


# --- (b) services and the shared package --------------------------------------------------------------------
def test_no_service_imports_another_service() -> None:
    crossing = [
        f"{modules()[m].rel}:{line}: {m} imports {t}"
        for m, edges in dependencies().items()
        for t, line in edges.items()
        if _top(m) in SERVICES and _top(t) in SERVICES and _top(t) != _top(m)
    ]
    assert not crossing, "\n".join(crossing)


def test_the_shared_package_imports_no_service() -> None:
    upward = [
        f"{modules()[m].rel}:{line}: {m} imports {t}"
        for m, edges in dependencies().items()
        for t, line in edges.items()
        if _top(m) == "sieve" and _top(t) in SERVICES
    ]
    assert not upward, "\n".join(upward)


# --- (c) one way into Redis ---------------------------------------------------------------------------------
# Only sieve/redis/** sends Redis commands and spells key names. Elsewhere a module may import from redis-py its
# exceptions (to tell a Redis outage from a bug) and the client class to annotate a parameter or field with it
# (the client is made by sieve.redis.connection and handed around); nothing else, and it calls no Redis command.
#: modules outside sieve/redis allowed more, and why
#: (none now: the readiness probe takes its client, ping and eviction check from sieve.redis.connection)
REDIS_ALLOWED: dict[str, str] = {}
#: redis-py modules any module may import (their names are exception classes)
REDIS_IMPORTS_ANYWHERE = ("redis.exceptions",)
#: method names of redis-py's client that other libraries' objects use as well (asyncio, asyncpg, pathlib,
#: logging, ...): not taken as a sign of a Redis command
GENERIC_METHOD_NAMES = frozenset(
    {
        "aclose",
        "append",
        "auth",
        "client",
        "close",
        "cluster",
        "command",
        "connect",
        "copy",
        "digest",
        "discard",
        "dump",
        "echo",
        "execute",
        "exists",
        "failover",
        "get",
        "hello",
        "info",
        "initialize",
        "json",
        "keys",
        "listen",
        "lock",
        "migrate",
        "monitor",
        "move",
        "object",
        "quit",
        "readonly",
        "readwrite",
        "rename",
        "reset",
        "restore",
        "role",
        "run",
        "save",
        "select",
        "set",
        "shutdown",
        "sort",
        "sync",
        "time",
        "touch",
        "transaction",
        "type",
        "unlink",
        "wait",
        "watch",
    }
)


@functools.cache
def redis_commands() -> frozenset[str]:
    """The method names of redis-py's async client, its pipeline and its pub/sub that are Redis commands (or
    build one), less the generic names."""
    from redis.asyncio import Redis
    from redis.asyncio.client import Pipeline, PubSub

    names = {n for cls in (Redis, Pipeline, PubSub) for n in dir(cls) if not n.startswith("_")}
    return frozenset(names - GENERIC_METHOD_NAMES)


def _outside_redis_layer() -> list[Module]:
    return [
        m
        for m in modules().values()
        if m.name != REDIS_LAYER and not m.name.startswith(REDIS_LAYER + ".") and not m.name.startswith("sieve.v1")
    ]


def _annotation_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside an annotation (parameters, returns, annotated assignments)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            params = [
                *a.posonlyargs,
                *a.args,
                *a.kwonlyargs,
                *([a.vararg] if a.vararg else []),
                *([a.kwarg] if a.kwarg else []),
            ]
            roots += [p.annotation for p in params if p.annotation is not None]
            if node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _redis_uses(module: Module) -> list[str]:
    """What `module` does with redis-py beyond its exceptions and annotating with its client class."""
    found: list[str] = []
    bound: dict[str, int] = {}  # names the module binds to something of redis-py
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _top(alias.name) == "redis" and not alias.name.startswith(REDIS_IMPORTS_ANYWHERE):
                    bound[alias.asname or "redis"] = node.lineno
        elif isinstance(node, ast.ImportFrom) and not node.level and _top(node.module or "") == "redis":
            if (node.module or "").startswith(REDIS_IMPORTS_ANYWHERE):
                continue
            for alias in node.names:
                if (node.module, alias.name) == ("redis.asyncio", "Redis"):
                    bound[alias.asname or alias.name] = node.lineno
                else:
                    found.append(f"line {node.lineno}: imports {alias.name} from {node.module}")
    in_annotations = _annotation_nodes(module.tree)
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Name) and node.id in bound and id(node) not in in_annotations:
            found.append(f"line {node.lineno}: uses {node.id} (imported line {bound[node.id]}) outside an annotation")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in redis_commands():
            found.append(f"line {node.lineno}: calls .{node.func.attr}(), a method of redis-py's client")
    return found


def _key_literals(module: Module) -> list[str]:
    """String pieces that close a Redis hash tag, `}:...` (as in "{" + prefix + "}:generation" or
    f"{{{prefix}}}:queue"): a key name spelled outside the key schema (sieve.redis.keys)."""
    return [
        f"line {node.lineno}: {node.value[:40]!r}"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("}:")
    ]


def test_the_redis_command_list_knows_redis_commands_and_leaves_out_generic_names() -> None:
    assert {"hset", "zrangebyscore", "evalsha", "pipeline", "publish", "ping", "scan_iter"} <= redis_commands()
    assert not {"get", "set", "run", "close", "execute", "wait"} & redis_commands()


def test_the_redis_rule_catches_commands_clients_and_key_names() -> None:
    source = """
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

async def f(redis: Redis, prefix: str) -> None:
    await redis.hset("{" + prefix + "}:generation", "a", 1)
    Redis.from_url("redis://")
"""
    module = Module("example", ROOT / "example.py", ast.parse(source))
    assert sorted(u.split(":")[0] for u in _redis_uses(module)) == ["line 6", "line 7", "line 7"]
    assert _key_literals(module) == ["line 6: '}:generation'"]


def test_only_the_redis_layer_sends_commands_to_redis() -> None:
    problems = [
        f"{m.rel}: {use}" for m in _outside_redis_layer() if m.name not in REDIS_ALLOWED for use in _redis_uses(m)
    ]
    assert not problems, "\n".join(problems)


def test_only_the_redis_layer_spells_key_names() -> None:
    problems = [f"{m.rel}: {key}" for m in _outside_redis_layer() for key in _key_literals(m)]
    assert not problems, "\n".join(problems)


def test_every_module_allowed_more_of_redis_exists_and_uses_it() -> None:
    for name in REDIS_ALLOWED:
        assert name in modules(), f"REDIS_ALLOWED names {name}, which is not a module any more"
        assert _redis_uses(modules()[name]), f"{name} no longer needs its place in REDIS_ALLOWED"
