"""ctbuild's content-addressed kernel cache: CUBINs by digest, compile entries, tuning records.

Imports only the standard library, diskcache and xxhash — no cuTile, torch, Ray or ctbuild — so
the runtime path and the farm can both use it.

On-disk layout of a cache directory (layout version 1)::

    <dir>/ctbuild-cache.json   {"format": "ctbuild-cache", "version": 1}; an unknown version is refused
    <dir>/blobs/               diskcache: xxh3-128 hex digest -> CUBIN bytes (always a file ab/cd/*.val)
    <dir>/compile/             diskcache: compile key -> JSON entry {**meta, digest, symbol, size, created};
                               row tag = digest (indexed: has_compile and gc need no JSON parse)
    <dir>/tuning/              diskcache: tuning key -> JSON record {kernel, arch, compile_key, ..., created}
    <dir>/toolchains/          diskcache: toolchain fingerprint -> JSON profile
    <dir>/quarantine/          blobs that failed their digest check and damaged index files replaced by
                               `verify --repair`, kept for inspection (safe to delete)

Each diskcache directory is ``cache.db`` (SQLite, WAL) plus value files. Values are bytes or
canonical JSON text only; pickles are neither written nor read (:mod:`cache.safe_disk`).
See docs/cache.md for integrity, concurrency, eviction, read-only use and bundles.
"""

from .digest import digest_of
from .errors import CacheError, DamagedCacheError, ReadOnlyCacheError
from .store import CompileHit, Store

__all__ = ["CacheError", "CompileHit", "DamagedCacheError", "ReadOnlyCacheError", "Store", "digest_of"]
