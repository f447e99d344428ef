"""Bundles: a cache's entries and blobs in one tar file, to ship a cache between machines or into an image.

Format (version 1): a tar (``.tar``, or compressed by suffix: ``.tar.gz``/``.tgz``, ``.tar.xz``) of
regular files only, members in this order::

    manifest.json      {"format": "ctbuild-cache-bundle", "version": 1, "archs": [...] | null, "counts": {...}}
    toolchains.json    {fingerprint: profile}
    compile.json       {compile key: entry}       (entries exactly as stored, incl. digest/symbol/created)
    tuning.json        {tuning key: record}
    blobs/<digest>     raw CUBIN bytes, named by their xxh3-128 digest

Everything is JSON or raw bytes, so reading a bundle never unpickles or executes anything. Export
writes a temp file beside the target and renames it, so a failed export leaves no half bundle;
members carry fixed metadata (mtime 0, uid 0), so an uncompressed bundle of the same entries has the
same bytes.

Import checks the *whole* bundle first — member paths and types, manifest version, JSON shape,
every blob's digest, that every entry's blob is in the bundle or the store — and raises CacheError
with nothing written if anything is wrong. Only then does it store blobs, then entries (a compile
entry after its blob, a tuning record after its winner). Identical entries are left as they are, so
importing twice changes nothing; a differing entry is replaced by the bundle's.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import re
import tarfile
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Sequence

from .digest import digest_of, digest_of_stream
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, entry_problem
from .errors import CacheError
from .jsontext import dumps

if TYPE_CHECKING:
    from .namespace import Namespace
    from .store import Store

FORMAT = "ctbuild-cache-bundle"
VERSION = 1
MANIFEST = "manifest.json"
DOCUMENTS = ("toolchains.json", "compile.json", "tuning.json")
BLOB_MEMBER = re.compile(r"blobs/([0-9a-f]{32})")
COMPRESSION = {".gz": "gz", ".tgz": "gz", ".xz": "xz"}


def export_bundle(store: Store, file: str | os.PathLike | IO[bytes], *, archs: Sequence[str] | None) -> dict[str, Any]:
    """Write the store's entries (compile entries and tuning records of ``archs`` only, if given; all
    toolchain profiles) and the blobs they need. Entries whose blob is missing or corrupt are left
    out and listed under ``skipped``."""
    wanted = None if archs is None else set(archs)
    compile_entries: dict[str, dict[str, Any]] = {}
    blob_ok: dict[str, bool] = {}
    skipped = []
    for key, entry in store.compile_entries():
        if wanted is not None and entry.get("arch") not in wanted:
            continue
        digest = entry["digest"]
        if digest not in blob_ok:
            blob_ok[digest] = store.get_blob(digest) is not None
        if blob_ok[digest]:
            compile_entries[key] = entry
        else:
            skipped.append(key)
    tuning = {k: r for k, r in store.tuning_records() if wanted is None or r["arch"] in wanted}
    documents = {"toolchains.json": store.toolchains(), "compile.json": compile_entries, "tuning.json": tuning}
    digests = sorted({entry["digest"] for entry in compile_entries.values()})
    counts = {"compile_entries": len(compile_entries), "tuning_records": len(tuning),
              "toolchains": len(documents["toolchains.json"]), "blobs": len(digests)}
    manifest = {"format": FORMAT, "version": VERSION, "archs": None if wanted is None else sorted(wanted), "counts": counts}

    total = 0
    with _output(file) as (out, compression):
        with tarfile.open(fileobj=out, mode=f"w:{compression}", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, MANIFEST, dumps(manifest, what="manifest").encode())
            for name in DOCUMENTS:
                _add(tar, name, dumps(documents[name], what=name).encode())
            for digest in digests:
                data = store.get_blob(digest)
                if data is None:
                    raise CacheError(f"blob {digest} vanished or went bad during export; run `ctbuild cache verify` and retry")
                _add(tar, f"blobs/{digest}", data)
                total += len(data)
    return {**counts, "bytes": total, "archs": manifest["archs"], "skipped": skipped}


def import_bundle(store: Store, file: str | os.PathLike | IO[bytes]) -> dict[str, Any]:
    """Validate the whole bundle, then merge it into ``store``. Returns counts of what changed."""
    with _input(file) as stream:
        documents, bundle_blobs = _validate(store, stream)
        stream.seek(0)
        blobs_added = 0
        with _open_tar(stream) as tar:
            for member in tar:
                match = BLOB_MEMBER.fullmatch(member.name)
                if match is None:
                    continue
                data = _read(tar, member)
                if digest_of(data) != match.group(1):
                    raise CacheError(f"{member.name} changed while being imported; re-run the import")
                blobs_added += not store._ns.blobs.contains(match.group(1))
                store._store_blob(match.group(1), data)
    ns = store._ns
    written = unchanged = 0
    for namespace, name in ((ns.toolchains, "toolchains.json"), (ns.compile, "compile.json"), (ns.tuning, "tuning.json")):
        for key, entry in documents[name].items():
            if _merge(store, namespace, key, entry, tag=entry["digest"] if namespace is ns.compile else None):
                written += 1
            else:
                unchanged += 1
    return {"blobs": len(bundle_blobs), "blobs_added": blobs_added, "entries_written": written, "entries_unchanged": unchanged,
            "compile_entries": len(documents["compile.json"]), "tuning_records": len(documents["tuning.json"]),
            "toolchains": len(documents["toolchains.json"])}


def _merge(store: Store, namespace: Namespace, key: str, entry: dict[str, Any], *, tag: str | None) -> bool:
    text = dumps(entry, what=key)
    found = store._read(namespace, key)
    if found is not None and found[1] == text and found[0].tag == tag:
        return False
    namespace.set(key, text, tag=tag)
    return True


def _validate(store: Store, stream: IO[bytes]) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Pass 1: check everything, write nothing. Returns the JSON documents and the bundle's digests."""
    documents: dict[str, dict[str, Any]] = {}
    blobs: set[str] = set()
    seen: set[str] = set()
    with _open_tar(stream) as tar:
        for index, member in enumerate(tar):
            _check_member(member)
            if member.name in seen:
                raise CacheError(f"bundle member {member.name!r} appears twice; the bundle is malformed")
            seen.add(member.name)
            if index == 0 and member.name != MANIFEST:
                raise CacheError(f"bundle does not start with {MANIFEST} (found {member.name!r}): not a ctbuild cache bundle")
            if member.name == MANIFEST:
                _check_manifest(_read_json(tar, member))
            elif member.name in DOCUMENTS:
                documents[member.name] = _read_json(tar, member)
            else:
                digest = BLOB_MEMBER.fullmatch(member.name).group(1)  # type: ignore[union-attr]  # _check_member matched it
                extracted = tar.extractfile(member)
                assert extracted is not None  # regular file
                if digest_of_stream(extracted) != digest:
                    raise CacheError(f"bundle member {member.name} does not match its digest: the bundle is corrupt")
                blobs.add(digest)
    if MANIFEST not in seen:
        raise CacheError("bundle is empty: not a ctbuild cache bundle")
    for name in DOCUMENTS:
        documents.setdefault(name, {})
    required = {"toolchains.json": (), "compile.json": COMPILE_REQUIRED, "tuning.json": TUNING_REQUIRED}
    for name, document in documents.items():
        for key, entry in document.items():
            why = entry_problem(json.dumps(entry), required[name]) if key else "empty key"
            if why is not None:
                raise CacheError(f"bundle {name}: entry {key!r} is unusable ({why}); nothing was imported")
    for key, entry in documents["compile.json"].items():
        digest = entry["digest"]
        if digest not in blobs and store.get_blob(digest) is None:
            raise CacheError(f"bundle compile.json: entry {key!r} needs blob {digest}, which is neither in the bundle "
                             "nor in the cache; nothing was imported")
    return documents, blobs


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
        raise CacheError(f"bundle member {name!r} has an unsafe path (absolute, '..' or odd): refusing the bundle; nothing was imported")
    if not member.isreg():
        kind = "symlink" if member.issym() else "hard link" if member.islnk() else "directory" if member.isdir() else "device or special file"
        raise CacheError(f"bundle member {name!r} is a {kind}; bundles hold regular files only: refusing it; nothing was imported")
    if name != MANIFEST and name not in DOCUMENTS and not BLOB_MEMBER.fullmatch(name):
        raise CacheError(f"bundle member {name!r} is not part of the bundle format v{VERSION}; nothing was imported")


