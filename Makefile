# The two quickstart commands: `make demo` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
PIP_FLAGS ?= --quiet --disable-pip-version-check
# The exact versions the suite last passed with; `make test-latest` proposes the next ones.
CONSTRAINTS ?= .ci/constraints.txt

.PHONY: install demo test test-rust test-python test-latest lint package bench bench-quick docs \
	docs-serve bump-harnesses test-slime

# The build backend comes from the constraints too (no build isolation), so the extension is
# built by the same maturin every time.
install:
	$(PYTHON) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) maturin
	$(PYTHON) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) --no-build-isolation -e ".[test,docs]"

demo: install
	$(PYTHON) -m tokentrail demo

test: install test-rust test-python

test-rust:
	cargo test --quiet

test-python:
	HYPOTHESIS_PROFILE=ci $(PYTHON) -m pytest -q

# Not in CI: the suite against the newest releases, in a virtual environment of its own, then
# what changed against the constraints (.ci/test-latest).
test-latest:
	PYTHON=$(PYTHON) bash .ci/test-latest

lint:
	ruff check python tests benches examples
	ruff format --check python tests benches examples
	$(PYTHON) -m mypy
	$(PYTHON) -m mypy.stubtest tokentrail._core
	cargo clippy --all-targets -- -D warnings
	cargo fmt --check

# The wheel and sdist a release ships: built (the release extension `install` built is reused),
# installed into a fresh environment without build tools, and run there (.ci/package); after
# `make install`.
package:
	PYTHON=$(PYTHON) bash .ci/package

# Benchmarks measure the extension built in release mode.
bench: install
	$(PYTHON) -m pip install $(PIP_FLAGS) --force-reinstall --no-deps .
	$(PYTHON) benches/run_all.py

bench-quick: install
	$(PYTHON) benches/run_all.py --quick

# The docs site, offline, strict: a broken link, a missing page or a stale include fails it.
# The settings reference is checked to be current first (python -m tokentrail.cli.settings_doc
# writes it). `install` brings the `docs` extra; DOCS_PYTHON: another Python that has it.
DOCS_PYTHON ?= $(PYTHON)

docs: install
	PYTHONPATH=python $(DOCS_PYTHON) -m tokentrail.cli.settings_doc --check
	NO_MKDOCS_2_WARNING=1 $(DOCS_PYTHON) -m mkdocs build --strict --site-dir site

docs-serve:
	NO_MKDOCS_2_WARNING=1 $(DOCS_PYTHON) -m mkdocs serve
# Every real harness's newest release: look them up, rewrite the pins in
# tests/support/harness_versions.py and run the harness tests against them.
bump-harnesses:
	$(PYTHON) scripts/bump-harnesses

# slime's own agent tests against slime and against tokentrail's drop-in (`tokentrail.integrations
# .slime`): `make test-slime SLIME=/path/to/slime` (slime is on no package index). SLIME_PYTHON
# is an interpreter with slime's test dependencies (torch, httpx) and tokentrail's.
SLIME ?=
SLIME_PYTHON ?= $(PYTHON)
test-slime:
	@test -n "$(SLIME)" || { echo "usage: make test-slime SLIME=/path/to/slime"; exit 2; }
	$(SLIME_PYTHON) .ci/test_slime.py "$(SLIME)" --python "$(SLIME_PYTHON)"
