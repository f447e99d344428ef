"""Exporting a store to a bundle, in the format of :mod:`ctbuild.cache.bundle_format`, and
saying what an export left out.

Export writes a temp file beside the target and renames it, so a failed export leaves no half
bundle; members carry fixed metadata (mtime 0, uid 0), so an uncompressed bundle of the same
entries has the same bytes. A bundle holds only what an import would accept: an entry whose CUBIN
is missing or corrupt, a tuning record whose winner is not exported, a stored value that cannot be
read is left out — and named (`left_out_line`), so that neither ``cache export`` nor ``cache push``
(whose image layer is this bundle) reports a whole cache when it shipped part of one.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Sequence

from .bundle_format import (
    COMPRESSION,
    DOCUMENTS,
    FORMAT,
    MANIFEST,
    SIGNATURE,
    VERSION,
    members_subject,
)
from .errors import CacheError
from .jsontext import dumps
from .signing import Key, sign
from .user_files import replacing

if TYPE_CHECKING:
    from .store import Store

#: How many left-out keys a message names before "...".
SHOWN_KEYS = 3


def export_bundle(store: Store, file: str | os.PathLike | IO[bytes], *, archs: Sequence[str] | None,
                  sign_key: Key | None = None, sequence: int | None = None,
                  expires: float | None = None) -> dict[str, Any]:
    """Write the store's entries (compile entries and tuning records of ``archs`` only, if given; all
    toolchain profiles) and the blobs they need, signed with ``sign_key`` if given (``sequence`` and
    ``expires`` go into the signed statement). Entries whose
    blob is missing or corrupt, and tuning records whose winner is not exported, are left out and
    listed under ``skipped``; stored values that could not be read or are malformed are left out
    and counted under ``unreadable``. A damaged index is refused (CacheError, nothing written):
    what it still lists is an arbitrary part of the cache."""
    if damaged := store.integrity():
        name, detail = next(iter(damaged.items()))
        raise CacheError(f"cannot export: the {name} index is damaged ({detail.splitlines()[-1]}); nothing was "
                         f"written; repair it first: {store.repair_hint()}")
    unread_before = _unread(store)
    wanted = None if archs is None else set(archs)
    compile_entries, skipped = _exported_compile_entries(store, wanted)
    tuning, skipped_tuning = _exported_tuning_records(store, wanted, compile_entries)
    skipped += skipped_tuning
    documents = {"toolchains.json": store.toolchains(), "compile.json": compile_entries, "tuning.json": tuning}
    unreadable = _unread(store) - unread_before
    digests = sorted({entry["digest"] for entry in compile_entries.values()})
    counts = {"compile_entries": len(compile_entries), "tuning_records": len(tuning),
              "toolchains": len(documents["toolchains.json"]), "blobs": len(digests)}
    manifest = {"format": FORMAT, "version": VERSION, "archs": None if wanted is None else sorted(wanted),
                "counts": counts}
    with _output(file) as (out, compression):
        total = _write(store, out, compression, manifest, documents, digests, signing=(sign_key, sequence, expires))
    return {**counts, "bytes": total, "archs": manifest["archs"], "skipped": skipped, "unreadable": unreadable,
            "signed": sign_key is not None}


def left_out_line(exported: dict[str, Any]) -> str | None:
    """What an export (``export_bundle``'s result) left out, as one line for its command's output;
    None when it left nothing out. A command that shipped part of the cache exits 1 with it."""
    parts = []
    if skipped := exported["skipped"]:
        shown = ", ".join(skipped[:SHOWN_KEYS]) + (", ..." if len(skipped) > SHOWN_KEYS else "")
        parts.append(f"{len(skipped)} entries whose CUBIN is missing, corrupt or unreadable, or tuning "
                     f"records naming them ({shown})")
    if exported["unreadable"]:
        parts.append(f"{exported['unreadable']} stored values that could not be read or are malformed")
    return f"left out {' and '.join(parts)}: see `ctbuild cache verify`" if parts else None


def _write(store: Store, out: IO[bytes], compression: str, manifest: dict[str, Any],
           documents: dict[str, Any], digests: list[str], *,
           signing: tuple[Key | None, int | None, float | None]) -> int:
    """Write the bundle's members in the format's order; returns the blob bytes written."""
    total = 0
    hashes: dict[str, str] = {}

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        hashes[name] = hashlib.sha256(data).hexdigest()
        _add(tar, name, data)

    # typeshed types ``mode`` as a literal; this one is "w:" plus a suffix from COMPRESSION.
    with tarfile.open(fileobj=out, mode=f"w:{compression}",  # type: ignore[call-overload]
                      format=tarfile.PAX_FORMAT) as tar:
        add(tar, MANIFEST, dumps(manifest, what="manifest").encode())
        for name in DOCUMENTS:
            add(tar, name, dumps(documents[name], what=name).encode())
        for digest in digests:
            data = store.get_blob(digest)
            if data is None:
                raise CacheError(f"blob {digest} vanished or went bad during export; "
                                 "run `ctbuild cache verify` and retry")
            add(tar, f"blobs/{digest}", data)
            total += len(data)
        key, sequence, expires = signing
        if key is not None:
            signature = {**sign(members_subject(hashes), key, sequence=sequence, expires=expires),
                         "members": hashes}
            _add(tar, SIGNATURE, dumps(signature, what="signature").encode())
    return total


def _unread(store: Store) -> int:
    """How many stored values this store has failed to read or refused so far."""
    counts = store.stats()
    return counts["read_errors"] + counts["refused_values"]


def _exported_compile_entries(store: Store, wanted: set[str] | None
                              ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The compile entries of the ``wanted`` archs (all: None) whose blob is there and intact,
    each blob read once, and the keys of those left out: an import would refuse them."""
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
    return compile_entries, skipped


def _exported_tuning_records(store: Store, wanted: set[str] | None,
                             compile_entries: dict[str, dict[str, Any]]
                             ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The tuning records of the ``wanted`` archs (all: None) whose winner is exported, and the
    keys of those left out."""
    tuning = {}
    skipped = []
    for key, record in store.tuning_records():
        if wanted is not None and record["arch"] not in wanted:
            continue
        if record["compile_key"] in compile_entries:
            tuning[key] = record
        else:  # its winner is not exported: an import would refuse the record
            skipped.append(key)
    return tuning, skipped


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """One member with fixed metadata, so the same entries give the same bytes."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


@contextmanager
def _output(file: str | os.PathLike | IO[bytes]) -> Iterator[tuple[IO[bytes], str]]:
    """Yield (stream, tar compression). A path is written whole or not at all, and only as a
    regular file (`ctbuild.cache.user_files`: a link is followed, a device or FIFO refused)."""
    if not isinstance(file, (str, os.PathLike)):
        yield file, ""
        return
    target = Path(file)
    with ExitStack() as stack:
        try:
            stream = stack.enter_context(replacing(target))
        except OSError as exc:  # errors of the export itself are not "cannot write"
            raise CacheError(f"cannot write bundle {target}: {exc.strerror}") from None
        yield stream, COMPRESSION.get(target.suffix, "")
