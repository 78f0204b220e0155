# Two entry points for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup serve test clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, as the CPU wheel from PyTorch's CPU index (scripts/install-torch.sh says when
	# it cannot); then the rest, which finds torch already satisfied. Progress is shown.
	bash scripts/install-torch.sh $(BIN)/pip
	$(BIN)/pip install --progress-bar on -c constraints.txt -e '.[test,smart-turn]'
	# librosa's numba kernels compile (~15 s) and cache at their first import: here, not at a server's first voice upload
	$(BIN)/python -c "import librosa.feature, librosa.core.audio, librosa.core.pitch, librosa.util.utils"
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(BIN)/sgl-omni serve --enable-realtime $(ARGS)

test: $(STAMP)
	bash scripts/install-test-deps.sh  # espeak-ng (and chromium for the browser test) from apt, saying so
	PYTHON=$(PYTHON) bash scripts/install-framework-clients.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-frameworks .cache
