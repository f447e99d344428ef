"""``verify``: re-hash every blob and check every entry, reporting (and optionally repairing) problems.

Problems are dicts ``{"kind", "namespace", "key", "detail"}``. Kinds:
``bad_key`` (pickled or non-text key), ``unsafe_value`` (pickled value), ``bad_entry`` (not the
expected JSON), ``corrupt_blob`` (bytes do not hash to their digest), ``missing_file`` (row without its
value file), ``missing_blob`` (compile entry whose blob is gone or corrupt), ``bad_tag`` (entry's index
tag is not its digest), ``missing_winner`` (tuning record whose winning compile entry is gone).

``repair`` removes what is broken — quarantining corrupt blobs — so the next precompile rebuilds it;
a row with a pickled key cannot be addressed through diskcache and is only reported.
Unreferenced ("orphan") blobs are not problems: ``gc`` reclaims them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .digest import digest_of, is_digest
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, entry_problem
from .errors import UnsafeValueError
from .namespace import Namespace

if TYPE_CHECKING:
    from .store import Store


def verify(store: Store, *, repair: bool) -> dict[str, Any]:
    ns = store._ns
    problems: list[dict[str, str]] = []
    checked: dict[str, int] = {}
    repaired = 0

    def report(kind: str, namespace: Namespace, key: str, detail: str, fix: bool = True) -> None:
        nonlocal repaired
        problems.append({"kind": kind, "namespace": namespace.directory.name, "key": key, "detail": detail})
        if repair and fix:
            repaired += namespace.delete(key)

    def load(namespace: Namespace, required: tuple[str, ...]) -> dict[str, tuple[dict[str, Any], str, str | None]]:
        """Readable entries of a namespace as key -> (entry, JSON text, tag), reporting the unreadable ones."""
        good = {}
        rows = namespace.rows()
        checked[namespace.directory.name] = len(rows)
        for info in rows:
            if info.key is None:
                report("bad_key", namespace, f"rowid {info.rowid}", "key is pickled or not text", fix=False)
                continue
            try:
                value = namespace.value_of(info)
            except UnsafeValueError as exc:
                report("unsafe_value", namespace, info.key, str(exc))
                continue
            if value is None:
                continue  # removed while we walked
            why = entry_problem(value, required)
            if why is not None:
                report("bad_entry", namespace, info.key, why)
                continue
            good[info.key] = (json.loads(value), value, info.tag)
        return good

    good_blobs: set[str] = set()
    corrupt_blobs: set[str] = set()
    blob_rows = ns.blobs.rows()
    checked["blobs"] = len(blob_rows)
    for info in blob_rows:
        if info.key is None or not is_digest(info.key):
            report("bad_key", ns.blobs, info.key or f"rowid {info.rowid}", "blob key is not a digest", fix=info.key is not None)
            continue
        try:
            data = ns.blobs.value_of(info)
        except UnsafeValueError as exc:
            report("unsafe_value", ns.blobs, info.key, str(exc))
            continue
        if data is None:
            if ns.blobs.contains(info.key):
                report("missing_file", ns.blobs, info.key, f"value file {info.filename} is missing")
            continue
        if type(data) is not bytes or digest_of(data) != info.key:
            corrupt_blobs.add(info.key)
            store._digest_failures += 1
            problems.append({"kind": "corrupt_blob", "namespace": "blobs", "key": info.key,
                             "detail": f"{len(data)} bytes do not hash to their digest"})
            if repair:
                store._quarantine(info.key, data if type(data) is bytes else data.encode())
                repaired += 1
            continue
        good_blobs.add(info.key)

    entries = load(ns.compile, COMPILE_REQUIRED)
    for key, (entry, text, tag) in entries.items():
        digest = entry["digest"]
        if digest in corrupt_blobs or (digest not in good_blobs and store.get_blob(digest) is None):
            report("missing_blob", ns.compile, key, f"blob {digest} is {'corrupt' if digest in corrupt_blobs else 'missing'}")
        elif tag != digest:
            problems.append({"kind": "bad_tag", "namespace": "compile", "key": key, "detail": f"tag {tag!r} != digest {digest}"})
            if repair:
                ns.compile.set(key, text, tag=digest)
                repaired += 1

    tuning = load(ns.tuning, TUNING_REQUIRED)
    for key, (record, _, _) in tuning.items():
        winner = record["compile_key"]
        if winner not in entries and not store.has_compile(winner):
            report("missing_winner", ns.tuning, key, f"winning compile entry {winner!r} is missing")

    load(ns.toolchains, ())
    result: dict[str, Any] = {"ok": not problems, "problems": problems, "checked": checked}
    if repair:
        result["repaired"] = repaired
    return result
