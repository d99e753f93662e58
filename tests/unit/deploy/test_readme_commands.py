"""The README's two commands are the ones `.ci/run` runs on a fresh machine: each sits in its own `sh` block
right after a `readme-command` marker, and `.ci/run` reads them from there with the same rule as this test."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def ci_readme_command(name: str) -> str:
    """What `.ci/run`'s own `readme_command NAME` prints (its awk, run for real)."""
    script = f'ROOT="{ROOT}"; eval "$(sed -n \'/^readme_command()/,/^}}/p\' "{ROOT}/.ci/run")"; readme_command {name}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout


def readme_block_after(marker: str) -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- readme-command: {marker} "))
    assert lines[start + 1] == "```sh", "the marker is right above its sh block"
    end = lines.index("```", start + 2)
    return lines[start + 2 : end]


def test_each_marker_is_followed_by_a_one_line_sh_block_that_ci_reads_verbatim() -> None:
    for name in ("demo", "tests"):
        block = readme_block_after(name)
        assert len(block) == 1, f"{name}: one command line, so that it is run exactly as shown"
        assert ci_readme_command(name) == block[0] + "\n"


def test_the_demo_makes_the_venv_with_python3_and_the_tests_install_the_dev_extra_and_run_all_of_pytest() -> None:
    demo = ci_readme_command("demo").strip()
    tests = ci_readme_command("tests").strip()
    assert demo.startswith("python3 -m venv .venv && ")
    assert "pip install -U" not in demo and "--upgrade" not in demo  # the pip the venv brings
    assert "deploy/run_local.py" in demo
    assert tests.endswith(".venv/bin/python -m pytest -q")  # the whole suite, no selection
    assert "'.[dev,embedded]'" in tests


def test_ci_runs_the_fresh_machine_step_with_both_commands() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert 'demo="$(readme_command demo)"' in run and 'tests="$(readme_command tests)"' in run
    assert "unshare --net --mount" in run
    stage = run.index("\nfresh_machine\n")  # called as a step of the whole run, not only by `.ci/run fresh-machine`
    assert run.index("\nmake rest\n") < stage < run.index('step "all checks passed"')
