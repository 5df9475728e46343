# The two front-door commands: `make demo` runs the embedded demo room, `make test` runs
# every check. Both create or reuse the local virtual environment by themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo run test check lint typecheck pytest docs schema bench screenshots system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/loopwarden demo

run: $(STAMP)
	$(BIN)/loopwarden run --config $(CONFIG)

system-deps:
	bash scripts/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) system-deps
	$(BIN)/pytest -q

test: lint typecheck pytest docs

# The documentation site (mkdocs.yml): --strict fails on a broken link, a missing page or a
# page left out of the nav. The reference pages are generated from the code as it builds.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# loopwarden.schema.json (editors' completion for loopwarden.yaml) from the config models;
# tests/test_docs.py fails when the checked-in file differs from them.
schema: $(STAMP)
	$(BIN)/python -m scripts.gen_reference schema

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench

# The README's console pictures: the browser tests take them, this keeps the 1280x800 ones.
screenshots: $(STAMP) system-deps
	$(BIN)/pytest -q -p no:randomly tests/gateway/console/test_console_browser_gateway.py \
		tests/gateway/console/test_console_browser_calls.py
	mkdir -p docs/console
	cp test-results/console-rooms.png test-results/console-activity.png \
		test-results/console-circuits.png test-results/console-calls.png \
		test-results/console-rules.png test-results/console-spend.png \
		test-results/console-audit.png test-results/console-calls-phone.png docs/console/

clean:
	rm -rf $(VENV) site .mypy_cache .pytest_cache .ruff_cache .hypothesis
