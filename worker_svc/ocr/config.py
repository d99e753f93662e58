"""The OCR settings checked together, the writable cache folder, and the environment PaddlePaddle needs.

`check_settings` rejects OCR settings that cannot work (naming the variable), at worker start.
`prepare_environment` must run before the first `import paddle` / `import paddlex` / `import cv2`: it turns
off PaddleX's probing of model hosts (no network, ever), moves PaddleX's cache into the writable cache
folder, and caps OpenCV's own decode size at the pixel limit (a second guard behind the header check).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

from sieve.settings import Settings, SettingsError

ENGINES = ("rapidocr", "paddle")
DEVICES = ("auto", "cpu", "gpu")
RETENTIONS = ("keep", "delete")
FAULTS = ("", "gpu_oom_once", "oom_always", "hang_once", "hang")
#: most threads one CPU predictor gets by default (more did not help in the measurements)
MAX_DEFAULT_CPU_THREADS = 4


def check_settings(settings: Settings) -> None:
    """SettingsError naming the variable when the OCR settings cannot work."""
    if settings.ocr_engine not in ENGINES:
        raise SettingsError(f"SIEVE_OCR_ENGINE must be one of {', '.join(ENGINES)}")
    if settings.ocr_device not in DEVICES:
        raise SettingsError(f"SIEVE_OCR_DEVICE must be one of {', '.join(DEVICES)}")
    if settings.ocr_payload_retention not in RETENTIONS:
        raise SettingsError("SIEVE_OCR_PAYLOAD_RETENTION must be keep or delete")
    if settings.ocr_fault not in FAULTS:
        raise SettingsError(f"SIEVE_OCR_FAULT must be empty or one of {', '.join(FAULTS[1:])}")
    for name in ("ocr_cpu_threads", "ocr_decode_threads", "ocr_fetch_max_redirects"):
        if getattr(settings, name) < 0:
            raise SettingsError(f"SIEVE_{name.upper()} must not be negative")
    for name in ("ocr_max_image_pixels", "ocr_det_max_side_px"):
        if getattr(settings, name) < 1:
            raise SettingsError(f"SIEVE_{name.upper()} must be at least 1")
    if not 0.0 <= settings.ocr_min_line_confidence <= 1.0:
        raise SettingsError("SIEVE_OCR_MIN_LINE_CONFIDENCE must be between 0 and 1")
    if settings.ocr_fetch_timeout_s <= 0:
        raise SettingsError("SIEVE_OCR_FETCH_TIMEOUT_S must be positive")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cache_dir(settings: Settings) -> Path:
    """The writable folder for generated model configs and PaddleX's cache (created)."""
    candidates: list[Path] = []
    if settings.ocr_cache_dir:
        candidates.append(Path(settings.ocr_cache_dir))
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        candidates += [Path(base) / "sieve-ocr", Path(tempfile.gettempdir()) / f"sieve-ocr-{os.getuid()}"]
    problems: list[str] = []
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
            return path
        except OSError as exc:
            problems.append(f"{path}: {exc}")
    raise SettingsError("SIEVE_OCR_CACHE_DIR: no writable cache folder (" + "; ".join(problems) + ")")


def prepare_environment(settings: Settings, cache: Path) -> None:
    """Environment for PaddlePaddle, PaddleX and OpenCV; call before importing any of them.

    Refuses to go on in a process that loaded grpc_tools' protoc (`grpc_tools.protoc` and its C extension):
    importing paddle after it aborts the whole process (a pthread mutex assertion) nearly every time — a clear
    error beats exit code 134. (`import grpc` alone imports the empty `grpc_tools` package: that is fine.)
    """
    if "grpc_tools._protoc_compiler" in sys.modules and "paddle" not in sys.modules:
        raise RuntimeError(
            "grpc_tools.protoc is loaded in this process: importing paddle after it aborts the "
            "process; generate stubs at build time and never import grpc_tools in a service"
        )
    os.environ["PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK"] = "True"
    os.environ.setdefault("PADDLE_PDX_CACHE_HOME", str(cache / "paddlex"))
    # OpenCV refuses to allocate images over this many pixels (read when cv2 is first imported).
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(settings.ocr_max_image_pixels))
    # `import paddle` warns that ccache (a compiler cache for custom C++ ops) is missing: nothing is compiled here
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
