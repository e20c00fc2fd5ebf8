# Two entry points, each of which sets up the virtual environment on its own:
#   make demo   -- install and run the main job
#   make test   -- install with the dev extras and run the whole test suite; where the run selects the
#                  browser test of the docs site (`-m docs`, part of the full run), build the site and
#                  install Debian's chromium for it first
# and `make docs`, which builds the site alone (`mkdocs build --strict` into site/).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# torch==2.13.0 resolves to a local CPU wheel on the project machines; an unpinned torch pulls
# several GB of CUDA packages from the registry. Override with `make TORCH_SPEC=torch ...` elsewhere.
TORCH_SPEC ?= torch==2.13.0
HYPOTHESIS_PROFILE ?= ci
# The suite runs on two workers (pytest-xdist): 8 to 12 minutes on 2 quiet cores against about 13 serially
# (longer on a busy machine: the tests' waits scale with its load, tests/wall_clock.py). `make test
# PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=

.PHONY: setup setup-dev setup-docs docs chromium demo test validation clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .

setup-dev: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"

setup-docs: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[docs]"

# KaTeX and mermaid come from the npm registry at the versions pinned in package-lock.json;
# docs_hooks/vendor.py copies the files the pages load into the site.
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund

docs: setup-docs node_modules/.package-lock.json
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The docs browser test drives Debian's Chromium (Playwright's own browser download is not used);
# a CJK font makes the Chinese legible in its screenshots.
chromium:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium fonts-wqy-microhei; }

demo: setup
	$(BIN)/causalqwen demo

# Whether the run selects the docs browser test is pytest's own answer (its collection of the run, with
# PYTEST_ARGS): `make test PYTEST_ARGS='-m "not docs"'` or a run of other test files neither builds the site
# nor installs chromium.
DOCS_TEST_SELECTED = $(BIN)/python -m pytest --collect-only -q $(PYTEST_ARGS) 2>/dev/null | grep -q "test_docs_site.py::"

test: setup-dev
	@if $(DOCS_TEST_SELECTED); then $(MAKE) --no-print-directory docs chromium; \
	else echo "make test: the docs browser test is not selected; the site is not built, chromium not installed"; fi
	HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The full validation run (about 15 minutes on a 2-core CPU, most of it V9): rewrites the report docs/validation/ that the site renders.
validation: setup-dev
	$(BIN)/python -m validation

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info site node_modules