def _check_manifest(manifest: dict[str, Any]) -> None:
    if manifest.get("format") != FORMAT:
        raise CacheError(f"{MANIFEST} says format {manifest.get('format')!r}, not {FORMAT!r}: not a ctbuild cache bundle")
    if manifest.get("version") != VERSION:
        raise CacheError(f"bundle format version {manifest.get('version')!r} is not supported (this ctbuild reads "
                         f"version {VERSION}); import it with the ctbuild that exported it; nothing was imported")


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    assert extracted is not None  # _check_member allows regular files only
    return extracted.read()


def _read_json(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, Any]:
    try:
        value = json.loads(_read(tar, member))
    except ValueError as exc:
        raise CacheError(f"bundle member {member.name} is not valid JSON ({exc}); nothing was imported") from None
    if not isinstance(value, dict):
        raise CacheError(f"bundle member {member.name} must be a JSON object; nothing was imported")
    if member.name in DOCUMENTS and not all(isinstance(entry, dict) for entry in value.values()):
        raise CacheError(f"bundle member {member.name} must map keys to JSON objects; nothing was imported")
    return value


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


@contextmanager
def _open_tar(stream: IO[bytes]) -> Iterator[tarfile.TarFile]:
    try:
        tar = tarfile.open(fileobj=stream, mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CacheError(f"not a readable tar bundle ({exc}); nothing was imported") from None
    try:
        with tar:
            yield tar
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise CacheError(f"bundle is truncated or damaged ({exc}); nothing was imported") from None


@contextmanager
def _input(file: str | os.PathLike | IO[bytes]) -> Iterator[IO[bytes]]:
    if isinstance(file, (str, os.PathLike)):
        try:
            stream = open(file, "rb")
        except OSError as exc:
            raise CacheError(f"cannot read bundle {os.fspath(file)}: {exc.strerror}") from None
        with stream:
            yield stream
    else:
        if not file.seekable():
            raise CacheError("import needs a seekable bundle file (it is read twice: check, then store)")
        yield file


@contextmanager
def _output(file: str | os.PathLike | IO[bytes]) -> Iterator[tuple[IO[bytes], str]]:
    """Yield (stream, tar compression). A path is written through a temp file renamed on success."""
    if not isinstance(file, (str, os.PathLike)):
        yield file, ""
        return
    target = Path(file)
    compression = COMPRESSION.get(target.suffix, "")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise CacheError(f"cannot write bundle {target}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream, compression
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
