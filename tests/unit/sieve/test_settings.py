"""Unit tests of Sieve's settings (sieve.settings): SIEVE_* environment parsing, the documented defaults,
validation that names the variable at fault, per-device weights and API keys."""

from __future__ import annotations

import pytest

from sieve.settings import Settings, SettingsError, settings_field_names


def test_defaults_are_the_seeds() -> None:
    # Given no SIEVE_* variable at all
    s = Settings.from_env({})
    # Then every scheduling default is the documented one (README "Configuration"): deployments rely on them
    assert s.max_total_pending == 5000
    assert s.max_per_device_pending == 200
    assert s.aging_max_wait_s == 600
    assert s.starvation_hint_s == 30
    assert s.batch_size == 10
    assert s.min_batch_size == 1
    assert s.lock_ttl_s == 900
    assert s.task_ttl_s == 3600
    assert s.defer_backoff_base_s == 30
    assert s.defer_backoff_max_s == 600
    assert s.max_attempts == 6
    assert s.dead_letter_keep == 10000
    assert s.heartbeat_interval_s == 15
    assert s.worker_ttl_s == 60
    assert s.cpu_watermark_pct == 75
    assert s.memory_watermark_pct == 75
    assert s.gpu_memory_watermark_pct == 75
    assert s.watermark_interval_s == 15
    assert s.watermark_ttl_s == 20
    assert s.retry_after_s == 30
    assert s.default_weight == 1
    assert s.device_weights == ""


def test_integer_and_float_variables_are_parsed_by_their_field_type() -> None:
    s = Settings.from_env(
        {
            "SIEVE_MAX_TOTAL_PENDING": "7",
            "SIEVE_MAX_PER_DEVICE_PENDING": "3",
            "SIEVE_BATCH_SIZE": "4",
            "SIEVE_AGING_MAX_WAIT_S": "1.5",
            "SIEVE_STARVATION_HINT_S": "2",
            "SIEVE_REDIS_PREFIX": "other",
        }
    )
    assert s.max_total_pending == 7
    assert isinstance(s.max_total_pending, int)
    assert s.max_per_device_pending == 3
    assert s.batch_size == 4
    assert s.aging_max_wait_s == 1.5
    assert s.starvation_hint_s == 2.0
    assert isinstance(s.starvation_hint_s, float)
    assert s.redis_prefix == "other"


def test_variables_that_are_not_settings_are_ignored() -> None:
    s = Settings.from_env({"SIEVE_NO_SUCH_THING": "1", "MAX_TOTAL_PENDING": "9", "PATH": "/bin"})
    assert s.max_total_pending == 5000


def test_overrides_win_over_the_environment() -> None:
    s = Settings.from_env({"SIEVE_MAX_TOTAL_PENDING": "7"}, max_total_pending=9)
    assert s.max_total_pending == 9


