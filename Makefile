# Two entry points, each of which sets up the virtual environment on its own:
#   make demo   -- install and run the main job
#   make test   -- install with the dev extras and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# torch==2.13.0 resolves to a local CPU wheel on the project machines; an unpinned torch pulls
# several GB of CUDA packages from the registry. Override with `make TORCH_SPEC=torch ...` elsewhere.
TORCH_SPEC ?= torch==2.13.0
HYPOTHESIS_PROFILE ?= ci

.PHONY: setup setup-dev demo test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .

setup-dev: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"

demo: setup
	$(BIN)/causalqwen demo

test: setup-dev
	HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
