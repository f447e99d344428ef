"""ctbuild's content-addressed kernel cache: CUBINs by digest, compile entries, tuning records.

Its code imports only the standard library, diskcache and xxhash — nothing of cuTile, torch, Ray
or the rest of ctbuild — so the runtime path and the farm can both use it. (As ``ctbuild.cache``
it loads after the ``ctbuild`` package's ``__init__``, the declaration API, as any submodule does.)

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
canonical JSON text only; pickles are neither written nor read (:mod:`ctbuild.cache.safe_disk`).
See docs/cache.md for integrity, concurrency, eviction, read-only use and bundles.

The folder is the top-level cache/ of the source tree, imported only as ``ctbuild.cache``
(docs/architecture.md): a top-level ``cache`` is a project's own module.
"""
if __name__ != "ctbuild.cache":  # a source tree's root on sys.path: refuse a second copy
    raise ImportError(f"ctbuild's cache package is ctbuild.cache, not {__name__!r} "
                      "(python -m ctbuild.cache; from ctbuild.cache import Store)")

from typing import TYPE_CHECKING, Any

from .digest import digest_of
from .errors import CacheError, DamagedCacheError, ReadOnlyCacheError

if TYPE_CHECKING:
    from .store import CompileHit, Store

__all__ = ["CacheError", "CompileHit", "DamagedCacheError", "ReadOnlyCacheError", "Store", "digest_of"]


def __getattr__(name: str) -> Any:
    """``Store`` and ``CompileHit``, loaded on first use: the store pulls in diskcache and
    SQLite (about 30 ms), which a serving process writing its ledger through
    `ctbuild.cache.user_files` never needs."""
    if name in ("Store", "CompileHit"):
        from . import store
        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
