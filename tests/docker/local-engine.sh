#!/bin/sh
# A Docker engine and a Python base image for machines with no registry access (air-gapped CI,
# a sandbox): the `docker` tests (tests/cli/test_docker_build.py) and docs/deployment.md use them.
# Needs root and Debian's packages `docker.io` and `debootstrap`.
#
#   sh tests/docker/local-engine.sh engine     start dockerd on $DOCKER_SOCK (no iptables, no bridge)
#   sh tests/docker/local-engine.sh image      build $BASE_IMAGE from Debian packages (no registry)
#   sh tests/docker/local-engine.sh [all]      both
#
# Then:  DOCKER_HOST=unix://$DOCKER_SOCK python -m pytest -m docker tests/cli/test_docker_build.py
# Settings, from the environment:
#   DOCKER_ROOT  the engine's data, exec root and log           (default /tmp/dk)
#   DOCKER_SOCK  its socket                                     (default $DOCKER_ROOT/docker.sock)
#   BASE_IMAGE   the image tag to create                        (default local/pybase:bookworm)
#   SUITE        the Debian release                             (default bookworm)
#   MIRROR       the Debian mirror debootstrap downloads from   (default deb.debian.org)
#   CA_BUNDLE    a CA bundle copied into the image, for pip behind TLS interception
#                                                               (default /etc/ssl/certs/ca-certificates.crt)
set -eu

DOCKER_ROOT=${DOCKER_ROOT:-/tmp/dk}
DOCKER_SOCK=${DOCKER_SOCK:-$DOCKER_ROOT/docker.sock}
BASE_IMAGE=${BASE_IMAGE:-local/pybase:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# Debian's client: it builds with BuildKit without the buildx plugin.
DOCKER="/usr/bin/docker --host unix://$DOCKER_SOCK"

engine() {
    if $DOCKER version >/dev/null 2>&1; then
        echo "engine already running on $DOCKER_SOCK"
        return
    fi
    mkdir -p "$DOCKER_ROOT"
    # vfs works on any filesystem (no overlay in nested containers); no iptables or bridge
    # (builds use --network=host).
    nohup /usr/sbin/dockerd --storage-driver=vfs --iptables=false --bridge=none \
        --data-root="$DOCKER_ROOT/data" --exec-root="$DOCKER_ROOT/exec" \
        --pidfile="$DOCKER_ROOT/dockerd.pid" --host="unix://$DOCKER_SOCK" \
        >"$DOCKER_ROOT/dockerd.log" 2>&1 &
    i=0
    until $DOCKER version >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 60 ]; then
            echo "dockerd did not start; see $DOCKER_ROOT/dockerd.log" >&2
            exit 1
        fi
        sleep 1
    done
    echo "engine running: DOCKER_HOST=unix://$DOCKER_SOCK"
}

image() {
    if $DOCKER image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "$BASE_IMAGE already exists"
        return
    fi
    rootfs=$(mktemp -d "${TMPDIR:-/tmp}/pybase.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        "$SUITE" "$rootfs" "$MIRROR"
    # Package downloads may go through a TLS-intercepting proxy: trust what this host trusts.
    if [ -f "$CA_BUNDLE" ]; then
        cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    fi
    rm -rf "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/var/lib/apt/lists"/*
    # Debian marks its Python as externally managed; the image's pip installs system-wide.
    tar -C "$rootfs" -c . | $DOCKER import \
        --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' - "$BASE_IMAGE"
    echo "built $BASE_IMAGE"
}

step=${1:-all}
case "$step" in
    engine) engine ;;
    image) image ;;
    all) engine && image ;;
    *) echo "usage: $0 [engine | image | all]" >&2; exit 2 ;;
esac
