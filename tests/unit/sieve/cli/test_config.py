"""The CLI's configuration: each value from a flag, else its SIEVE_* variable, else the config file, else the
default; the token of a command's role; bad files and values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from sieve.cli.config import CliConfig, ConfigError, Role, default_path, load


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_flags_win_over_variables_which_win_over_the_file(tmp_path: Path) -> None:
    config = write(tmp_path / "sieve" / "cli.toml", 'intake = "file:1"\nscheduler = "file:2"\nregistry = "file:3"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SIEVE_SCHEDULER_ADDR": "env:2", "SIEVE_REGISTRY_ADDR": "env:3"}
    got = load({"registry": "flag:3", "intake": None}, env)
    assert (got.intake, got.scheduler, got.registry) == ("file:1", "env:2", "flag:3")
    assert got.source == str(config)
    # without any, the local defaults
    bare = load({}, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert bare == CliConfig()


def test_the_default_path_follows_the_variables(tmp_path: Path) -> None:
    assert default_path({"SIEVE_CLI_CONFIG": str(tmp_path / "a.toml")}) == tmp_path / "a.toml"
    assert default_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "sieve" / "cli.toml"
    assert default_path({}) == Path.home() / ".config" / "sieve" / "cli.toml"


def test_a_command_takes_the_token_of_its_role_unless_one_is_given_for_all(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SIEVE_OPERATOR_TOKEN": "op", "SIEVE_CLIENT_TOKEN": "cl"}
    roles = load({}, env)
    assert roles.token_for(Role.OPERATOR) == "op" and roles.token_for(Role.CLIENT) == "cl"
    only_client = load({}, {"SIEVE_CLIENT_TOKEN": "cl", "XDG_CONFIG_HOME": str(tmp_path)})
    assert only_client.token_for(Role.OPERATOR) == "cl"
    given = load({"token": " tok "}, env)
    assert given.token_for(Role.OPERATOR) == given.token_for(Role.CLIENT) == "tok"
    token_file = write(tmp_path / "token", "from-file\nignored\n")
    assert load({"token_file": str(token_file)}, env).token_for(Role.CLIENT) == "from-file"
    with pytest.raises(ConfigError, match="cannot read it"):
        load({"token_file": str(tmp_path / "missing")}, env).token_for(Role.CLIENT)


def test_a_token_in_the_file_gives_way_to_a_role_token_in_the_environment(tmp_path: Path) -> None:
    write(tmp_path / "sieve" / "cli.toml", 'token = "file-token"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert load({}, env).token_for(Role.OPERATOR) == "file-token"
    assert load({}, {**env, "SIEVE_OPERATOR_TOKEN": "op"}).token_for(Role.OPERATOR) == "op"
    assert load({"token": "flag"}, {**env, "SIEVE_OPERATOR_TOKEN": "op"}).token_for(Role.OPERATOR) == "flag"


def test_bad_files_and_values_are_named(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = write(tmp_path / "sieve" / "cli.toml", "intake = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load({}, env)
    path.write_text('intak = "x"\n')
    with pytest.raises(ConfigError, match="unknown key 'intak'"):
        load({}, env)
    path.write_text("intake = 5\n")
    with pytest.raises(ConfigError, match="intake: must be a string"):
        load({}, env)
    path.write_text("timeout_s = 2.5\n")
    assert load({}, env).timeout_s == 2.5
    with pytest.raises(ConfigError, match="SIEVE_CLI_TIMEOUT_S: timeout must be more than 0"):
        load({}, {**env, "SIEVE_CLI_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match="--timeout-s: timeout must be a number"):
        load({"timeout_s": "soon"}, env)
    with pytest.raises(ConfigError, match="no such file"):
        load({}, {}, config_path=str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="no such file"):
        load({}, {"SIEVE_CLI_CONFIG": str(tmp_path / "nope.toml")})
