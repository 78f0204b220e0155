# Two entry points for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup serve test clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, from the CPU wheel (never let the resolver pick a CUDA build).
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(BIN)/sgl-omni serve --enable-realtime $(ARGS)

test: $(STAMP)
	bash scripts/install-test-deps.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache
