#!/bin/sh
# The build stage of examples/Dockerfile as a script, so the same steps also run outside Docker
# (tests/cli/test_container_flow.py runs them in a fresh virtualenv). Run it from the source root:
#
#   sh examples/build-cache.sh install              install ctbuild with Ray (no torch, no GPU)
#   sh examples/build-cache.sh precompile [ARGS]    import bundles, precompile, verify the cache
#   sh examples/build-cache.sh [all]                both
#
# ARGS go to `ctbuild precompile` (e.g. --workers 8, --address HOST:6379, --allow-failures).
# Settings, from the environment (the Dockerfile passes its build args):
#   CACHE_DIR  the cache to fill                          (default /opt/ctbuild-cache)
#   ARCHS      target GPU archs, comma-separated          (default sm_90,sm_100)
#   CONFIG     the project's ctbuild.toml                 (default examples/ctbuild.toml)
#   BUNDLES    a directory of `ctbuild cache export` bundles (tuning records from GPU nodes),
#              imported before precompiling               (default examples/bundles)
#   BUNDLE_KEY a key file: import only bundles signed with it (`ctbuild cache export --sign`);
#              in Docker, mount it as a build secret, never COPY it      (default: unset)
#              Unset, bundles are imported unsigned: their digests catch damage, not forgery,
#              so that is only right for bundles committed to this source tree, which are
#              reviewed like code. Bundles from anywhere else need BUNDLE_KEY.
#   PYTHON     the interpreter to install into            (default python3)
set -eu

CACHE_DIR=${CACHE_DIR:-/opt/ctbuild-cache}
ARCHS=${ARCHS:-sm_90,sm_100}
CONFIG=${CONFIG:-examples/ctbuild.toml}
BUNDLES=${BUNDLES:-examples/bundles}
BUNDLE_KEY=${BUNDLE_KEY:-}
PYTHON=${PYTHON:-python3}

install() {
    # The project with its `farm` extra (Ray). cuda-tile[tileiras] brings tileiras, ptxas and
    # libnvvm as wheels: no CUDA toolkit, no GPU and no torch are needed to precompile.
    "$PYTHON" -m pip install ".[farm]"
}

precompile() {
    for bundle in "$BUNDLES"/*.tgz "$BUNDLES"/*.tar "$BUNDLES"/*.tar.gz "$BUNDLES"/*.tar.xz; do
        [ -f "$bundle" ] || continue
        if [ -n "$BUNDLE_KEY" ]; then
            ctbuild cache import --cache "$CACHE_DIR" --require-signature "$BUNDLE_KEY" "$bundle"
        else
            echo "importing $bundle unsigned: trusted as part of this source tree (set BUNDLE_KEY to require a signature)"
            ctbuild cache import --cache "$CACHE_DIR" "$bundle"
        fi
    done
    ctbuild precompile --config "$CONFIG" --arch "$ARCHS" --cache "$CACHE_DIR" "$@"
    ctbuild cache verify --cache "$CACHE_DIR"
    ctbuild cache stats --cache "$CACHE_DIR"
}

step=${1:-all}
[ $# -gt 0 ] && shift
case "$step" in
    install) install ;;
    precompile) precompile "$@" ;;
    all) install && precompile "$@" ;;
    *) echo "usage: $0 [install | precompile [ARGS] | all [ARGS]]" >&2; exit 2 ;;
esac
