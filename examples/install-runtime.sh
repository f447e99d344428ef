#!/bin/sh
# The runtime stage's install step of examples/Dockerfile (tests/test_container_flow.py runs it
# outside Docker too). Run it from the source root:  sh examples/install-runtime.sh
#
# pyproject.toml depends on cuda-tile[tileiras] because building needs the compiler. A serving
# node only loads precompiled CUBINs, so it gets ctbuild without its dependencies, then those
# dependencies read from pyproject.toml with their extras dropped (cuda-tile without tileiras,
# ptxas or libnvvm). Reading them from pyproject.toml keeps the two lists from drifting.
# Torch (or your framework) is installed separately. PYTHON: the interpreter (default python3).
set -eu

PYTHON=${PYTHON:-python3}
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT

"$PYTHON" -m pip install --no-deps .
"$PYTHON" - pyproject.toml > "$requirements" <<'PY'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(re.sub(r"\[[^\]]*\]", "", d) for d in deps))
PY
"$PYTHON" -m pip install -r "$requirements"
