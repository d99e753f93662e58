"""No default credentials in what deploy/ ships, secrets made fresh by deploy/gen_secrets.py, and test-only hooks
that need an explicit switch."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sieve.rpc.auth import Role, parse_credentials
from sieve.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


def gen(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "gen_secrets.py"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_gen_secrets_makes_fresh_private_secrets_that_the_services_accept(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    assert gen(out).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    creds = {c.name: c.role for c in parse_credentials((out / "auth-tokens").read_text(), "auth-tokens")}
    assert creds == {"worker": Role.WORKER, "operator": Role.OPERATOR, "client": Role.CLIENT}
    tokens = {name: (out / f"token-{name}").read_text().strip() for name in creds}
    assert all(t.startswith("sv_") and len(t) > 40 for t in tokens.values())
    assert not any(t in (out / "auth-tokens").read_text() for t in tokens.values())  # hashes only
    env = {
        name: dict(line.split("=", 1) for line in (out / f"{name}.env").read_text().splitlines())
        for name in ("intake", "scheduler", "registry", "worker", "migrate")
    }
    assert env["intake"]["SIEVE_DATABASE_URL"].startswith("postgresql://sieve_intake:")
    assert env["worker"]["SIEVE_DATABASE_URL"].startswith("postgresql://sieve_worker:")
    assert env["migrate"]["SIEVE_DATABASE_URL"].startswith("postgresql://sieve_owner:")
    assert env["registry"] == {"SIEVE_REDIS_URL": env["registry"]["SIEVE_REDIS_URL"]}  # no PostgreSQL at all
    assert "SIEVE_REDIS_URL" not in env["worker"]  # workers have no Redis user
    for user in ("intake", "scheduler", "registry"):
        password = (out / f"redis-{user}").read_text().strip()
        assert env[user]["SIEVE_REDIS_URL"] == f"redis://sieve-{user}:{password}@redis:6379/0"
    # every secret differs from every other, and from a second run's
    values = [p.read_text() for p in out.iterdir() if p.name.startswith(("token-", "redis-", "pg-"))]
    assert len(set(values)) == len(values) == 3 + 3 + 5
    again = tmp_path / "again"
    assert gen(again).returncode == 0
    assert (again / "token-operator").read_text() != (out / "token-operator").read_text()
    # an existing folder is not overwritten by accident
    refused = gen(out)
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert (out / "token-operator").read_text().strip() == tokens["operator"]


def test_nothing_in_deploy_ships_a_default_credential() -> None:
    shipped = [
        p
        for p in DEPLOY.rglob("*")
        if p.is_file() and p.suffix in (".yaml", ".yml", ".md", ".sh", ".sql") and "secrets" not in p.parts
    ]
    for path in shipped:
        text = path.read_text()
        bad = ["demo-token", "SIEVE_API_KEYS", "sieve:sieve@", "POSTGRES_PASSWORD: ", "CHANGE-ME"]
        if path.suffix != ".md":  # what runs: no anonymous callers, no test hooks
            bad += ["SIEVE_ALLOW_ANONYMOUS", "SIEVE_TEST_HOOKS"]
        for word in bad:
            assert word not in text, f"{path.relative_to(ROOT)} contains {word!r}"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("registry", "scheduler", "intake", "worker-cpu", "worker-gpu", "worker-ocr-cpu"):
        env = services[name]["environment"]
        assert env["SIEVE_AUTH_TOKENS_FILE"] == "/run/secrets/auth-tokens"
        assert "auth-tokens" in services[name]["secrets"]
        assert env["SIEVE_DB_MIGRATE_ON_START"] == "false"
        assert services[name]["env_file"] == [f"secrets/{'worker' if name.startswith('worker') else name}.env"]
        assert "SIEVE_REDIS_URL" not in env and "SIEVE_DATABASE_URL" not in env
    for name in ("worker-cpu", "worker-gpu", "worker-ocr-cpu"):
        assert services[name]["environment"]["SIEVE_AUTH_TOKEN_FILE"] == "/run/secrets/token-worker"
        assert services[name]["environment"]["SIEVE_WORKER_ID"] == "worker/"
    assert "--aclfile" in (DEPLOY / "redis" / "start.sh").read_text()
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/pg-admin"
    assert services["migrate"]["command"][:3] == ["python", "-m", "sieve.db.migrate"]


def test_the_manifests_read_each_services_own_secret_and_migrate_in_a_job() -> None:
    docs = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    own = {
        "sieve-intake": "sieve-intake",
        "sieve-scheduler": "sieve-scheduler",
        "sieve-registry": "sieve-registry",
        "sieve-worker-cpu": "sieve-worker",
        "sieve-worker-gpu": "sieve-worker",
    }
    for name, secret in own.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        refs = [e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e]
        assert refs == [secret], name
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["auth"]["secret"]["secretName"] == "sieve-auth-tokens"
        assert {"name": "auth", "mountPath": "/etc/sieve/auth", "readOnly": True} in container["volumeMounts"]
        if "worker" in name:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["SIEVE_WORKER_ID"] == "worker/$(POD_NAME)"
            assert env["SIEVE_AUTH_TOKEN_FILE"] == "/etc/sieve/token/token"
    (kustomization,) = [d for d in docs if d["kind"] == "Kustomization"]
    literals = kustomization["configMapGenerator"][0]["literals"]
    assert "SIEVE_DB_MIGRATE_ON_START=false" in literals
    assert not [x for x in literals if x.startswith(("SIEVE_REDIS_URL", "SIEVE_DATABASE_URL"))]
    assert {"migrate.yaml", "retention.yaml"} <= set(kustomization["resources"])
    (job,) = [d for d in docs if d["kind"] == "Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "sieve.db.migrate"]
    assert {f"{s}=sieve_{s}" for s in ("intake", "scheduler", "worker")} <= set(command)


@pytest.mark.parametrize(
    ("variable", "value"), [("SIEVE_OCR_FAULT", "gpu_oom_once"), ("SIEVE_FIXED_RESOURCES", "cpu=10,memory=20")]
)
def test_test_only_hooks_need_the_explicit_test_switch(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(variable) + ".*SIEVE_TEST_HOOKS=true"):
        Settings.from_env({variable: value})
    settings = Settings.from_env({variable: value, "SIEVE_TEST_HOOKS": "true"})
    assert settings.test_hooks
    assert Settings.from_env({}).test_hooks is False
    assert Settings.from_env({variable: ""}).test_hooks is False  # an empty hook is no hook
