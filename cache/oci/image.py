"""Build an OCI image from a store and push it; pull one, check it, and import it.

The image (one layer, the bundle; why one: see docs/deployment.md)::

    manifest  application/vnd.oci.image.manifest.v1+json, annotations = the labels below
    config    application/vnd.oci.image.config.v1+json: os/architecture, rootfs.diff_ids, config.Labels
    layer     application/vnd.oci.image.layer.v1.tar+gzip: the bundle (manifest.json first, blobs/...)

Labels (on the config, where GKM and ``skopeo inspect`` read them, and as manifest annotations):
``cache.ctbuild.image/*`` after GKM's ``cache.<type>.image/*`` (format, archs, summary,
entry-count, cache-size-bytes, cuda-tile-version, toolchain-fingerprints, kernel-count,
tuning-record-count), ``io.kserve.km/framework`` and ``io.kserve.km/cache-type``, and
``org.opencontainers.image.created``/``title``.

Pull checks, in this order, before anything is written: the manifest's digest (the one asked
for, or the one the registry or layout names), its media type, the signature when one is
required (on the manifest digest, before any other blob is fetched), the config's digest, media
type and format label, the arch label against the GPU's exact ``sm``, the layer's media type and
its size against the free space; then the layer is downloaded beside the cache with its digest
checked, and imported through the bundle import, whose own checks and bounds all apply.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Sequence

from ..bundle import VERSION, export_bundle
from ..bundle_limits import SPACE_MARGIN
from ..errors import CacheError
from ..signing import HMAC, Key, sign, verify
from . import MAX_DOCUMENT, OCI_CONFIG, OCI_INDEX, OCI_LAYER_GZIP, OCI_MANIFEST
from .blobs import CHUNK, check_descriptor, check_digest, descriptor, parse_json, sha256_digest
from .referrers import MAX_SIGNATURES, Target, attach_signature, read_signature, signature_entries

LABEL = "cache.ctbuild.image"
FORMAT = f"ctbuild-cache-bundle/{VERSION}"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
MACHINES = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def push(store: Any, target: Target, name: str, *, archs: Sequence[str] | None = None, key: Key | None = None,
         sequence: int | None = None, expires: float | None = None) -> dict[str, Any]:
    """Build the image of ``store`` (entries of ``archs`` only, if given), push it as ``name``,
    and attach a signature made with ``key``. Returns the manifest digest, the labels, and what
    the layer's bundle left out (``skipped``, ``unreadable``: as `export_bundle` says them)."""
    if key is not None and key.algorithm == HMAC:
        raise CacheError(f"{key.path} is an HMAC secret; images are signed with an Ed25519 private key "
                         "(`ctbuild cache keygen`), HMAC secrets are for offline bundles")
    with tempfile.TemporaryDirectory(prefix="ctbuild-push-") as tmp:
        bundle = Path(tmp, "cache.tar")
        # The bundle inside carries the same signature, for readers of the unpacked layer (an image
        # volume, GKM's extraction): `ctbuild cache import DIR --require-signature PUB.pem`.
        exported = export_bundle(store, bundle, archs=archs, sign_key=key, sequence=sequence, expires=expires)
        if exported["compile_entries"] == 0:
            which = f" of {','.join(archs)}" if archs else ""
            raise CacheError(f"nothing to push: the cache has no compile entries{which}")
        layer_path = Path(tmp, "layer.tar.gz")
        diff_id, layer = _compress(bundle, layer_path)
        labels = _labels(store, bundle, exported)
        config = json.dumps({
            "created": labels["org.opencontainers.image.created"], "os": "linux",
            "architecture": MACHINES.get(platform.machine(), platform.machine()),
            "config": {"Labels": labels}, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": labels["org.opencontainers.image.created"], "created_by": "ctbuild cache push"}],
        }, sort_keys=True).encode()
        config_desc = descriptor(OCI_CONFIG, config)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc,
                               "layers": [layer], "annotations": labels}, sort_keys=True).encode()
        target.put_blob(layer["digest"], layer["size"], str(layer_path))
        target.put_blob(config_desc["digest"], config_desc["size"], config)
        target.put_manifest(name, manifest, OCI_MANIFEST)
    digest = sha256_digest(manifest)
    signature = None
    if key is not None:
        document = sign(digest, key, sequence=sequence, expires=expires)
        signature = attach_signature(target, descriptor(OCI_MANIFEST, manifest), document)
    return {"digest": digest, "name": name, "labels": labels, "layer": layer, "signature": signature,
            "compile_entries": exported["compile_entries"], "tuning_records": exported["tuning_records"],
            "skipped": exported["skipped"], "unreadable": exported["unreadable"]}


