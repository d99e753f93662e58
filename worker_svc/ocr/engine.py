"""The loaded OCR engine: PaddleOCR 3's text detection and recognition predictors (PaddleX), run on one thread.

`OcrEngine.recognise` takes a BGR image (as OpenCV decodes it) and returns its text lines — text,
confidence, box — with the time spent detecting and recognising. It is the PaddleOCR pipeline without
document preprocessing or line orientation: DB detection (long side limited to
`SIEVE_OCR_DET_MAX_SIDE_PX`, never scaled up), boxes sorted top to bottom and left to right, each box cropped upright,
crops recognised in batches of the mode's size (sorted by aspect ratio, as PaddleOCR does, for speed).

Predictors are not thread-safe, and loading one costs seconds: `load_engine` builds an engine once per
process and build (models + device + batch + threads) and gives it its own single-thread executor, which
every user of that engine must run it on (`LoadedEngine.executor`). Importing this module imports
neither PaddlePaddle nor OpenCV; `load_engine` does, after `config.prepare_environment`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sieve.settings import Settings
from worker_svc.ocr.mode import EngineMode
from worker_svc.ocr.models import ModelDirs

log = logging.getLogger("sieve.worker.ocr")


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One recognised text line: its text, the recogniser's confidence (0..1), and its box (4 x/y points,
    clockwise from the top left, in pixels of the decoded image)."""

    text: str
    confidence: float
    box: tuple[tuple[int, int], ...]

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "confidence": round(self.confidence, 4), "box": [list(p) for p in self.box]}


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the settings change in an engine: the detector's longest side, the line confidence threshold."""

    det_max_side_px: int = 960
    min_confidence: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        return cls(settings.ocr_det_max_side_px, settings.ocr_min_line_confidence)


@dataclass(frozen=True, slots=True)
class Recognised:
    """What one image gave: its lines in reading order, and where the time went."""

    lines: tuple[OcrLine, ...]
    detect_ms: float
    recognise_ms: float
    #: boxes the detector found (some may be dropped under the confidence threshold)
    boxes_found: int = 0


class OcrEngine:
    """Detection + recognition predictors of one build; call only from its LoadedEngine's thread."""

    def __init__(self, models: ModelDirs, mode: EngineMode, options: EngineOptions) -> None:
        from paddlex import create_predictor
        from paddlex.inference.pipelines.components import CropByPolys, SortQuadBoxes

        self.models = models
        self.mode = mode
        self.min_confidence = options.min_confidence

        def predictor(name: str, folder: Path, batch_size: int, **extra: Any) -> Any:
            new_ir = not (folder / "inference.pdmodel").is_file()  # a PIR model (inference.json)
            return create_predictor(
                name,
                model_dir=str(folder),
                batch_size=batch_size,
                device=mode.device,
                engine="paddle_static",
                engine_config=mode.engine_config(new_ir),
                **extra,
            )

        # the detector sees the image scaled down to its longest side (never up: small images stay fast)
        self._det = predictor(
            models.det_name, models.det_dir, 1, limit_side_len=options.det_max_side_px, limit_type="max"
        )
        self._rec = predictor(models.rec_name, models.rec_dir, mode.rec_batch_size)
        self._crop = CropByPolys(det_box_type="quad")
        self._sort = SortQuadBoxes()

    def recognise(self, image: Any) -> Recognised:
        """Text lines of a BGR uint8 image (H x W x 3 numpy array)."""
        began = time.perf_counter()
        det = next(iter(self._det.predict(image)))
        polys = list(det["dt_polys"])
        polys = list(self._sort(polys)) if polys else []
        detected = time.perf_counter()
        if not polys:
            return Recognised((), (detected - began) * 1000, 0.0, 0)
        crops: list[Any] = []
        kept: list[Any] = []
        for crop, poly in zip(self._crop(image, polys), polys, strict=True):
            if crop.size > 0 and crop.shape[0] > 0 and crop.shape[1] > 0:
                crops.append(crop)
                kept.append(poly)
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / float(crops[i].shape[0]))
        texts: dict[int, tuple[str, float]] = {}
        for index, result in zip(order, self._rec.predict([crops[i] for i in order]), strict=True):
            texts[index] = (str(result["rec_text"]), float(result["rec_score"]))
        lines = []
        for i, poly in enumerate(kept):
            text, score = texts[i]
            if text and score >= self.min_confidence:
                lines.append(OcrLine(text, score, tuple((int(x), int(y)) for x, y in poly)))
        done = time.perf_counter()
        return Recognised(tuple(lines), (detected - began) * 1000, (done - detected) * 1000, len(polys))

    def warm_up(self) -> None:
        """Runs both predictors once: the first inference builds their kernels (several times slower)."""
        import numpy as np

        image = np.full((96, 320, 3), 255, dtype=np.uint8)
        image[36:60, 40:280] = 0
        self.recognise(image)
        list(self._rec.predict([image[24:72, :]]))

    def close(self) -> None:
        for predictor in (self._det, self._rec):
            try:
                predictor.close()
            except Exception:
                log.debug("closing a predictor failed", exc_info=True)


@dataclass
class LoadedEngine:
    """A built engine and the one thread it runs on."""

    engine: OcrEngine
    executor: ThreadPoolExecutor
    load_s: float
    key: tuple[Any, ...] = field(default=())


_LOCK = threading.Lock()
_ENGINES: dict[tuple[Any, ...], LoadedEngine] = {}


def load_engine(models: ModelDirs, mode: EngineMode, options: EngineOptions) -> LoadedEngine:
    """The engine of this build, built (and warmed up) on first use; blocking, call it from a thread."""
    key = (models, mode.build_key(), options)
    with _LOCK:
        loaded = _ENGINES.get(key)
        if loaded is not None:
            return loaded
        began = time.perf_counter()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sieve-ocr-{mode.device}")
        try:
            engine = executor.submit(_build, models, mode, options).result()
        except BaseException:
            executor.shutdown(wait=False)
            raise
        loaded = LoadedEngine(engine, executor, time.perf_counter() - began, key)
        _ENGINES[key] = loaded
        log.info("OCR engine loaded in %.1fs: %s on %s", loaded.load_s, models.describe(), mode.describe())
        return loaded


def release_engine(loaded: LoadedEngine) -> None:
    """Forgets and closes an engine (after a GPU failure: frees what it holds on the device)."""
    with _LOCK:
        if _ENGINES.get(loaded.key) is loaded:
            del _ENGINES[loaded.key]
    loaded.executor.submit(loaded.engine.close)
    loaded.executor.shutdown(wait=False)


def loaded_engines() -> Sequence[LoadedEngine]:
    with _LOCK:
        return list(_ENGINES.values())


def _build(models: ModelDirs, mode: EngineMode, options: EngineOptions) -> OcrEngine:
    engine = OcrEngine(models, mode, options)
    engine.warm_up()
    return engine
