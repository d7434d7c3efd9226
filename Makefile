# The two quickstart commands: `make demo` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
PIP_FLAGS ?= --quiet --disable-pip-version-check

.PHONY: install demo test test-rust test-python lint package bench bench-quick test-slime

install:
	$(PYTHON) -m pip install $(PIP_FLAGS) -e ".[test]"

demo: install
	$(PYTHON) -m tokentrail demo

test: install test-rust test-python

test-rust:
	cargo test --quiet

test-python:
	HYPOTHESIS_PROFILE=ci $(PYTHON) -m pytest -q

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

# slime's own agent tests against slime and against tokentrail's drop-in (`tokentrail.integrations
# .slime`): `make test-slime SLIME=/path/to/slime` (slime is on no package index). SLIME_PYTHON
# is an interpreter with slime's test dependencies (torch, httpx) and tokentrail's.
SLIME ?=
SLIME_PYTHON ?= $(PYTHON)
test-slime:
	@test -n "$(SLIME)" || { echo "usage: make test-slime SLIME=/path/to/slime"; exit 2; }
	$(SLIME_PYTHON) .ci/test_slime.py "$(SLIME)" --python "$(SLIME_PYTHON)"
