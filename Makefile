# Two entry points (see README Quickstart); both create .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
CACHE ?= .ctbuild-cache

# setup.py and the C source: the editable install builds the C module into the source tree.
$(STAMP): pyproject.toml setup.py ctbuild/serve/_fast_path.c
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0 -e '.[test]' --config-settings editable_mode=compat
	touch $@

.PHONY: examples test plan lint
examples: $(STAMP)  ## precompile the example kernels on an embedded Ray into $(CACHE)
	$(VENV)/bin/ctbuild precompile --config examples/ctbuild.toml --cache $(CACHE)

plan: $(STAMP)
	$(VENV)/bin/ctbuild plan --config examples/ctbuild.toml

test: $(STAMP)  ## the whole CPU suite (GPU tests skip without a GPU)
	$(VENV)/bin/python -m pytest -q

# The packages `make lint` type-checks with mypy (ruff also checks tests, benchmarks, examples).
LINT_PACKAGES ?= ctbuild farm cache

lint: $(STAMP)  ## ruff (style, imports, likely bugs) on the code and mypy on the packages
	$(VENV)/bin/ruff check $(LINT_PACKAGES) tests benchmarks examples docs
	$(VENV)/bin/mypy $(LINT_PACKAGES)
