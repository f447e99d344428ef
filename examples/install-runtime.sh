#!/bin/sh
# The runtime stage's install step of examples/Dockerfile (tests/cli/test_container_flow.py runs it
# outside Docker too). Run it from the source root:  sh examples/install-runtime.sh
#
# The plain install is the serving runtime: cuda-tile without tileiras, ptxas or libnvvm, and
# no Ray. Building needs the `farm` extra instead (see build-cache.sh).
# Torch (or your framework) is installed separately. PYTHON: the interpreter (default python3).
set -eu

PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install .