def _compress(source: Path, out_path: Path) -> tuple[str, dict[str, Any]]:
    """gzip ``source`` (reproducibly: no name, mtime 0); returns its diff_id and the layer descriptor."""
    raw, packed = hashlib.sha256(), _HashingWriter(open(out_path, "wb"))
    with open(source, "rb") as f, packed.out, gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        while chunk := f.read(CHUNK):
            raw.update(chunk)
            gz.write(chunk)
    layer = {"mediaType": OCI_LAYER_GZIP, "digest": "sha256:" + packed.sha.hexdigest(), "size": packed.size,
             "annotations": {"org.opencontainers.image.title": "ctbuild-cache.tar.gz"}}
    return "sha256:" + raw.hexdigest(), layer


class _HashingWriter:
    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def _labels(store: Any, bundle: Path, exported: dict[str, Any]) -> dict[str, str]:
    """What the image holds, as strings (labels and annotations are string maps)."""
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("compile.json")
        assert member is not None
        entries = list(json.load(member).values())
    archs = sorted({str(e.get("arch")) for e in entries})
    toolchains = sorted({str(e["toolchain"]) for e in entries if e.get("toolchain")})
    profiles = store.toolchains()
    versions = sorted({str(profiles[t]["cuda_tile"]) for t in toolchains if profiles.get(t, {}).get("cuda_tile")})
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        f"{LABEL}/format": FORMAT,
        f"{LABEL}/archs": ",".join(archs),
        f"{LABEL}/summary": json.dumps({"targets": [{"backend": "cuda", "arch": a} for a in archs]}, sort_keys=True),
        f"{LABEL}/entry-count": str(exported["compile_entries"]),
        f"{LABEL}/tuning-record-count": str(exported["tuning_records"]),
        f"{LABEL}/kernel-count": str(len({e.get("kernel") for e in entries})),
        f"{LABEL}/cache-size-bytes": str(exported["bytes"]),
        f"{LABEL}/cuda-tile-version": ",".join(versions),
        f"{LABEL}/toolchain-fingerprints": ",".join(toolchains),
        "io.kserve.km/framework": "ctbuild",
        "io.kserve.km/cache-type": "ctbuild-bundle",
        "org.opencontainers.image.title": "ctbuild kernel cache",
        "org.opencontainers.image.created": created,
    }


