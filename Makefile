# Ferry: two entry points for a fresh machine.
#   make demo   -> set up .venv and run `ferry demo`
#   make test   -> set up .venv (and system test dependencies when run as root) and run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-quick bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ferry demo

test: $(STAMP)
	./scripts/system-deps
	$(PY) -m pytest -n 2 -q

test-quick: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow"

bench: $(STAMP)
	for b in bench/*_bench.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
