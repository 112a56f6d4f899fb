# Setup commands: `make install`, `make demo` and `make test`. Each creates .venv on first use.
# `make test-full` runs every test grid's whole cross product (slow).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
CONSTRAINTS := constraints/cpu.txt

.PHONY: demo test test-full bench install clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[cli,test,triton]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/torchfilters edges --out demo-out --format png
	@echo "edge maps written to demo-out/"

test: install
	$(PY) -m pytest -n 2 --dist worksteal -q --timeout=1200 --durations=25

# the core grids become full cross products; Hypothesis profile "full" (20x the examples)
test-full: install
	TORCHFILTERS_FULL_GRID=1 $(PY) -m pytest -n 2 --dist worksteal -q --timeout=1200

bench: install
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[bench]'
	$(PY) benchmarks/cpu.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache
