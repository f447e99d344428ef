"""Garbage collection and LRU eviction of a store.

Eviction happens only when asked (``Store.gc`` / ``ctbuild cache gc``), never inside a put: a farm of
writers filling one cache must not evict each other's fresh results mid-build.

Before anything is removed, gc refuses a cache whose indexes are not whole: an orphan is a blob
no compile entry names, so a damaged compile index (one :meth:`Store.integrity` reports) or a
deleted one would make intact CUBINs look like orphans. A compile index that was never written
and one that was deleted look alike on disk (namespaces are created by their first write); what
tells them apart is the blobs: a blob is committed just before its compile entry, so blobs
without any compile index mean the index was deleted (or every put into the cache was cut short,
which refusing costs nothing but the reclaim).

Order of work:
1. value files no row refers to (left by writers killed mid-store) and older than the grace period;
2. orphan blobs — no compile entry names them — older than the grace period (a blob is committed
   just before its entry, so a young orphan may be a put in flight);
3. while blob bytes exceed the limit: compile entries in least-recently-used order (by last
   ``get_compile``), each with its blob once no other entry shares it. Entries named as a winner by a
   tuning record are kept — unless ``evict_tuned``, which evicts them last (still LRU) and drops the
   tuning records that named them, so no record points at nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from diskcache.core import DBNAME

from .errors import DamagedCacheError

if TYPE_CHECKING:
    from .store import Store

ORPHAN_GRACE_S = 600.0


def collect(store: Store, *, size_limit: int | None, evict_tuned: bool, orphan_grace_s: float) -> dict[str, Any]:
    """Run the steps above; returns what was removed and whether the limit is met."""
    _refuse_unless_whole(store)
    ns = store.namespaces
    bytes_before = ns.blobs.total_size()
    cutoff = time.time() - orphan_grace_s
    stray = 0
    for namespace in ns.all():
        for path in namespace.stray_files(cutoff):
            namespace.remove_file(path)
            stray += 1

    blob_rows = {row.key: row for row in ns.blobs.rows() if row.key is not None}
    referenced = {row.tag for row in ns.compile.rows()}
    orphans = 0
    for digest, row in blob_rows.items():
        # Re-check through the tag index right before deleting: an entry may have arrived since the scan.
        if digest not in referenced and row.store_time < cutoff and not ns.compile.is_tagged(digest):
            orphans += ns.blobs.delete(digest)

    total = ns.blobs.total_size()
    evicted = evicted_blobs = dropped_tuning = 0
    if size_limit is not None and total > size_limit:
        winners: dict[str, list[str]] = {}
        for tuning_key, record in store.tuning_records():
            winners.setdefault(record["compile_key"], []).append(tuning_key)
        keyed = [(row.key, row) for row in ns.compile.rows() if row.key is not None]
        lru = sorted(keyed, key=lambda pair: pair[1].access_time)
        order = [(key, row) for key, row in lru if key not in winners]
        if evict_tuned:
            order += [(key, row) for key, row in lru if key in winners]
        for key, row in order:
            if total <= size_limit:
                break
            if not ns.compile.delete(key):
                continue
            evicted += 1
            for tuning_key in winners.get(key, ()):
                dropped_tuning += ns.tuning.delete(tuning_key)
            if row.tag and not ns.compile.is_tagged(row.tag) and ns.blobs.delete(row.tag):
                evicted_blobs += 1
                total -= blob_rows[row.tag].size if row.tag in blob_rows else 0

    bytes_after = ns.blobs.total_size()
    return {
        "stray_files_removed": stray,
        "orphan_blobs_removed": orphans,
        "evicted_entries": evicted,
        "evicted_blobs": evicted_blobs,
        "dropped_tuning_records": dropped_tuning,
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "size_limit": size_limit,
        "limit_met": size_limit is None or bytes_after <= size_limit,
    }


def _refuse_unless_whole(store: Store) -> None:
    """Raise DamagedCacheError, nothing removed, when an index is damaged or the compile index
    is gone while blobs are stored: either way a referenced CUBIN would look like an orphan."""
    if damaged := store.integrity():
        name, detail = next(iter(damaged.items()))
        raise DamagedCacheError(f"gc refuses to run: the {name} index is damaged ({detail.splitlines()[-1]}), so "
                                f"intact CUBINs could look like orphans; nothing was removed; repair it first: "
                                f"`ctbuild cache verify --repair --cache {store.path}`")
    ns = store.namespaces
    index = ns.compile.directory / DBNAME
    if _holds_nothing(index) and (blobs := ns.blobs.count()):
        raise DamagedCacheError(f"gc refuses to run: {index} is gone (deleted?) while {ns.blobs.directory} holds "
                                f"{blobs} CUBINs, each of which would look like an orphan; nothing was removed. "
                                f"`ctbuild cache verify --repair` cannot bring deleted entries back: restore "
                                f"{ns.compile.directory} from a backup, or write the entries again (`ctbuild "
                                f"precompile`, `ctbuild cache import`); gc then reclaims what no entry uses")


def _holds_nothing(path: Path) -> bool:
    """Whether an index file is absent or empty (an empty file opens as an empty database)."""
    try:
        return os.stat(path).st_size == 0
    except FileNotFoundError:
        return True


def drop(store: Store, compile_keys: Sequence[str], tuning_keys: Sequence[str], *, dry_run: bool) -> dict[str, Any]:
    """Remove the named tuning records, then the named compile entries, then each blob no remaining
    entry uses (re-checked through the tag index right before deleting, as :func:`collect` does).
    Absent keys are skipped. Returns the counts and blob bytes removed (``dry_run``: would remove)."""
    ns = store.namespaces
    rows = {row.key: row for row in ns.compile.rows() if row.key is not None}
    gone = {key for key in compile_keys if key in rows}
    records = [key for key in dict.fromkeys(tuning_keys) if ns.tuning.contains(key)]
    still_used = {row.tag for key, row in rows.items() if key not in gone}
    freed = {tag for key in gone if (tag := rows[key].tag)} - still_used
    sizes = {row.key: row.size for row in ns.blobs.rows()}
    if dry_run:
        return {"compile_entries": len(gone), "tuning_records": len(records), "blobs": len(freed),
                "bytes": sum(sizes.get(digest, 0) for digest in freed)}
    removed_records = sum(ns.tuning.delete(key) for key in records)
    removed_entries = sum(ns.compile.delete(key) for key in gone)
    blobs = [digest for digest in freed if not ns.compile.is_tagged(digest) and ns.blobs.delete(digest)]
    return {"compile_entries": removed_entries, "tuning_records": removed_records, "blobs": len(blobs),
            "bytes": sum(sizes.get(digest, 0) for digest in blobs)}