def pull(target: Target, name: str, cache: Path, *, arch: str, key: Key | None = None,
         min_sequence: int | None = None, import_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check the image ``name`` for ``arch`` (and its signature with ``key``), then import it into
    the cache at ``cache``. On any failure nothing stays written (a cache directory this pull
    created is removed)."""
    digest, manifest = _resolve(target, name)
    signed = None
    if key is not None:
        signed = _verify_signature(target, digest, key, min_sequence)
    config_desc, layer = _check_manifest(manifest, digest)
    labels = _read_labels(target, config_desc)
    archs = [a for a in labels.get(f"{LABEL}/archs", "").split(",") if a]
    if arch not in archs:
        raise CacheError(f"image {digest[:19]}... holds kernels for {','.join(archs) or 'no arch'}, not for "
                         f"{arch}: pull the image built for {arch}; nothing was written")
    home = _existing_ancestor(cache)
    free = shutil.disk_usage(home).free
    if layer["size"] + SPACE_MARGIN > free:
        raise CacheError(f"the image's layer is {layer['size'] / 2**20:.1f} MiB and {home} has {free / 2**20:.1f} MiB "
                         f"free (keeping {SPACE_MARGIN // 2**20} MiB spare): free space or pull into a bigger volume; "
                         "nothing was written")
    created = not cache.exists()
    fd, tmp = _temp_file(home)
    try:
        with os.fdopen(fd, "wb") as out:
            target.fetch_blob(layer["digest"], layer["size"], out, f"layer {layer['digest'][:19]}...")
        from ..store import Store

        with Store(cache) as store:
            result = store.import_bundle(tmp, **(import_options or {}))
    except BaseException:
        if created:
            shutil.rmtree(cache, ignore_errors=True)
        raise
    finally:
        os.unlink(tmp)
    return {**result, "digest": digest, "arch": arch, "archs": archs, "labels": labels, "signed": signed is not None,
            "sequence": (signed or {}).get("sequence")}


def _resolve(target: Target, name: str) -> tuple[str, dict[str, Any]]:
    """The manifest ``name`` names, its digest checked; refuses anything but an OCI image manifest."""
    found = target.get_manifest(name)
    if found is None:
        raise CacheError(f"{name} not found in {target.describe()}: check the name and tag; nothing was written")
    data, media_type, claimed = found
    digest = sha256_digest(data)
    check_digest(name if name.startswith("sha256:") else claimed or digest, digest, "image manifest")
    manifest = parse_json(data, "image manifest")
    kind = manifest.get("mediaType") or media_type
    if kind == OCI_INDEX or media_type == OCI_INDEX:
        raise CacheError(f"{name} is an image index (several images), not a ctbuild cache image; pull one of its "
                         "manifests by digest; nothing was written")
    if kind != OCI_MANIFEST:
        raise CacheError(f"{name} has media type {kind!r}, not an OCI image manifest: not a ctbuild cache image; "
                         "nothing was written")
    return digest, manifest


def _verify_signature(target: Target, digest: str, key: Key, min_sequence: int | None) -> dict[str, Any]:
    """The statement of the first attached signature that verifies with ``key``: each is read
    and checked in turn (one bad artifact must not hide a good one), at most MAX_SIGNATURES;
    else the first one's error, or the bound's."""
    what = f"image {digest[:19]}..."
    entries = signature_entries(target, digest)
    if not entries:
        return verify(None, digest, key, what=what, min_sequence=min_sequence)
    first: CacheError | None = None
    for entry in entries[:MAX_SIGNATURES]:
        try:
            return verify(read_signature(target, entry), digest, key, what=what, min_sequence=min_sequence)
        except CacheError as exc:
            first = first or exc
    if len(entries) > MAX_SIGNATURES:
        raise CacheError(f"{what} has {len(entries)} signatures attached and none of the first {MAX_SIGNATURES} "
                         f"verifies with {key.path}: delete the stale or foreign signature artifacts from "
                         f"{target.describe()}, or push the image again signed; nothing was written")
    assert first is not None
    raise first


def _check_manifest(manifest: dict[str, Any], digest: str) -> tuple[dict[str, Any], dict[str, Any]]:
    config = check_descriptor(manifest.get("config"), "image config descriptor")
    layers = manifest.get("layers")
    if config["mediaType"] != OCI_CONFIG:
        raise CacheError(f"image {digest[:19]}... has a config of media type {config['mediaType']!r}, not "
                         f"{OCI_CONFIG}: not a ctbuild cache image; nothing was written")
    if not isinstance(layers, list) or len(layers) != 1:
        raise CacheError(f"image {digest[:19]}... has {len(layers) if isinstance(layers, list) else 'no'} layers; "
                         "a ctbuild cache image has exactly one; nothing was written")
    layer = check_descriptor(layers[0], "image layer descriptor")
    if layer["mediaType"] not in (OCI_LAYER_GZIP, DOCKER_LAYER_GZIP):
        raise CacheError(f"image {digest[:19]}... has a layer of media type {layer['mediaType']!r}, not "
                         f"{OCI_LAYER_GZIP}: not a ctbuild cache image; nothing was written")
    return config, layer


def _read_labels(target: Target, config_desc: dict[str, Any]) -> dict[str, str]:
    if config_desc["size"] > MAX_DOCUMENT:
        raise CacheError(f"image config is larger than {MAX_DOCUMENT // 2**20} MiB: not ours; nothing was written")
    out = io.BytesIO()
    target.fetch_blob(config_desc["digest"], config_desc["size"], out, "image config")
    labels = (parse_json(out.getvalue(), "image config").get("config") or {}).get("Labels")
    if not isinstance(labels, dict) or labels.get(f"{LABEL}/format") is None:
        raise CacheError(f"the image has no {LABEL}/format label: not a ctbuild cache image; nothing was written")
    if labels[f"{LABEL}/format"] != FORMAT:
        raise CacheError(f"the image holds {labels[f'{LABEL}/format']!r}; this ctbuild reads {FORMAT}: pull it "
                         "with the ctbuild that pushed it; nothing was written")
    return {str(k): str(v) for k, v in labels.items()}


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _temp_file(directory: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(prefix=".ctbuild-pull-", suffix=".tar.gz", dir=directory)
    except OSError as exc:
        raise CacheError(f"cannot write in {directory}: {exc.strerror}; pull into a writable directory") from None
