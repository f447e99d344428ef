# Two entry points (see README Quickstart); both create .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
CACHE ?= .ctbuild-cache
# pyproject takes cuda-tile>=1.6,<1.8; .venv pins the newest for reproducible runs, and
# `make test-matrix` runs the version-sensitive tests under the oldest in .venv16.
CUTILE := 1.7.0
CUTILE_OLDEST := 1.6.0
VENV16 := .venv16
STAMP16 := $(VENV16)/.installed

# setup.py and the C sources: the editable install builds the C module into the source tree.
FAST_PATH := $(addprefix ctbuild/serve/_fast_path,.h _layout.h .c _layout.c _check.c _table.c _call.c)
# compat mode puts the tree's root on sys.path and builds the C module in place, as the tree is
# run elsewhere (docs/architecture.md, "Why farm and cache live inside the ctbuild namespace");
# setuptools warns about it (a plain editable install warns too), which is expected.
$(STAMP): pyproject.toml setup.py $(FAST_PATH)
	@echo "Installing torch, cuda-tile $(CUTILE) and an editable ctbuild into $(VENV): about a minute (setuptools' editable-mode warning is expected)"
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0 'cuda-tile[tileiras]==$(CUTILE)' -e '.[test]' \
		--config-settings editable_mode=compat
	touch $@

$(STAMP16): pyproject.toml setup.py $(FAST_PATH)
	@echo "Installing torch, cuda-tile $(CUTILE_OLDEST) and an editable ctbuild into $(VENV16): about a minute (setuptools' editable-mode warning is expected)"
	$(PY) -m venv $(VENV16)
	$(VENV16)/bin/pip install -q --upgrade pip
	$(VENV16)/bin/pip install -q torch==2.13.0 'cuda-tile[tileiras]==$(CUTILE_OLDEST)' \
		-e '.[test]' --config-settings editable_mode=compat
	touch $@

.PHONY: examples test test-matrix plan lint
examples: $(STAMP)  ## precompile the example kernels on an embedded Ray into $(CACHE)
	$(VENV)/bin/ctbuild precompile --config examples/ctbuild.toml --cache $(CACHE)

plan: $(STAMP)
	$(VENV)/bin/ctbuild plan --config examples/ctbuild.toml

# The suite runs its test files on TEST_WORKERS processes (pytest-xdist, a file's tests on one
# worker so module fixtures are built once): most end-to-end tests wait on subprocesses, and two
# workers on the 2-core CI machine take about 6 minutes where one takes about 8.
TEST_WORKERS ?= 2

test: $(STAMP)  ## the whole CPU suite (GPU tests skip without a GPU)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# What depends on cuTile's internals: its private hooks, the signature rules (parity with its
# own dispatcher on a stub libcuda), kernel identity and keys through real compiles, and a
# cache built by the other version (OTHER_CUTILE_PYTHON) missing under this one.
MATRIX_TESTS ?= tests/build/test_cutile_hooks.py tests/build/test_cutile_versions.py \
	tests/serve/test_signature_parity.py tests/serve/test_runtime_keys.py \
	tests/build/test_identity_fingerprint.py tests/build/test_identity_keys.py \
	tests/build/test_identity_build.py tests/build/test_precompile_incremental.py \
	tests/serve/test_gpu_signature_parity.py tests/build/test_identity_gpu.py \
	tests/serve/test_runtime_gpu.py

test-matrix: $(STAMP16) $(STAMP)  ## those tests under cuda-tile $(CUTILE_OLDEST) (in .venv16)
	OTHER_CUTILE_PYTHON=$(abspath $(VENV))/bin/python $(VENV16)/bin/python -m pytest -q \
		$(MATRIX_TESTS)

# What `make lint` checks, each file once: ruff does not follow the links ctbuild/farm and
# ctbuild/cache, so it is given farm and cache too (and tests, benchmarks, examples, docs);
# mypy follows them, so it is given ctbuild alone (it checks farm/ and cache/ as ctbuild.farm
# and ctbuild.cache, the names they are imported by).
RUFF_PATHS ?= ctbuild farm cache tests benchmarks examples docs
MYPY_PACKAGES ?= ctbuild

lint: $(STAMP)  ## ruff (style, imports, likely bugs) on the code and mypy on the packages
	$(VENV)/bin/ruff check $(RUFF_PATHS)
	$(VENV)/bin/mypy $(MYPY_PACKAGES)
