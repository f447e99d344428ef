"""The bundle format (version 1): member names, the manifest's identity and what a signature
vouches for, which export writes and import checks, in one place so the two cannot drift.

A bundle is a tar (``.tar``, or compressed by suffix: ``.tar.gz``/``.tgz``, ``.tar.xz``) of
regular files only, members in this order::

    manifest.json      {"format": "ctbuild-cache-bundle", "version": 1, "archs": [...] | null, "counts": {...}}
    toolchains.json    {fingerprint: profile}
    compile.json       {compile key: entry}       (entries exactly as stored, incl. digest/symbol/created)
    tuning.json        {tuning key: record}
    blobs/<digest>     raw CUBIN bytes, named by their xxh3-128 digest
    signature.json     (signed bundles only) a signature document (:mod:`ctbuild.cache.signing`) plus
                       "members": {name: sha256}; its subject is the SHA-256 of that member map

Everything is JSON or raw bytes, so reading a bundle never unpickles or executes anything.
"""

from __future__ import annotations

import re

from .jsontext import dumps
from .signing import subject_of

FORMAT = "ctbuild-cache-bundle"
VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "signature.json"
DOCUMENTS = ("toolchains.json", "compile.json", "tuning.json")
BLOB_MEMBER = re.compile(r"blobs/([0-9a-f]{32})")
#: Tar compression by the bundle file's suffix (none otherwise).
COMPRESSION = {".gz": "gz", ".tgz": "gz", ".xz": "xz"}
#: Bytes read at a time from a blob member: memory stays bounded whatever a CUBIN's size.
CHUNK = 1 << 20


def members_subject(hashes: dict[str, str]) -> str:
    """What a bundle's signature vouches for: the canonical {member name: SHA-256} map's digest."""
    return subject_of(dumps(hashes, what="signature").encode())
