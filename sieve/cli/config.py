"""Where the `sieve` command finds the services and how it authenticates: flags, then `SIEVE_*` variables, then a
config file (`~/.config/sieve/cli.toml`, or `$XDG_CONFIG_HOME/sieve/cli.toml`, or the file `--config` /
`SIEVE_CLI_CONFIG` names), then the defaults of a local run.

The variables are the services' own (`SIEVE_INTAKE_ADDR`, `SIEVE_AUTH_TOKEN`, `SIEVE_TLS_CA_FILE`, ...), so a shell
set up for a service is set up for the CLI. Without a token from a flag, `SIEVE_AUTH_TOKEN(_FILE)` or the file's
`token`, a command uses the token of the role it needs: `SIEVE_OPERATOR_TOKEN` for operator commands,
`SIEVE_CLIENT_TOKEN` for a client's (those `deploy/run_local.py` prints), each falling back to the other, then
the file's `operator_token` / `client_token`.

The file is flat TOML:

    intake = "sieve.example.com:50051"
    scheduler = "sieve.example.com:50052"
    registry = "sieve.example.com:50053"
    token_file = "~/.config/sieve/token"
    tls_ca = "/etc/sieve/ca.pem"
    timeout_s = 10
"""

from __future__ import annotations

import enum
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the flag, variable or file key."""


class Role(enum.Enum):
    """Whose token a command prefers when none is given for every command."""

    CLIENT = "client"
    OPERATOR = "operator"


#: file key -> variable, for the values a file, the environment and a flag may all give
ENV_NAMES = {
    "intake": "SIEVE_INTAKE_ADDR",
    "scheduler": "SIEVE_SCHEDULER_ADDR",
    "registry": "SIEVE_REGISTRY_ADDR",
    "token": "SIEVE_AUTH_TOKEN",
    "token_file": "SIEVE_AUTH_TOKEN_FILE",
    "tls_ca": "SIEVE_TLS_CA_FILE",
    "tls_cert": "SIEVE_TLS_CERT_FILE",
    "tls_key": "SIEVE_TLS_KEY_FILE",
    "tls_server_name": "SIEVE_TLS_SERVER_NAME",
    "timeout_s": "SIEVE_CLI_TIMEOUT_S",
    "operator_token": "SIEVE_OPERATOR_TOKEN",
    "client_token": "SIEVE_CLIENT_TOKEN",
}


@dataclass(frozen=True)
class CliConfig:
    """Everything a command needs to reach the services."""

    intake: str = "127.0.0.1:50051"
    scheduler: str = "127.0.0.1:50052"
    registry: str = "127.0.0.1:50053"
    #: a bearer token for every command (wins over the role tokens)
    token: str = ""
    #: a file whose first word is that token
    token_file: str = ""
    #: the tokens of each role, used when `token` / `token_file` give none
    operator_token: str = ""
    client_token: str = ""
    #: TLS: the CA that signed the servers' certificates (TLS is on when set), and this client's own pair for mTLS
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    #: the name expected in the servers' certificate, when it is not the host of the address
    tls_server_name: str = ""
    #: deadline of one call, seconds (streams are not bound by it)
    timeout_s: float = 10.0
    #: where the file values came from ("" when none was read)
    source: str = ""

    def token_for(self, role: Role) -> str:
        """The token a command of `role` sends ("" for none)."""
        if self.token:
            return self.token.strip()
        if self.token_file:
            try:
                words = Path(self.token_file).expanduser().read_text().split()
            except OSError as exc:
                raise ConfigError(f"token file {self.token_file}: cannot read it: {exc.strerror}") from None
            return words[0] if words else ""
        first, second = (
            (self.operator_token, self.client_token)
            if role is Role.OPERATOR
            else (self.client_token, self.operator_token)
        )
        return (first or second).strip()


def default_path(env: Mapping[str, str]) -> Path:
    """`$SIEVE_CLI_CONFIG`, else `$XDG_CONFIG_HOME/sieve/cli.toml`, else `~/.config/sieve/cli.toml`."""
    if env.get("SIEVE_CLI_CONFIG"):
        return Path(env["SIEVE_CLI_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "sieve" / "cli.toml"


def _read_file(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ConfigError(f"config file {path}: no such file")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(ENV_NAMES))
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(ENV_NAMES))})")
    return data


def _timeout(value: object, where: str) -> float:
    try:
        timeout = float(str(value))
    except ValueError:
        raise ConfigError(f"{where}: timeout must be a number of seconds, not {value!r}") from None
    if not 0 < timeout < float("inf"):
        raise ConfigError(f"{where}: timeout must be more than 0 seconds")
    return timeout


def load(
    flags: Mapping[str, object | None], env: Mapping[str, str] | None = None, config_path: str | None = None
) -> CliConfig:
    """The configuration: each value from `flags` (None: not given), else its variable in `env`, else the file,
    else the default. `config_path` (the --config flag) names a file that must exist; without it the default
    path is read when it exists."""
    env = os.environ if env is None else env
    path = Path(config_path).expanduser() if config_path else default_path(env)
    from_file = _read_file(path, required=bool(config_path) or bool(env.get("SIEVE_CLI_CONFIG")))
    values: dict[str, Any] = {}
    level: dict[str, int] = {}  # where each value came from: 0 a flag, 1 the environment, 2 the file
    for f in fields(CliConfig):
        if f.name not in ENV_NAMES:
            continue
        flag = flags.get(f.name)
        if flag is not None:
            values[f.name], where, level[f.name] = flag, f"--{f.name.replace('_', '-')}", 0
        elif env.get(ENV_NAMES[f.name]):
            values[f.name], where, level[f.name] = env[ENV_NAMES[f.name]], ENV_NAMES[f.name], 1
        elif f.name in from_file:
            values[f.name], where, level[f.name] = from_file[f.name], f"{path}: {f.name}", 2
        else:
            continue
        if f.name == "timeout_s":
            values[f.name] = _timeout(values[f.name], where)
        elif not isinstance(values[f.name], str):
            raise ConfigError(f"{where}: must be a string")
    # a token for every command from the file gives way to a role's token from the environment
    role_level = min((level[k] for k in ("operator_token", "client_token") if k in level), default=3)
    for key in ("token", "token_file"):
        if level.get(key, 0) > role_level:
            del values[key]
    return CliConfig(**values, source=str(path) if from_file else "")


__all__ = ["ENV_NAMES", "CliConfig", "ConfigError", "Role", "default_path", "load"]
