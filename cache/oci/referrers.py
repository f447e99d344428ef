"""Signatures attached to an image: an OCI artifact whose ``subject`` is the image manifest.

A signature artifact is a manifest with ``artifactType`` :data:`SIGNATURE_TYPE`, the empty config,
one layer holding the signature document (:mod:`ctbuild.cache.signing`) and ``subject`` = the image's
manifest descriptor. Registries with the referrers API index it by its subject on their own. For
registries without it (the CNCF distribution registry 2.x among them) the pusher also maintains
the OCI 1.1 *referrers tag schema*: an image index tagged ``sha256-<hex of the subject>`` listing
the referrers, new ones appended. That tag, not cosign's ``sha256-<hex>.sig``, so a cosign
signature of the same image is never overwritten.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any, Protocol

from ..errors import CacheError
from ..signing import parse_document
from . import EMPTY_JSON, MAX_SIGNATURE, OCI_EMPTY, OCI_INDEX, OCI_MANIFEST, SIGNATURE_TYPE
from .blobs import check_descriptor, check_digest, descriptor, parse_json, sha256_digest

#: Signature artifacts tried per image at most: each is read and verified in turn until one
#: verifies. A bound, because anyone who can push can attach more and each costs two requests;
#: far above what a release process attaches (one per signing key and re-sign).
MAX_SIGNATURES = 64


class Target(Protocol):
    """What push and pull need of a registry or a layout."""

    def describe(self) -> str: ...
    def get_manifest(self, name: str) -> tuple[bytes, str, str | None] | None: ...
    def fetch_blob(self, digest: str, size: int, out: Any, what: str) -> None: ...
    def has_blob(self, digest: str) -> bool: ...
    def put_blob(self, digest: str, size: int, source: str | bytes) -> None: ...
    def put_manifest(self, name: str, data: bytes, media_type: str) -> None: ...
    def referrers(self, digest: str) -> list[dict[str, Any]] | None: ...


def fallback_tag(digest: str) -> str:
    return digest.replace(":", "-")


def attach_signature(target: Target, subject: dict[str, Any], document: dict[str, Any]) -> str:
    """Push ``document`` as a referrer of the manifest ``subject``; returns its manifest digest."""
    payload = json.dumps(document, sort_keys=True).encode()
    config = descriptor(OCI_EMPTY, EMPTY_JSON)
    layer = descriptor(SIGNATURE_TYPE, payload)
    target.put_blob(config["digest"], config["size"], EMPTY_JSON)
    target.put_blob(layer["digest"], layer["size"], payload)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SIGNATURE_TYPE, "config": config,
                "layers": [layer], "subject": subject,
                "annotations": {"org.opencontainers.image.created": created}}
    data = json.dumps(manifest, sort_keys=True).encode()
    entry = descriptor(OCI_MANIFEST, data, artifactType=SIGNATURE_TYPE)
    from .layout import Layout

    if isinstance(target, Layout):
        target.put_manifest("", data, OCI_MANIFEST, artifactType=SIGNATURE_TYPE)
        return entry["digest"]
    target.put_manifest(entry["digest"], data, OCI_MANIFEST)
    if target.referrers(subject["digest"]) is None:
        _add_to_tag_index(target, fallback_tag(subject["digest"]), entry)
    return entry["digest"]


def _add_to_tag_index(target: Target, tag: str, entry: dict[str, Any]) -> None:
    found = target.get_manifest(tag)
    manifests: list[Any] = []
    if found is not None and found[1] == OCI_INDEX:
        listed = parse_json(found[0], f"referrers index {tag}").get("manifests")
        manifests = [m for m in listed if isinstance(m, dict) and m.get("digest") != entry["digest"]] \
            if isinstance(listed, list) else []
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*manifests, entry]}
    target.put_manifest(tag, json.dumps(index, sort_keys=True).encode(), OCI_INDEX)


def signature_entries(target: Target, digest: str) -> list[dict[str, Any]]:
    """The descriptors of the signature artifacts attached to manifest ``digest``, in the order
    the registry (or the fallback tag's index) lists them; none is read yet."""
    listed = target.referrers(digest)
    if listed is None:
        found = target.get_manifest(fallback_tag(digest))
        listed = []
        if found is not None and found[1] == OCI_INDEX:
            manifests = parse_json(found[0], "referrers index").get("manifests")
            listed = manifests if isinstance(manifests, list) else []
    return [m for m in listed if isinstance(m, dict) and m.get("artifactType") == SIGNATURE_TYPE]


def read_signature(target: Target, entry: dict[str, Any]) -> dict[str, Any]:
    """The signature document (unverified: see signing.verify) of one listed artifact."""
    digest = check_descriptor(entry, "referrer descriptor")["digest"]
    found = target.get_manifest(digest)
    if found is None:
        raise CacheError(f"signature manifest {digest} is listed but missing from {target.describe()}")
    check_digest(digest, sha256_digest(found[0]), "signature manifest")
    layers = parse_json(found[0], "signature manifest").get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        raise CacheError("signature manifest must have exactly one layer; nothing was written")
    layer = check_descriptor(layers[0], "signature layer")
    if layer["mediaType"] != SIGNATURE_TYPE or layer["size"] > MAX_SIGNATURE:
        raise CacheError(f"signature layer is not a ctbuild signature of at most {MAX_SIGNATURE // 1024} KiB; "
                         "nothing was written")
    out = io.BytesIO()
    target.fetch_blob(layer["digest"], layer["size"], out, "signature layer")
    return parse_document(out.getvalue(), "image")
