"""The OCR engine's health probe, an OCR worker's `ocr-health` job: the loaded engine must read a small built-in
image of known text.

The image is drawn when first needed, with OpenCV's own Hershey font (no font file, nothing downloaded or stored):
PROBE_TEXT in black on white, about 210 x 56 pixels, which either engine reads in some 0.2 s on a CPU.
The probe goes through `OcrRuntime.recognise` like a task: it waits for its turn on the engine's one thread (never
on the event loop), meets the test fault hook (SIEVE_OCR_FAULT) and, after a GPU failure, the switch to CPU mode
like one. It fails (the job counts an error; ListJobs shows why; the log says it) when the engine raises, is held
by an abandoned inference (`EngineBusy`), or reads anything but the text (letters and digits compared without
spaces or case); the job runner's time limit fails a probe that does not get through in time. It reports, it
decides nothing: the worker keeps its registration and its tasks keep their own handling.
"""

from __future__ import annotations

import functools
from typing import Any

from worker_svc.ocr.runtime import OcrRuntime

#: what the probe image says
PROBE_TEXT = "SIEVE 2718"


class ProbeFailed(Exception):
    """The engine read something other than the probe's text."""


def _normal(text: str) -> str:
    return "".join(ch for ch in text.upper() if ch.isalnum())


@functools.cache
def probe_image() -> Any:
    """PROBE_TEXT drawn black on white (a BGR uint8 array, as OpenCV decodes an image); made once."""
    import cv2
    import numpy as np

    font, scale, thickness, margin = cv2.FONT_HERSHEY_SIMPLEX, 1.0, 2, 12
    (width, height), baseline = cv2.getTextSize(PROBE_TEXT, font, scale, thickness)
    image = np.full((height + baseline + 2 * margin, width + 2 * margin, 3), 255, dtype=np.uint8)
    cv2.putText(image, PROBE_TEXT, (margin, margin + height), font, scale, (0, 0, 0), thickness, cv2.LINE_AA)
    image.setflags(write=False)  # shared by every probe
    return image


async def probe(runtime: OcrRuntime) -> str:
    """Reads the probe image with the runtime's engine; what it read, in which mode and how fast. ProbeFailed when
    the text is not the probe's; the engine's own error (or EngineBusy) when it fails."""
    if not runtime.started:
        raise RuntimeError("the OCR engine is not loaded")
    inference = await runtime.recognise(probe_image())
    read = " ".join(line.text for line in inference.result.lines)
    if _normal(read) != _normal(PROBE_TEXT):
        raise ProbeFailed(f"read {read!r} instead of {PROBE_TEXT!r} in {inference.mode.name} mode")
    took_ms = inference.result.detect_ms + inference.result.recognise_ms
    return f"read {PROBE_TEXT!r} in {inference.mode.name} mode in {took_ms:.0f} ms (waited {inference.wait_ms:.0f} ms)"


__all__ = ["PROBE_TEXT", "ProbeFailed", "probe", "probe_image"]
