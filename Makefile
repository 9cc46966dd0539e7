# One entry point for the template's checks; CI (.github/workflows/ci.yml) and .ci/run use it too.
PYTHON ?= .venv/bin/python
TEMPLATE_CODE = hooks tests bench

.PHONY: help setup lint test-fast test ci

help:
	@echo "make setup      .venv with the pinned test environment (scripts/setup-env.sh)"
	@echo "make lint       ruff check and ruff format --check of the template's own code"
	@echo "make test-fast  the template tests that render and lint, without torchrun (minutes)"
	@echo "make test       every template test, the generated projects' own suites included"
	@echo "make ci         setup, lint, test: what CI runs"

setup:
	scripts/setup-env.sh

lint:
	$(PYTHON) -m ruff check --config ruff.toml $(TEMPLATE_CODE)
	$(PYTHON) -m ruff format --check --config ruff.toml $(TEMPLATE_CODE)

test-fast:
	$(PYTHON) -m pytest -n 2 -m "not slow"

test:
	$(PYTHON) -m pytest -n 2

ci: setup lint test
