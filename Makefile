# Ferry: two entry points for a fresh machine.
#   make demo   -> set up .venv and run `ferry demo`
#   make test   -> set up .venv (and system test dependencies when run as root) and run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-quick bench clean sysdeps

# The C accelerators (wal/_accel.c, checkpoint/_pageaccel.c) are built by the editable
# install; a changed source rebuilds them. Without a compiler the pure-Python paths run.
$(STAMP): pyproject.toml $(wildcard */*.c csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# system packages first (etcd for the control plane, Java for Spark, gcc and headers for
# the C accelerators): installed when root with apt, else named
demo: sysdeps $(STAMP)
	$(VENV)/bin/ferry demo

# system packages first: the editable install compiles the C accelerators with gcc
test: sysdeps $(STAMP)
	$(PY) -m pytest -n 2 -q

sysdeps:
	./scripts/system-deps

test-quick: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow"

bench: $(STAMP)
	for b in bench/*_bench.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
