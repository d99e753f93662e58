"""SIEVE_EXTERNAL_PROVIDERS: parsed into typed providers and stages, every bad value a start-up error naming it."""

from __future__ import annotations

import json

import pytest

from intake_svc.validation import external_payload, validate_spec
from sieve.errors import InvalidInput, SettingsError
from sieve.external_config import DEFAULT_STAGE, ExternalConfig, ExternalConfigError
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2

VMOD = {"base_url": "http://127.0.0.1:8080/v1/", "max_slots": 5, "poll_interval_s": 0.5, "timeout_s": 60}


def test_a_provider_gets_its_settings_and_one_default_stage_under_a_pool_of_its_own_name() -> None:
    config = ExternalConfig.parse(json.dumps({"vmod": VMOD}))
    vmod = config.providers["vmod"]
    assert vmod.base_url == "http://127.0.0.1:8080/v1"  # no trailing slash: paths are appended
    assert (vmod.max_slots, vmod.poll_interval_s, vmod.timeout_s, vmod.cost_per_job) == (5, 0.5, 60.0, 0.0)
    assert (vmod.handler, vmod.kind) == ("http-async", "moderation")
    assert [(s.name, s.pool, s.max_slots) for s in vmod.stages] == [(DEFAULT_STAGE, "vmod", 5)]
    assert config.pools == config.first_pools == {"vmod": 5}
    assert config.hosts == ["127.0.0.1"] and config.max_timeout_s == 120.0  # the stage's deadline, then the finish


def test_stages_run_under_pools_of_their_own() -> None:
    # Given the design's two-stage job: a voice stage (2 slots) then an element stage (3 slots)
    raw = {"avatar": {**VMOD, "stages": [{"name": "voice", "pool": "voice", "max_slots": 2}, "element"]}}
    raw["avatar"]["stages"][1] = {"name": "element", "pool": "element", "max_slots": 3}
    config = ExternalConfig.parse(json.dumps(raw))
    assert [(s.name, s.pool, s.max_slots) for s in config.providers["avatar"].stages] == [
        ("voice", "voice", 2),
        ("element", "element", 3),
    ]
    assert config.pools == {"voice": 2, "element": 3} and config.first_pools == {"voice": 2}


def test_no_providers_is_an_empty_config() -> None:
    assert ExternalConfig.parse("").providers == {} and ExternalConfig.parse("{}").providers == {}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({"Bad Name": VMOD}), "provider name"),
        (json.dumps({"v": {**VMOD, "base_url": "ftp://x"}}), "base_url"),
        (json.dumps({"v": {**VMOD, "base_url": "http://u:p@x"}}), "user name"),
        (json.dumps({"v": {**VMOD, "max_slots": 0}}), "max_slots"),
        (json.dumps({"v": {**VMOD, "max_slots": True}}), "max_slots"),
        (json.dumps({"v": {**VMOD, "poll_interval_s": -1}}), "poll_interval_s"),
        (json.dumps({"v": {**VMOD, "timeout_s": "long"}}), "timeout_s"),
        (json.dumps({"v": {**VMOD, "cost_per_job": -0.5}}), "cost_per_job"),
        (json.dumps({"v": {**VMOD, "handler": "celery"}}), "handler"),
        (json.dumps({"v": {**VMOD, "kind": "video"}}), "kind"),
        (json.dumps({"v": {**VMOD, "colour": "red"}}), "colour is not a setting"),
        (json.dumps({"v": {**VMOD, "stages": []}}), "stages"),
        (json.dumps({"v": {**VMOD, "stages": ["a", "a"]}}), "appears twice"),
        (json.dumps({"v": {**VMOD, "stages": [{"name": "a", "speed": 1}]}}), "stages[0].speed"),
        (json.dumps({"v": {**VMOD, "stages": [{"name": "a", "pool": "P!"}]}}), "stages[0].pool"),
        (json.dumps({"a": VMOD, "b": {**VMOD, "max_slots": 2, "stages": [{"name": "x", "pool": "a"}]}}), "one pool"),
    ],
)
def test_a_bad_value_is_an_error_naming_what_is_wrong(raw: str, says: str) -> None:
    with pytest.raises(ExternalConfigError, match="SIEVE_EXTERNAL_PROVIDERS") as err:
        ExternalConfig.parse(raw)
    assert says in str(err.value)


def test_a_bad_provider_setting_stops_the_service_at_start() -> None:
    with pytest.raises(SettingsError, match="max_slots"):
        Settings.from_env({"SIEVE_EXTERNAL_PROVIDERS": json.dumps({"v": {**VMOD, "max_slots": -1}})})
    with pytest.raises(SettingsError, match="SIEVE_WORKER_ROLE=external needs providers"):
        Settings.from_env({"SIEVE_WORKER_ROLE": "external"})
    with pytest.raises(SettingsError, match="SIEVE_WORKER_ROLE"):
        Settings.from_env({"SIEVE_WORKER_ROLE": "gpu"})


def test_an_external_task_times_out_after_its_longest_provider_deadlines() -> None:
    settings = Settings.from_env({}, external_providers=json.dumps({"a": VMOD, "b": {**VMOD, "timeout_s": 900}}))
    assert settings.timeout_of("EXTERNAL") == 1800.0  # one stage's deadline and the finish's
    assert settings.timeout_of("TEXT") == settings.text_timeout_s


# --- the intake's validation of TaskSpec.external ---------------------------------------------------------------
SETTINGS = Settings.from_env({}, external_providers=json.dumps({"vmod": VMOD}), external_max_input_bytes=100)


def _spec(provider: str = "vmod", input_json: str = '{"video": "x"}') -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(
        device_id="aa:bb:cc:dd:ee:01",
        type=types_pb2.TASK_TYPE_EXTERNAL,
        external=intake_pb2.ExternalJob(provider=provider, input_json=input_json),
    )


def test_an_external_task_is_accepted_and_stores_its_job() -> None:
    task = validate_spec(_spec(), "task", "c1", SETTINGS)
    assert task.task_type == types_pb2.TASK_TYPE_EXTERNAL
    assert task.text == external_payload("vmod", '{"video": "x"}')
    assert json.loads(task.text) == {"provider": "vmod", "input_json": '{"video": "x"}'}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(provider="nope"), "task.external.provider"),
        (_spec(provider=""), "task.external.provider"),
        (_spec(input_json="{not json"), "task.external.input_json"),
        (_spec(input_json=json.dumps({"x": "y" * 200})), "task.external.input_json"),
        (_spec(input_json='"a\x00b"'), "task.external.input_json"),
        (
            intake_pb2.TaskSpec(device_id="aa:bb:cc:dd:ee:01", type=types_pb2.TASK_TYPE_EXTERNAL, text="hi"),
            "task.external",
        ),
    ],
)
def test_a_bad_external_job_is_refused_naming_its_field(spec: intake_pb2.TaskSpec, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        validate_spec(spec, "task", "c1", SETTINGS)
    assert err.value.field == field