def test_from_env_without_a_mapping_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIEVE_MAX_ATTEMPTS", "11")
    assert Settings.from_env().max_attempts == 11


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("SIEVE_MAX_TOTAL_PENDING", "seven"),
        ("SIEVE_MAX_PER_DEVICE_PENDING", "1.5"),
        ("SIEVE_BATCH_SIZE", ""),
        ("SIEVE_AGING_MAX_WAIT_S", "ten minutes"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable(name: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: raw})


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"SIEVE_MAX_TOTAL_PENDING": "0"}, "SIEVE_MAX_TOTAL_PENDING"),
        ({"SIEVE_MAX_PER_DEVICE_PENDING": "-1"}, "SIEVE_MAX_PER_DEVICE_PENDING"),
        ({"SIEVE_BATCH_SIZE": "0", "SIEVE_MIN_BATCH_SIZE": "0"}, "SIEVE_BATCH_SIZE"),
        ({"SIEVE_MAX_ATTEMPTS": "0"}, "SIEVE_MAX_ATTEMPTS"),
        ({"SIEVE_DEAD_LETTER_KEEP": "0"}, "SIEVE_DEAD_LETTER_KEEP"),
        ({"SIEVE_DEFAULT_WEIGHT": "0"}, "SIEVE_DEFAULT_WEIGHT"),
        ({"SIEVE_MIN_BATCH_SIZE": "11"}, "SIEVE_MIN_BATCH_SIZE"),
        ({"SIEVE_NO_GPU_STRATEGY": "pray"}, "SIEVE_NO_GPU_STRATEGY"),
        ({"SIEVE_BLOCK_SEVERITY": "6"}, "SIEVE_BLOCK_SEVERITY"),
        ({"SIEVE_REVIEW_SEVERITY": "0"}, "SIEVE_REVIEW_SEVERITY"),
        ({"SIEVE_BLOCK_SEVERITY": "2", "SIEVE_REVIEW_SEVERITY": "3"}, "SIEVE_REVIEW_SEVERITY"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env(env)


def test_device_weights_are_keyed_by_normalised_mac() -> None:
    # Given weights written in three MAC spellings, with spaces and an empty item
    s = Settings.from_env({"SIEVE_DEVICE_WEIGHTS": "aa-bb-cc-dd-ee-01=3, AABBCCDDEE02=100,,aabb.ccdd.ee03=1"})
    # Then each is keyed by its canonical form
    assert s.weights_by_device == {"AA:BB:CC:DD:EE:01": 3, "AA:BB:CC:DD:EE:02": 100, "AA:BB:CC:DD:EE:03": 1}
    assert s.weight_of("AA:BB:CC:DD:EE:01") == 3
    assert s.weight_of("AA:BB:CC:DD:EE:99") == s.default_weight == 1
    assert s.all_weights == (1, 3, 100)


def test_without_device_weights_only_the_default_weight_is_in_use() -> None:
    s = Settings.from_env({"SIEVE_DEFAULT_WEIGHT": "2"})
    assert s.weights_by_device == {}
    assert s.all_weights == (2,)
    assert s.weight_of("AA:BB:CC:DD:EE:FF") == 2


@pytest.mark.parametrize(
    "weights",
    [
        "AA:BB:CC:DD:EE:01=0",
        "AA:BB:CC:DD:EE:01=101",
        "AA:BB:CC:DD:EE:01=-3",
        "AA:BB:CC:DD:EE:01=three",
        "AA:BB:CC:DD:EE:01",
        "not-a-mac=3",
        "=3",
        "AA:BB:CC:DD:EE:01=2,AA:BB:CC:DD:EE=2",
    ],
)
def test_a_bad_device_weight_is_refused_naming_the_variable(weights: str) -> None:
    with pytest.raises(SettingsError, match="SIEVE_DEVICE_WEIGHTS"):
        Settings.from_env({"SIEVE_DEVICE_WEIGHTS": weights})


def test_no_credentials_by_default_and_anonymous_callers_refused() -> None:
    s = Settings.from_env({})
    assert (s.auth_tokens, s.auth_tokens_file, s.allow_anonymous, s.grpc_reflection) == ("", "", False, False)


@pytest.mark.parametrize(
    "tokens",
    [
        "alice",
        "alice:client",
        "alice:admin:" + "0" * 64,
        "alice:client:abc",
        ":client:" + "0" * 64,
        "a/b:worker:" + "0" * 64,
    ],
)
def test_a_bad_credential_entry_is_refused_naming_the_variable(tokens: str) -> None:
    with pytest.raises(SettingsError, match="SIEVE_AUTH_TOKENS"):
        Settings.from_env({"SIEVE_AUTH_TOKENS": tokens})


def test_tls_certificate_and_key_go_together() -> None:
    with pytest.raises(SettingsError, match="SIEVE_TLS_CERT_FILE"):
        Settings.from_env({"SIEVE_TLS_CERT_FILE": "/x.pem"})
    with pytest.raises(SettingsError, match="SIEVE_TLS_CLIENT_AUTH"):
        Settings.from_env({"SIEVE_TLS_CLIENT_AUTH": "true"})


def test_every_field_has_a_sieve_variable() -> None:
    names = settings_field_names()
    assert "SIEVE_MAX_TOTAL_PENDING" in names
    assert "SIEVE_DEVICE_WEIGHTS" in names
    assert all(n.startswith("SIEVE_") and n == n.upper() for n in names)
    assert len(names) == len(set(names))


def test_replace_returns_a_changed_copy() -> None:
    s = Settings.from_env({})
    t = s.replace(batch_size=3)
    assert (s.batch_size, t.batch_size) == (10, 3)


def test_the_readme_documents_every_setting_as_the_settings_define_it() -> None:
    from pathlib import Path

    from sieve.settings_doc import BEGIN, END, markdown_table

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)].strip()
    assert block == markdown_table(), "README settings table is stale: paste `python -m sieve.settings_doc` into it"
    assert all(f"`{name}`" in block for name in settings_field_names())
