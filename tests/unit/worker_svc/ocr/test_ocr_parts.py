"""Unit tests of the OCR worker's parts that need no engine: hits mapped to lines, what counts as a GPU
failure, the fault hook, modes and their concurrency, the OCR settings, model folders, image decoding."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sieve.settings import Settings, SettingsError
from worker_svc.ocr.config import check_settings
from worker_svc.ocr.faults import FaultHook, is_gpu_failure
from worker_svc.ocr.lines import join_lines
from worker_svc.ocr.mode import cpu_mode, default_concurrency, detect_mode, gpu_mode
from worker_svc.text import LexiconEntry, Matcher


def test_a_hit_is_mapped_to_its_line_and_the_offsets_in_that_line() -> None:
    joined = join_lines(["今天天气很好", "这里有 赌.博 网站", "casino"])
    assert joined.text == "今天天气很好\n这里有 赌.博 网站\ncasino"
    hits = Matcher([LexiconEntry("赌博", "gambling", 3), LexiconEntry("casino", "gambling", 2)]).match(joined.text).hits
    located = {h.word: joined.locate(h.start, h.end) for h in hits}
    assert located["赌博"] == {"line": 1, "line_start": 4, "line_end": 7, "spans": [{"line": 1, "start": 4, "end": 7}]}
    assert located["casino"]["line"] == 2 and located["casino"]["line_start"] == 0


def test_a_word_broken_over_two_lines_is_found_with_one_span_per_line() -> None:
    joined = join_lines(["请勿参与赌", "博活动"])
    (hit,) = Matcher([LexiconEntry("赌博", "gambling", 3)]).match(joined.text).hits
    where = joined.locate(hit.start, hit.end)
    assert where["spans"] == [{"line": 0, "start": 4, "end": 5}, {"line": 1, "start": 0, "end": 1}]


def test_cuda_out_of_memory_and_cuda_errors_are_gpu_failures_and_bad_input_is_not() -> None:
    assert is_gpu_failure(MemoryError("(ResourceExhausted) Out of memory error on GPU 0"))
    assert is_gpu_failure(RuntimeError("CUDA error(700), an illegal memory access was encountered"))
    assert is_gpu_failure(OSError("cudnn error: CUDNN_STATUS_INTERNAL_ERROR"))
    assert not is_gpu_failure(ValueError("bad image"))
    assert not is_gpu_failure(RuntimeError("shape mismatch"))


def test_the_fault_hook_raises_a_cuda_oom_once_in_gpu_mode_only() -> None:
    settings = Settings.from_env({})
    hook = FaultHook("gpu_oom_once")
    hook.before_inference(cpu_mode(settings))
    with pytest.raises(MemoryError, match="Out of memory error on GPU 0"):
        hook.before_inference(gpu_mode(settings))
    hook.before_inference(gpu_mode(settings))
    assert hook.fired == 1
    FaultHook("").before_inference(gpu_mode(settings))
    always = FaultHook("oom_always")
    for _ in range(2):
        with pytest.raises(MemoryError):
            always.before_inference(cpu_mode(settings))


def test_each_mode_has_its_engine_settings_and_the_fault_hook_simulates_gpu_mode() -> None:
    settings = Settings.from_env({}, ocr_cpu_threads=3, ocr_engine="paddle")
    cpu, gpu = cpu_mode(settings), gpu_mode(settings)
    assert (cpu.device, cpu.rec_batch_size, cpu.mkldnn, cpu.cpu_threads) == ("cpu", 2, True, 3)
    assert not cpu_mode(settings.replace(ocr_engine="rapidocr")).mkldnn  # oneDNN is PaddlePaddle's
    assert cpu.engine_config() == {"cpu_threads": 3, "enable_new_ir": False, "run_mode": "mkldnn"}
    assert (gpu.device, gpu.rec_batch_size, gpu.mkldnn) == ("gpu:0", 4, False)
    mode, why = detect_mode(settings.replace(ocr_fault="gpu_oom_once", test_hooks=True))
    assert mode.gpu and mode.simulated and mode.device == "cpu" and "simulated" in why
    assert mode.build_key() == cpu.build_key()
    assert detect_mode(settings.replace(ocr_device="cpu"))[0] == cpu


def test_an_ocr_worker_holds_a_few_tasks_per_core_on_cpu_and_more_on_gpu() -> None:
    settings = Settings.from_env({})
    assert default_concurrency(cpu_mode(settings), cores=2) == 8
    assert default_concurrency(cpu_mode(settings), cores=1) == 4
    assert default_concurrency(gpu_mode(settings), cores=2) == 16


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ocr_engine", "tesseract"),
        ("ocr_device", "tpu"),
        ("ocr_payload_retention", "forever"),
        ("ocr_fault", "boom"),
        ("ocr_max_image_pixels", 0),
        ("ocr_min_line_confidence", 1.5),
        ("ocr_fetch_timeout_s", 0.0),
        ("ocr_cpu_threads", -1),
    ],
)
def test_impossible_ocr_settings_are_refused_naming_the_variable(name: str, value: object) -> None:
    with pytest.raises(SettingsError, match=f"SIEVE_{name.upper()}"):
        check_settings(Settings.from_env({}, test_hooks=True, **{name: value}))


@pytest.mark.ocr_extra
def test_the_shipped_models_get_an_inference_yml_in_the_cache_folder(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    from worker_svc.ocr.models import prepare_models, shipped_root

    try:
        shipped_root()
    except SettingsError as exc:
        pytest.skip(str(exc))
    import yaml

    settings = Settings.from_env({}, ocr_det_max_side_px=1280, ocr_engine="paddle")
    models = prepare_models(settings, tmp_path)
    assert models.det_dir.parent == tmp_path / "models"
    det = yaml.safe_load((models.det_dir / "inference.yml").read_text())
    rec = yaml.safe_load((models.rec_dir / "inference.yml").read_text())
    assert det["Global"]["model_name"] == "PP-OCRv4_mobile_det"
    assert {"DetResizeForTest": {"resize_long": 1280, "limit_type": "max"}} in det["PreProcess"]["transform_ops"]
    assert rec["PostProcess"]["name"] == "CTCLabelDecode" and len(rec["PostProcess"]["character_dict"]) > 6000
    assert (models.rec_dir / "inference.pdiparams").resolve().is_file()
    assert prepare_models(settings, tmp_path) == models  # again: nothing to change


@pytest.mark.ocr_extra
def test_configured_model_folders_need_their_own_inference_yml(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    from worker_svc.ocr.models import prepare_models

    (tmp_path / "det").mkdir()
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "inference.yml").write_text("Global:\n  model_name: PP-OCRv5_server_rec\n")
    settings = Settings.from_env(
        {}, ocr_engine="paddle", ocr_det_model_dir=str(tmp_path / "det"), ocr_rec_model_dir=str(tmp_path / "rec")
    )
    with pytest.raises(SettingsError, match="SIEVE_OCR_DET_MODEL_DIR"):
        prepare_models(settings, tmp_path)
    (tmp_path / "det" / "inference.yml").write_text("Global:\n  model_name: PP-OCRv5_server_det\n")
    models = prepare_models(settings, tmp_path)
    assert (models.det_name, models.rec_name, models.source) == (
        "PP-OCRv5_server_det",
        "PP-OCRv5_server_rec",
        "configured",
    )


@pytest.mark.ocr_extra
def test_the_onnxruntime_engine_uses_the_onnx_files_of_the_rapidocr_wheel_or_configured_ones(tmp_path: Path) -> None:
    from worker_svc.ocr.models import RAPID_CLS, fingerprint, package_root, prepare_models

    root = package_root("rapidocr")
    if root is None:
        pytest.skip("the rapidocr wheel is not installed")
    models = prepare_models(Settings.from_env({}, ocr_engine="rapidocr"), tmp_path)
    assert (models.engine, models.det_name, models.rec_name) == ("rapidocr", "PP-OCRv6_small_det", "PP-OCRv6_small_rec")
    assert models.det_dir == root / "models" / "PP-OCRv6_det_small.onnx" and models.rec_dir.is_file()
    assert models.cls_path == root / "models" / RAPID_CLS
    assert set(models.describe()) == {"det", "rec", "source"} and fingerprint(models)
    # the paddle engine uses the same line classifier
    assert prepare_models(Settings.from_env({}, ocr_engine="paddle"), tmp_path).cls_path == models.cls_path
    (tmp_path / "det.onnx").write_bytes(b"onnx")
    configured = Settings.from_env(
        {}, ocr_engine="rapidocr", ocr_det_model_dir=str(tmp_path / "det.onnx"), ocr_rec_model_dir=str(tmp_path)
    )
    with pytest.raises(SettingsError, match=r"SIEVE_OCR_REC_MODEL_DIR: .* no \.onnx file"):
        prepare_models(configured, tmp_path)
    (tmp_path / "rec.onnx").write_bytes(b"onnx")
    models = prepare_models(configured.replace(ocr_rec_model_dir=str(tmp_path / "rec.onnx")), tmp_path)
    assert (models.det_name, models.rec_name, models.source) == ("det", "rec", "configured")


@pytest.mark.ocr_extra
def test_the_onnxruntime_engine_runs_on_the_cpu_with_its_threads_or_on_cuda_in_gpu_mode() -> None:
    pytest.importorskip("omegaconf")
    pytest.importorskip("rapidocr")
    from worker_svc.ocr.engine import rapid_config

    settings = Settings.from_env({}, ocr_cpu_threads=3, ocr_engine="rapidocr")
    cpu = rapid_config(cpu_mode(settings))
    for part in (cpu.Det, cpu.Rec, cpu.Cls):
        assert part.engine_cfg.intra_op_num_threads == 3 and not part.engine_cfg.use_cuda
        assert part.model_path is None and part.model_root_dir is None  # set by path by each user, never fetched
    gpu = rapid_config(gpu_mode(settings)).Rec.engine_cfg
    assert gpu.use_cuda and gpu.cuda_ep_cfg.device_id == 0 and gpu.cuda_ep_cfg.cudnn_conv_algo_search == "HEURISTIC"


@pytest.mark.ocr_extra
def test_decoding_gives_bgr_pixels_puts_transparency_on_white_and_refuses_corrupt_data() -> None:
    pytest.importorskip("cv2")
    image_module = pytest.importorskip("PIL.Image")
    from worker_svc.ocr.images import BadImage, decode_image

    out = io.BytesIO()
    image_module.new("RGBA", (64, 32), (255, 0, 0, 0)).save(out, format="PNG")
    decoded = decode_image(out.getvalue(), 10_000)
    assert decoded.pixels.shape == (32, 64, 3) and decoded.pixels.dtype.name == "uint8"
    assert decoded.pixels[0, 0].tolist() == [255, 255, 255]  # fully transparent red reads as white
    out = io.BytesIO()
    image_module.new("L", (64, 32), 0).save(out, format="PNG")
    assert decode_image(out.getvalue(), 10_000).pixels[0, 0].tolist() == [0, 0, 0]
    with pytest.raises(BadImage, match="more than the limit"):
        decode_image(out.getvalue(), 1000)
    with pytest.raises(BadImage, match="empty"):
        decode_image(b"", 1000)
    corrupt = bytearray(out.getvalue())
    start = corrupt.index(b"IDAT") + 4
    corrupt[start : start + 20] = b"\xff" * 20
    with pytest.raises(BadImage, match="could not be decoded"):
        decode_image(bytes(corrupt), 10_000)


def test_paddle_is_not_prepared_in_a_process_that_loaded_grpc_tools_protoc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys
    import types

    from worker_svc.ocr.config import prepare_environment

    monkeypatch.delitem(sys.modules, "paddle", raising=False)
    for name in ("PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK", "PADDLE_PDX_CACHE_HOME", "OPENCV_IO_MAX_IMAGE_PIXELS"):
        monkeypatch.delenv(name, raising=False)  # restored afterwards: the process keeps its own values
    prepare_environment(Settings.from_env({}), tmp_path)  # `import grpc` imports the bare grpc_tools package
    monkeypatch.setitem(sys.modules, "grpc_tools._protoc_compiler", types.ModuleType("grpc_tools._protoc_compiler"))
    with pytest.raises(RuntimeError, match="grpc_tools"):
        prepare_environment(Settings.from_env({}), tmp_path)
