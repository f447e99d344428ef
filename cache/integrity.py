"""``verify``: check every index, re-hash every blob and check every entry, reporting (and
optionally repairing) problems.

Problems are dicts ``{"kind", "namespace", "key", "detail"}``. Kinds:
``damaged_index`` (a namespace's SQLite file fails its integrity check or cannot be read),
``bad_key`` (pickled or non-text key), ``unsafe_value`` (pickled value), ``bad_entry`` (not the
expected JSON), ``corrupt_blob`` (bytes do not hash to their digest), ``missing_file`` (row without its
value file), ``missing_blob`` (compile entry whose blob is gone or corrupt), ``bad_tag`` (entry's index
tag is not its digest), ``missing_winner`` (tuning record whose winning compile entry is gone),
``permission_denied`` (a file or index this user may not read) and ``unreadable_file`` (a value
file the OS cannot read, e.g. an I/O error).

``repair`` removes what is broken — moving corrupt blob files into ``quarantine/``, deleting bad rows
(by rowid when the key itself is unusable) — so the next precompile rebuilds it. It never removes
what it could not read: an entry whose file, blob or index is unreadable is reported and left.
A damaged index is rebuilt first: the rows still readable are copied into a fresh index, every
blob file that hashes cleanly is re-added
under its digest, and the damaged ``cache.db`` is kept under ``quarantine/`` for inspection.
Run a repair while no build or service writes the cache.
Unreferenced ("orphan") blobs are not problems: ``gc`` reclaims them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diskcache.core import DBNAME, MODE_RAW

from .digest import digest_of, is_digest
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, entry_problem
from .errors import (
    PERMISSION_HINT,
    CacheError,
    DamagedCacheError,
    PermissionDeniedError,
    UnsafeValueError,
)
from .layout import QUARANTINE_DIR
from .namespace import Namespace, RowInfo

if TYPE_CHECKING:
    from .store import Store


def verify(store: Store, *, repair: bool) -> dict[str, Any]:
    ns = store.namespaces
    problems: list[dict[str, str]] = []
    checked: dict[str, int] = {}
    repaired = 0
    rebuilt: dict[str, dict[str, int]] = {}

    def report(kind: str, namespace: Namespace, key: str, detail: str, rowid: int | None = None) -> None:
        nonlocal repaired
        problems.append({"kind": kind, "namespace": namespace.directory.name, "key": key, "detail": detail})
        if repair:
            repaired += namespace.delete(key) if rowid is None else namespace.delete_row(rowid)

    def unreadable_value(namespace: Namespace, key: str, exc: CacheError) -> None:
        """Reported, never repaired: the bytes may be intact."""
        kind = "permission_denied" if isinstance(exc, PermissionDeniedError) else "unreadable_file"
        problems.append({"kind": kind, "namespace": namespace.directory.name, "key": key, "detail": str(exc)})

    unreadable: set[str] = set()
    for namespace in ns.all():
        name = namespace.directory.name
        try:
            detail = namespace.quick_check()
        except PermissionDeniedError as exc:
            unreadable.add(name)
            unreadable_value(namespace, str(namespace.directory / DBNAME), exc)
            continue
        if detail is None:
            continue
        problems.append({"kind": "damaged_index", "namespace": name, "key": str(namespace.directory / DBNAME),
                         "detail": detail})
        if not repair:
            unreadable.add(name)
            continue
        try:
            rebuilt[name] = rebuild_index(store, namespace)
            repaired += 1
        except PermissionDeniedError as exc:  # a value file it would have to read: nothing moved
            unreadable.add(name)
            unreadable_value(namespace, str(namespace.directory), exc)

    def rows(namespace: Namespace) -> list[RowInfo]:
        if namespace.directory.name in unreadable:
            return []
        try:
            return namespace.rows()
        except PermissionDeniedError as exc:
            unreadable.add(namespace.directory.name)
            unreadable_value(namespace, str(namespace.directory / DBNAME), exc)
            return []
        except DamagedCacheError as exc:  # damage the quick check did not see
            unreadable.add(namespace.directory.name)
            problems.append({"kind": "damaged_index", "namespace": namespace.directory.name,
                             "key": str(namespace.directory / DBNAME), "detail": str(exc)})
            return []

    def load(namespace: Namespace, required: tuple[str, ...]) -> dict[str, tuple[dict[str, Any], str, str | None]]:
        """Readable entries of a namespace as key -> (entry, JSON text, tag), reporting the unreadable ones."""
        good = {}
        found = rows(namespace)
        checked[namespace.directory.name] = len(found)
        for info in found:
            if info.key is None:
                report("bad_key", namespace, f"rowid {info.rowid}", "key is pickled or not text", rowid=info.rowid)
                continue
            try:
                value = namespace.value_of(info)
            except UnsafeValueError as exc:
                report("unsafe_value", namespace, info.key, str(exc))
                continue
            except (PermissionDeniedError, DamagedCacheError) as exc:
                unreadable_value(namespace, info.key, exc)
                continue
            if value is None:
                continue  # removed while we walked
            why = entry_problem(value, required)
            if why is not None:
                report("bad_entry", namespace, info.key, why)
                continue
            assert isinstance(value, str)  # entry_problem refuses anything but JSON text
            good[info.key] = (json.loads(value), value, info.tag)
        return good

    good_blobs: set[str] = set()
    corrupt_blobs: set[str] = set()
    unreadable_blobs: set[str] = set()
    blob_rows = rows(ns.blobs)
    checked["blobs"] = len(blob_rows)
    for info in blob_rows:
        if info.key is None or not is_digest(info.key):
            report("bad_key", ns.blobs, info.key or f"rowid {info.rowid}", "blob key is not a digest", rowid=info.rowid)
            continue
        try:
            data = ns.blobs.value_of(info)
        except UnsafeValueError as exc:
            report("unsafe_value", ns.blobs, info.key, str(exc))
            continue
        except (PermissionDeniedError, DamagedCacheError) as exc:
            unreadable_blobs.add(info.key)
            unreadable_value(ns.blobs, info.key, exc)
            continue
        if data is None:
            if ns.blobs.contains(info.key):
                report("missing_file", ns.blobs, info.key, f"value file {info.filename} is missing")
            continue
        if type(data) is not bytes or digest_of(data) != info.key:
            corrupt_blobs.add(info.key)
            problems.append({"kind": "corrupt_blob", "namespace": "blobs", "key": info.key,
                             "detail": f"{len(data)} bytes do not hash to their digest"})
            if repair:
                store.quarantine_blob(info.key, data.encode() if isinstance(data, str) else data)
                repaired += 1
            continue
        good_blobs.add(info.key)

    entries = load(ns.compile, COMPILE_REQUIRED)
    for key, (entry, text, tag) in entries.items():
        digest = entry["digest"]
        if digest in unreadable_blobs or "blobs" in unreadable:
            continue  # its blob is reported; the entry may well be fine
        if digest in corrupt_blobs or (digest not in good_blobs and store.get_blob(digest) is None):
            state = "corrupt" if digest in corrupt_blobs else "missing"
            report("missing_blob", ns.compile, key, f"blob {digest} is {state}")
        elif tag != digest:
            problems.append({"kind": "bad_tag", "namespace": "compile", "key": key,
                             "detail": f"tag {tag!r} != digest {digest}"})
            if repair:
                ns.compile.set(key, text, tag=digest)
                repaired += 1

    tuning = load(ns.tuning, TUNING_REQUIRED)
    for key, (record, _, _) in tuning.items():
        winner = record["compile_key"]
        if "compile" in unreadable:
            break  # whether its winner exists cannot be told
        if winner not in entries and not store.has_compile(winner):
            report("missing_winner", ns.tuning, key, f"winning compile entry {winner!r} is missing")

    load(ns.toolchains, ())
    result: dict[str, Any] = {"ok": not problems, "problems": problems, "checked": checked}
    if repair:
        result["repaired"] = repaired
        result["rebuilt"] = rebuilt
    return result


def rebuild_index(store: Store, namespace: Namespace) -> dict[str, int]:
    """Replace a damaged namespace by a fresh one holding what is still readable.

    Inline rows (JSON entries) are copied row by row, skipping rows on broken pages; the blob
    namespace is rebuilt from its value files, each re-hashed and stored under its digest, so every
    intact CUBIN survives even when its row was lost. The old directory's ``cache.db`` is kept in
    ``quarantine/``; the rest of it is removed. Returns counts of what was kept and lost.
    """
    directory = namespace.directory
    _check_readable(directory)
    rows = namespace.readable_rows()
    namespace.close()
    aside = directory.with_name(f".{directory.name}.damaged.{time.time_ns()}")
    try:
        directory.rename(aside)
    except OSError as exc:
        raise CacheError(f"cannot move the damaged index {directory} aside ({exc.strerror}): stop every process "
                         f"using the cache, delete {directory / DBNAME}* by hand, then re-run precompile") from None
    kept = lost = 0
    if namespace is store.namespaces.blobs:
        for path in sorted(aside.glob("??/??/*.val")):
            data = path.read_bytes()
            kept += namespace.add(digest_of(data), data)
        lost = max(len(rows) - kept, 0)
    else:
        for key, raw, tag, mode, _filename, value in rows:
            if raw == 1 and type(key) is str and mode == MODE_RAW and type(value) is str:
                namespace.set(key, value, tag=tag)
                kept += 1
            else:  # a pickled key or value, or a value file: never valid in an inline namespace
                lost += 1
    quarantine = store.path / QUARANTINE_DIR
    quarantine.mkdir(exist_ok=True)
    if (aside / DBNAME).exists():
        shutil.move(str(aside / DBNAME), quarantine / f"{directory.name}.{time.time_ns()}.{DBNAME}")
    shutil.rmtree(aside, ignore_errors=True)
    return {"kept": kept, "lost_rows": lost}


def _check_readable(directory: Path) -> None:
    """Raise PermissionDeniedError unless every directory below ``directory`` can be listed and
    every file in it opened: a rebuild moves the old directory aside and removes what is left."""
    def denied(exc: OSError) -> None:
        raise PermissionDeniedError(f"{exc.filename}: {PERMISSION_HINT}") from None

    for root, _, files in os.walk(directory, onerror=denied):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb"):
                    pass
            except PermissionError as exc:
                denied(exc)
