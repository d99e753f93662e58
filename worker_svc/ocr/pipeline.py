"""One OCR_IMAGE task, from its payload to the `Outcome` the worker stores.

`run_ocr`: payload bytes (or the image fetched from `image_url`) -> header checks and decode on the decode
pool -> detection and recognition on the engine thread (GPU -> CPU fallback inside `OcrRuntime`) -> the
lines joined and matched against the lexicon with the worker's `Matcher` -> hits mapped back to their
lines -> verdict. Nothing blocking runs on the event loop; many tasks of a batch run at once, so one is
decoded while another is recognised.

Stored with the result: the joined text; hits with their offsets in it plus `line`, `line_start`,
`line_end`, `spans`; in `details`: the lines (text, confidence, box; `orientation` for a line that did not lie
upright), the engine and whether orientation ran, image format and size, the mode and
models, a mode switch if this task caused or met one, and `timings_ms` (fetch, decode, queue — waiting
for the engine —, detect, recognise, match, total).

A payload that is not a usable image, or a URL that gives none for good (HTTP 4xx but 408 / 429, a refused
destination, too large), FAILS the task with a clear error. A failure that may pass — a fetch that timed out or
could not connect, HTTP 5xx / 408 / 429, an engine error (after the one retry in CPU mode for a GPU failure) —
comes back as a `Retry` (nacked, counted: the scheduler tries again with backoff); so does an engine held by an
abandoned inference (`EngineBusy`, uncounted).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any

from sieve.db.tasks import Outcome, Started
from worker_svc.detection import ENGINE_BUSY, Retry, failed
from worker_svc.ocr.fetch import FetchError
from worker_svc.ocr.images import BadImage
from worker_svc.ocr.lines import join_lines
from worker_svc.ocr.runtime import EngineBusy, OcrRuntime, Progress
from worker_svc.text import Matcher

log = logging.getLogger("sieve.worker.ocr")


def _ms(value: float) -> float:
    return round(value, 3)


#: a task handed back because the engine is held by abandoned work may run again after this long
ENGINE_BUSY_RETRY_S = 5.0


async def run_ocr(
    task: Started, runtime: OcrRuntime, matcher: Matcher, worker_id: str, progress: Progress | None = None
) -> Outcome | Retry:
    """OCR one task and match its text: its Outcome (FAILED for a payload that is no usable image), or a Retry
    for a failure that may pass; never raises for a bad payload or an engine error."""
    began = time.perf_counter()
    timings: dict[str, float] = {}
    progress = progress if progress is not None else Progress()
    task_id = str(task.task_id)
    try:
        if task.image:
            data, source = task.image, "bytes"
        elif task.image_url:
            progress.stage = "fetch"
            data, fetch_ms = await runtime.fetch(task.image_url)
            timings["fetch"] = _ms(fetch_ms)
            source = "url"
        else:
            return failed(task, worker_id, "OCR_IMAGE task has neither image bytes nor an image_url")
        progress.stage = "decode"
        decoded = await runtime.decode(data)
        timings["decode"] = _ms(decoded.decode_ms)
        inference = await runtime.recognise(decoded.pixels, progress)
    except BadImage as exc:
        return failed(task, worker_id, str(exc))
    except FetchError as exc:
        if exc.transient:
            return Retry(task_id, str(exc))
        return failed(task, worker_id, str(exc))
    except EngineBusy as exc:
        return Retry(task_id, str(exc), ENGINE_BUSY, counted=False, retry_after_s=ENGINE_BUSY_RETRY_S)
    except Exception as exc:
        log.exception("OCR of task %s failed", task.task_id)
        switched = f" (after switching to {runtime.mode.name} mode)" if runtime.switches else ""
        return Retry(task_id, f"OCR failed{switched}: {type(exc).__name__}: {exc}"[:500])
    progress.stage = "match"

    recognised = inference.result
    timings["queue"] = _ms(inference.wait_ms)
    timings["detect"] = _ms(recognised.detect_ms)
    timings["recognise"] = _ms(recognised.recognise_ms)

    matched_at = time.perf_counter()
    joined = join_lines([line.text for line in recognised.lines])
    result = matcher.match(joined.text, ocr=True)
    hits = [{**asdict(hit), **joined.locate(hit.start, hit.end)} for hit in result.hits]
    timings["match"] = _ms((time.perf_counter() - matched_at) * 1000)
    timings["total"] = _ms((time.perf_counter() - began) * 1000)

    ocr: dict[str, Any] = {
        "engine": runtime.engine_name,
        "orientation": runtime.options.orient,
        **inference.mode.describe(),
        "models": runtime.models.describe() if runtime.models else {},
        "source": source,
        "image": decoded.describe(),
        "boxes_found": recognised.boxes_found,
        "lines": [line.as_json() for line in recognised.lines],
    }
    if inference.switch is not None:
        ocr["mode_switch"] = inference.switch.as_json()
    details = {"ocr": ocr, "timings_ms": timings, "lexicon_version": matcher.version}
    return Outcome(
        task_id=task.task_id,
        attempt=task.attempt,
        worker_id=worker_id,
        verdict=result.verdict.name,
        hits_json=json.dumps(hits, ensure_ascii=False),
        text=joined.text,
        details_json=json.dumps(details, ensure_ascii=False),
        unmarked=task.unmarked,
    )
