"""`sieve lexicon ls|add|rm|import|export`: the sensitive-word lexicon, through the intake's LexiconService
(operators).

Files are the worker's lexicon format (worker_svc/text/lexicon_file.py: UTF-8, `#` comments, the header
`word<TAB>category<TAB>severity`, then one word a line) or JSON: `{"version": N, "words": [{"word": ..,
"category": .., "severity": ..}, ...]}` (what `export -o json` writes; a bare list of words reads too).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from sieve.cli import output
from sieve.cli.client import Client, CliError, ExitCode
from sieve.cli.config import Role
from sieve.cli.runner import Obj, output_option, run
from sieve.v1 import lexicon_pb2

FILE_FORMATS = ("tsv", "json")
HEADER = ("word", "category", "severity")
#: words per ListLexicon call when following every page
PAGE_SIZE = 1000


def parse_tsv(content: str, source: str) -> list[lexicon_pb2.LexiconWord]:
    """The words of a lexicon file; a malformed line is a CliError naming the file and the line."""
    words: list[lexicon_pb2.LexiconWord] = []
    header_seen = False
    for lineno, raw in enumerate(content.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = [field.strip() for field in raw.split("\t")]
        if not header_seen:
            if tuple(field.lower() for field in fields) != HEADER:
                raise _bad(source, lineno, f"expected the header 'word<TAB>category<TAB>severity', got {raw!r}")
            header_seen = True
            continue
        if len(fields) != 3:
            raise _bad(source, lineno, f"expected 3 tab-separated fields, got {len(fields)}")
        try:
            severity = int(fields[2])
        except ValueError:
            raise _bad(source, lineno, f"severity must be an integer, got {fields[2]!r}") from None
        words.append(lexicon_pb2.LexiconWord(word=fields[0], category=fields[1], severity=severity))
    return words


def parse_json(content: str, source: str) -> list[lexicon_pb2.LexiconWord]:
    try:
        data: Any = json.loads(content)
    except json.JSONDecodeError as exc:
        raise CliError(f"{source}: not JSON: {exc}", ExitCode.USAGE) from None
    items = data.get("words") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise CliError(f'{source}: expected {{"words": [...]}} or a list of words', ExitCode.USAGE)
    words = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("word"), str):
            raise CliError(f'{source}: words[{i}]: expected {{"word", "category", "severity"}}', ExitCode.USAGE)
        severity = item.get("severity")
        if not isinstance(severity, int) or isinstance(severity, bool):
            raise CliError(f"{source}: words[{i}].severity: expected an integer, got {severity!r}", ExitCode.USAGE)
        words.append(
            lexicon_pb2.LexiconWord(word=item["word"], category=str(item.get("category", "")), severity=severity)
        )
    return words


def _bad(source: str, lineno: int, message: str) -> CliError:
    return CliError(f"{source}, line {lineno}: {message}", ExitCode.USAGE)


def tsv_of(words: Iterable[lexicon_pb2.LexiconWord], version: int) -> str:
    lines = [f"# Sieve lexicon, version {version}", "\t".join(HEADER)]
    lines += [f"{w.word}\t{w.category}\t{w.severity}" for w in words]
    return "\n".join(lines) + "\n"


def json_of(words: Iterable[lexicon_pb2.LexiconWord], version: int) -> dict[str, Any]:
    return {
        "version": version,
        "words": [{"word": w.word, "category": w.category, "severity": w.severity} for w in words],
    }


def format_of(path: str, given: str | None) -> str:
    if given:
        return given
    return "json" if path.lower().endswith(".json") else "tsv"


def word_row(w: lexicon_pb2.LexiconWord) -> tuple[object, ...]:
    return (w.word, w.category, w.severity, output.when(w.updated_at)[:19])


@click.group("lexicon")
def lexicon_group() -> None:
    """The sensitive-word lexicon: its words, categories and severities (operators). Every change makes a new
    version, which every worker loads within seconds; each result names the version it was matched against."""


@lexicon_group.command("ls")
@click.option("--category", "-c", help="Only this category's words.")
@click.option("--prefix", "-p", help="Only words starting with this.")
@click.option("--limit", "-n", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--all", "everything", is_flag=True, help="Every matching word (page after page).")
@output_option
@click.pass_obj
def ls_command(
    obj: Obj, category: str | None, prefix: str | None, limit: int, everything: bool, output_format: str
) -> None:
    """List the words, by word."""

    async def body(client: Client) -> None:
        words: list[lexicon_pb2.LexiconWord] = []
        token = ""
        while True:
            reply = await client.call(
                "intake",
                client.lexicon().ListLexicon(
                    lexicon_pb2.ListLexiconRequest(
                        category=category or "",
                        word_prefix=prefix or "",
                        page_size=PAGE_SIZE if everything else limit,
                        page_token=token,
                    ),
                    **client.options(),
                ),
            )
            words += reply.words
            token = reply.next_page_token
            if not everything or not token:
                break
        if output_format == "json":
            output.print_json(
                {
                    "version": reply.version,
                    "total": reply.total,
                    "words": [output.to_dict(w) for w in words],
                    "next_page_token": token,
                }
            )
            return
        title = f"{len(words)} of {reply.total} words, lexicon version {reply.version}"
        output.console().print(output.table(title, ("word", "category", "severity", "updated"), map(word_row, words)))
        if token:
            output.err_console().print("more: --all, or --limit up to 1000")

    run(obj, Role.OPERATOR, body)


@lexicon_group.command("add")
@click.argument("words", nargs=-1, required=True)
@click.option("--category", "-c", required=True, help="Their category (a name: gambling, fraud, ...).")
@click.option("--severity", "-s", type=int, required=True, help="1 to 5, higher is worse (SIEVE_BLOCK_SEVERITY: 3).")
@output_option
@click.pass_obj
def add_command(obj: Obj, words: tuple[str, ...], category: str, severity: int, output_format: str) -> None:
    """Add words, or set the category and severity of words already there."""
    request = lexicon_pb2.AddWordsRequest(
        words=[lexicon_pb2.LexiconWord(word=w, category=category, severity=severity) for w in dict.fromkeys(words)]
    )

    async def body(client: Client) -> None:
        reply = await client.call("intake", client.lexicon().AddWords(request, **client.options()))
        if output_format == "json":
            output.print_json({"version": reply.version, "added": reply.added, "updated": reply.updated})
        else:
            output.console().print(f"added {reply.added}, updated {reply.updated}: lexicon version {reply.version}")

    run(obj, Role.OPERATOR, body)


@lexicon_group.command("rm")
@click.argument("words", nargs=-1, required=True)
@output_option
@click.pass_obj
def rm_command(obj: Obj, words: tuple[str, ...], output_format: str) -> None:
    """Remove words (those not there are named, not an error)."""
    request = lexicon_pb2.RemoveWordsRequest(words=list(words))

    async def body(client: Client) -> None:
        reply = await client.call("intake", client.lexicon().RemoveWords(request, **client.options()))
        if output_format == "json":
            output.print_json({"version": reply.version, "removed": reply.removed, "not_found": list(reply.not_found)})
            return
        output.console().print(f"removed {reply.removed}: lexicon version {reply.version}")
        if reply.not_found:
            output.err_console().print("not there: " + ", ".join(reply.not_found))

    run(obj, Role.OPERATOR, body)


@lexicon_group.command("import")
@click.argument("path", metavar="FILE")
@click.option("--format", "file_format", type=click.Choice(FILE_FORMATS), help="Default: by extension (.json), tsv.")
@click.option("--replace", is_flag=True, help="The file becomes the whole lexicon (default: merged into it).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (--replace).")
@output_option
@click.pass_obj
def import_command(obj: Obj, path: str, file_format: str | None, replace: bool, yes: bool, output_format: str) -> None:
    """Import a lexicon file (- for stdin), in one transaction: merged (upsert by word) or, with --replace,
    replacing every word."""
    source = "stdin" if path == "-" else path
    try:
        content = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.FileError(path, str(exc)) from None
    if replace and not yes:
        if path == "-":
            raise click.UsageError("--replace with stdin needs --yes")
        if not click.confirm("replace the whole lexicon with this file?", err=True):
            raise click.Abort
    mode = lexicon_pb2.IMPORT_MODE_REPLACE if replace else lexicon_pb2.IMPORT_MODE_MERGE

    async def body(client: Client) -> None:
        parse = parse_json if format_of(path, file_format) == "json" else parse_tsv
        words = parse(content, source)
        reply = await client.call(
            "intake",
            client.lexicon().ImportLexicon(
                lexicon_pb2.ImportLexiconRequest(words=words, mode=mode), **client.options()
            ),
        )
        counts = {"added": reply.added, "updated": reply.updated, "removed": reply.removed}
        if output_format == "json":
            output.print_json({"version": reply.version, "words": len(words), **counts})
        else:
            output.console().print(
                f"imported {len(words)} words (added {reply.added}, updated {reply.updated}, removed "
                f"{reply.removed}): lexicon version {reply.version}"
            )

    run(obj, Role.OPERATOR, body)


@lexicon_group.command("export")
@click.argument("path", metavar="[FILE]", required=False)
@click.option(
    "--output", "-o", "file_format", type=click.Choice(FILE_FORMATS), help="Default: by FILE's extension, else tsv."
)
@click.pass_obj
def export_command(obj: Obj, path: str | None, file_format: str | None) -> None:
    """Write every word, as a lexicon file (TSV) or JSON, to FILE or stdout; `import` reads it back."""
    chosen = format_of(path or "", file_format)

    async def body(client: Client) -> None:
        reply = await client.call(
            "intake", client.lexicon().ExportLexicon(lexicon_pb2.ExportLexiconRequest(), **client.options())
        )
        if chosen == "json":
            text = json.dumps(json_of(reply.words, reply.version), ensure_ascii=False, indent=2) + "\n"
        else:
            text = tsv_of(reply.words, reply.version)
        if path is None or path == "-":
            sys.stdout.write(text)
            return
        try:
            await asyncio.to_thread(Path(path).write_text, text, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"{path}: cannot write it: {exc.strerror}") from None
        output.err_console().print(f"{len(reply.words)} words, lexicon version {reply.version}, written to {path}")

    run(obj, Role.OPERATOR, body)


__all__ = ["json_of", "lexicon_group", "parse_json", "parse_tsv", "tsv_of"]
