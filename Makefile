# Sieve's checks and test suites, one target each. They run in the project's virtualenv (.venv: `.ci/run` makes
# it, or `python3 -m venv .venv && .venv/bin/pip install -e '.[dev,embedded,ocr]'`); tests use Redis on
# 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432, or embedded ones when there are none, as in the README.
# `.ci/run` runs these targets in stages.
#
#   make lint        ruff check, ruff format --check, buf lint and format, generated stubs fresh
#   make typecheck   mypy, strict ([tool.mypy] in pyproject.toml)
#   make breaking    buf breaking against the previous commit
#   make check       the three above (no OCR extra needed)
#   make unit        tests/unit (tests that need the ocr extra skip without it)
#   make integration | security | e2e | faults      that folder of tests/
#   make test        the whole pytest suite, once
#   make bench       the benchmarks at smoke size (python -m tests.benchmarks --smoke; minutes)
#   make proto       regenerate sieve/v1 from protos/
#   make all         check, then test

VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYTEST := $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

.PHONY: all check lint typecheck breaking proto unit unit-core unit-ocr integration security e2e faults rest test \
	bench

all: check test

check: lint typecheck breaking

lint:
	$(PY) protos/generate.py --check
	$(BIN)/buf lint
	$(BIN)/buf format -d --exit-code
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

# A breaking change of a .proto file (FILE rules, buf.yaml) against the commit before this one. A clone without
# that commit (a shallow one, the first commit) has nothing to compare with: said, and not a failure.
breaking:
	@if git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null; then \
		echo "buf breaking --against '.git#ref=HEAD~1'"; \
		$(BIN)/buf breaking --against '.git#ref=HEAD~1'; \
	else \
		echo "buf breaking: no previous commit in this clone to compare with; skipped"; \
	fi

proto:
	$(PY) protos/generate.py

unit:
	$(PYTEST) tests/unit

# .ci/run's two halves of tests/unit: before the ocr extra is installed (no test may skip there), and after it
unit-core:
	SIEVE_TESTS_NO_SKIPS=1 $(PYTEST) tests/unit -m 'not ocr_extra'

unit-ocr:
	$(PYTEST) tests/unit -m ocr_extra || test $$? -eq 5  # 5: no test is marked so (none needs the extra)

integration:
	$(PYTEST) tests/integration

security:
	$(PYTEST) tests/security

e2e:
	$(PYTEST) tests/e2e

faults:
	$(PYTEST) tests/faults

# every test outside tests/unit (integration, security, e2e, faults, the benchmarks' smoke test, ...)
rest:
	$(PYTEST) --ignore=tests/unit

test:
	$(PYTEST)

bench:
	$(PY) -m tests.benchmarks --smoke
