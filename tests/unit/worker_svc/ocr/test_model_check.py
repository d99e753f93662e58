"""The worker's model update check (`OcrRuntime.check_models`, the model-check job): model files changed on disk
since they were loaded fail it, saying a restart loads them; unchanged files pass."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sieve.settings import Settings

if TYPE_CHECKING:
    from worker_svc.ocr.models import ModelDirs
    from worker_svc.ocr.runtime import OcrRuntime

# the OCR runtime needs the ocr extra (aiohttp, yaml): imported in the tests, which run where it is installed
pytestmark = pytest.mark.ocr_extra


def model_dirs(root: Path) -> ModelDirs:
    from worker_svc.ocr.models import ModelDirs

    for name in ("det", "rec"):
        folder = root / name
        folder.mkdir()
        (folder / "inference.pdmodel").write_bytes(b"model " + name.encode())
        (folder / "inference.pdiparams").write_bytes(b"weights " + name.encode())
    return ModelDirs(root / "det", "det-model", root / "rec", "rec-model", "configured")


def loaded_runtime(dirs: ModelDirs) -> OcrRuntime:
    from worker_svc.ocr.models import fingerprint
    from worker_svc.ocr.runtime import OcrRuntime

    runtime = OcrRuntime(Settings.from_env({}, worker_task_types="OCR_IMAGE", ocr_device="cpu"))
    runtime.models = dirs
    runtime.models_fingerprint = fingerprint(dirs)
    return runtime


def test_unchanged_model_files_pass_the_check(tmp_path: Path) -> None:
    runtime = loaded_runtime(model_dirs(tmp_path))
    assert asyncio.run(runtime.check_models()).startswith(f"models unchanged ({runtime.models_fingerprint}")


@pytest.mark.parametrize("change", ["rewritten", "added"])
def test_model_files_changed_since_loading_fail_the_check_until_a_restart(tmp_path: Path, change: str) -> None:
    dirs = model_dirs(tmp_path)
    runtime = loaded_runtime(dirs)
    if change == "rewritten":  # an upgraded package: other weights under the same name
        weights = dirs.rec_dir / "inference.pdiparams"
        weights.write_bytes(b"newer weights, longer")
        os.utime(weights, ns=(1, 2))
    else:
        (dirs.det_dir / "inference.yml").write_text("Global: {model_name: det-model-v5}\n")
    with pytest.raises(RuntimeError, match=r"changed on disk since they were loaded .* restart the worker"):
        asyncio.run(runtime.check_models())
    # a worker started now (a restart) loads them, and its check passes
    assert asyncio.run(loaded_runtime(dirs).check_models()).startswith("models unchanged")
