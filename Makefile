# Ferry: two entry points for a fresh machine.
#   make demo   -> install what the demo needs (root + apt), set up .venv, run `ferry demo`
#   make test   -> install the system test dependencies (root + apt), set up .venv, run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ACCEL_INPUTS := $(VENV)/.accel-inputs

.PHONY: demo test test-quick lint bench clean sysdeps sysdeps-demo bytecode FORCE
# sysdeps must finish before the build inputs are read (it may install a header)
.NOTPARALLEL:

# What the C accelerators can be built with: the compiler and, for each header their
# sources include, whether it is found (scripts/accel inputs). Rewritten only when that
# changed, so its date moves only then: a header that appeared since the last install
# (e.g. xxhash.h, installed by sysdeps just before) rebuilds the venv.
$(ACCEL_INPUTS): FORCE
	@mkdir -p $(VENV)
	@$(PYTHON) scripts/accel inputs > $@.new
	@if cmp -s $@.new $@; then rm -f $@.new; else mv $@.new $@; fi

# The editable install builds the accelerators (optional: the install succeeds without
# them and the pure-Python paths run). The in-place modules are removed first: setuptools
# skips one whose sources did not change, even if it was built without a header that is
# there now. The stamp lists which accelerators were built (scripts/accel built).
$(STAMP): pyproject.toml $(wildcard */*.c csrc/*.h) $(ACCEL_INPUTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -f wal/_accel.*.so checkpoint/_*accel.*.so indexes/_*accel.*.so
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) scripts/accel built > $(STAMP).new
	mv $(STAMP).new $(STAMP)
	@sed 's/^/  /' $(STAMP)

# system packages first: etcd (control plane) and Java (Spark) are required, gcc, the
# Python headers and xxhash.h build the C accelerators; installed when root with apt,
# else named (and the demo stops when a required one is missing)
demo: sysdeps-demo $(STAMP) bytecode
	$(VENV)/bin/ferry demo

# system packages first: the editable install compiles the C accelerators with gcc
# Three workers on two cores: about half of the suite's time is waiting (clusters
# settling, leases expiring, Spark starting), not CPU. TEST_WORKERS=2 for a slower machine.
TEST_WORKERS ?= 3
test: sysdeps $(STAMP) lint bytecode
	$(PY) -m pytest -n $(TEST_WORKERS) -q --durations=15

# ruff and mypy, as configured in pyproject.toml ([tool.ruff], [tool.mypy])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Ferry's own modules compiled to __pycache__ (only what changed since the last time):
# the package is installed editable, so pip compiled none of them, and where
# PYTHONDONTWRITEBYTECODE is set no process writes them. Without it every node process
# compiles every module again when it starts (0.8 s more per start, measured).
PACKAGES := faults wal checkpoint transfer indexes node cluster_sim validation ferry
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 $(PACKAGES)

sysdeps:
	./scripts/system-deps test

sysdeps-demo:
	./scripts/system-deps demo

test-quick: $(STAMP) bytecode
	$(PY) -m pytest -n $(TEST_WORKERS) -q -m "not slow"

# every benchmark with its defaults (docs/benchmarks.md); the control-plane one has two
bench: $(STAMP)
	for b in bench/*_bench.py; do \
	  case $$b in \
	    */control_plane_bench.py) $(PY) $$b failover && $(PY) $$b latency || exit 1;; \
	    *) $(PY) $$b || exit 1;; \
	  esac; \
	done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

FORCE:
