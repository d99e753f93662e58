"""What `sieve submit` sends: texts from arguments and files, images from files, directories and globs, their
idempotency keys, and batches bounded by count and bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sieve.cli.client import CliError, ExitCode
from sieve.cli.inputs import MAX_KEY, Item, batches, image_key, image_paths, images, text_key, texts


def test_texts_come_from_arguments_then_the_non_empty_lines_of_files(tmp_path: Path) -> None:
    lines = tmp_path / "t.txt"
    lines.write_text("first\n\n  \nsecond\n")
    items = list(texts(["an argument"], [str(lines)], "cli"))
    assert [(i.source, i.text) for i in items] == [
        ("an argument", "an argument"),
        (f"{lines}:1", "first"),
        (f"{lines}:4", "second"),
    ]
    # the key is the content's: the same text has the same key wherever it comes from
    assert items[0].key == text_key("cli", "an argument") and items[1].key != items[2].key
    assert next(iter(texts(["first"], [], "cli"))).key == items[1].key
    assert [i.key for i in texts(["x"], [], None)] == [""]
    with pytest.raises(CliError) as err:
        list(texts([], [str(tmp_path / "missing")], "cli"))
    assert err.value.code is ExitCode.USAGE


def test_images_come_from_files_directories_and_globs_once_each(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/a.png", "d/sub/b.JPG", "d/c.txt", "e.webp"):
        (tmp_path / name).write_bytes(name.encode())
    found = image_paths([str(tmp_path / "d"), str(tmp_path / "*.webp"), str(tmp_path / "d" / "a.png")])
    assert found == [tmp_path / "d" / "a.png", tmp_path / "d" / "sub" / "b.JPG", tmp_path / "e.webp"]
    assert image_paths([str(tmp_path / "**" / "*.png")]) == [tmp_path / "d" / "a.png"]
    with pytest.raises(CliError, match="no such file"):
        image_paths([str(tmp_path / "nothing-*.png")])
    [item] = images([tmp_path / "e.webp"], "cli")
    assert item.image == b"e.webp" and item.key == image_key("cli", (tmp_path / "e.webp").as_posix(), b"e.webp")


def test_an_image_key_names_the_file_and_its_content_within_the_intakes_limit() -> None:
    key = image_key("cli", "scans/page-1.png", b"one")
    assert key.startswith("cli:file:scans/page-1.png:") and len(key.rsplit(":", 1)[1]) == 16
    assert image_key("cli", "scans/page-1.png", b"two") != key  # a changed file is a new task
    long = image_key("cli", "x" * 500 + "/the-end.png", b"one")
    assert len(long) == MAX_KEY and "the-end.png" in long


def test_batches_hold_at_most_so_many_items_and_bytes() -> None:
    items = [Item(str(n), image=b"x" * 40) for n in range(5)]
    assert [len(b) for b in batches(items, 2, 1000)] == [2, 2, 1]
    assert [len(b) for b in batches(items, 10, 100)] == [2, 2, 1]
    assert [len(b) for b in batches([Item("big", image=b"x" * 500), *items[:1]], 10, 100)] == [1, 1]
    assert batches([], 3, 10) == []
