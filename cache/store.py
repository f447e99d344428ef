"""The :class:`Store`: CUBINs by content, compile entries, tuning records and toolchain profiles.

Invariants every method keeps, whatever other processes do to the same directory at the same time:

* A reader sees an entry wholly or not at all: each entry is one SQLite row (JSON inline), and a
  compile entry is committed only after its blob (a blob is *added*, never replaced).
* A blob is re-hashed on every read; a mismatch is a miss (never a bad CUBIN), logged once per digest,
  counted, and the bad bytes are moved to ``quarantine/`` when the store is writable.
* Nothing read is ever unpickled (:mod:`ctbuild.cache.safe_disk`); anything not bytes/JSON is refused.
* A read that SQLite or the OS cannot complete (a damaged index page, an I/O error) is a miss,
  logged once and counted in ``stats()["read_errors"]``; :attr:`Store.damage` says what failed, so
  a strict caller can say the cache is damaged and how to repair it (``cache verify --repair``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence, TypeVar

import xxhash

from . import bundle, eviction, integrity
from .digest import digest_of, is_digest
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, entry_problem, fields_problem
from .errors import (
    PERMISSION_HINT,
    CacheError,
    DamagedCacheError,
    PermissionDeniedError,
    ReadOnlyCacheError,
    UnsafeValueError,
)
from .jsontext import dumps, loads_object
from .layout import (
    QUARANTINE_DIR,
    Namespaces,
    check_layout,
    open_namespaces,
    resolve_readonly,
    unwritable,
)
from .namespace import ByteStream, HashingReader, Namespace, RowInfo
from .signing import Key

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True)
class CompileHit:
    """A compile entry with its verified CUBIN. ``meta`` is the stored entry (caller's meta plus
    the store's ``digest``, ``symbol``, ``size`` and ``created``)."""

    key: str
    cubin: bytes
    symbol: str
    meta: dict[str, Any]


class Store:
    """A content-addressed kernel cache in one directory, shared safely by many processes."""

    def __init__(self, path: str | os.PathLike, *, size_limit: int | None = None, readonly: bool | None = None,
                 on_damage: Callable[[str], None] | None = None) -> None:
        """Open (creating it when writable) the cache at ``path``.

        ``readonly=None`` detects an unwritable directory and opens it read-only with one warning;
        ``readonly=False`` insists on writing (ReadOnlyCacheError otherwise). ``size_limit`` (bytes of
        blobs) is the budget :meth:`gc` enforces when called without one; stores never evict on
        their own, so a farm of writers cannot evict each other's fresh work mid-build.
        ``on_damage(message)`` is called once, on the first read that fails on a damaged cache.
        """
        if size_limit is not None and size_limit < 0:
            raise ValueError(f"size_limit must be >= 0 bytes, got {size_limit}")
        self._path = Path(os.fspath(path)).expanduser().absolute()
        self.size_limit = size_limit
        self._readonly = resolve_readonly(self._path, readonly)
        check_layout(self._path, readonly=self._readonly)
        self._ns = open_namespaces(self._path, readonly=self._readonly)
        self._digest_failures = 0
        self._refused = 0
        self._reported: set[tuple[str, str]] = set()
        self._read_errors = 0
        self._damage: str | None = None
        self.on_damage = on_damage
        self._verified_blobs: set[str] = set()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def damage(self) -> str | None:
        """The first read error this process met (a damaged index or value file), else None."""
        return self._damage

    @property
    def namespaces(self) -> Namespaces:
        """The four namespaces, for the maintenance modules (verify, gc, bundles); lookups should
        use the typed methods, which verify digests and refuse unsafe values."""
        return self._ns

    def repair_hint(self) -> str:
        """The command that repairs this cache, for messages."""
        return f"`ctbuild cache verify --repair --cache {self._path}`, then `ctbuild precompile` rebuilds what was lost"

    @property
    def readonly(self) -> bool:
        return self._readonly

    def __repr__(self) -> str:
        return f"Store({str(self._path)!r}, readonly={self._readonly})"

    def close(self) -> None:
        """Release this process's database connections (the store reopens them if used again)."""
        for ns in self._ns.all():
            ns.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- blobs -------------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` by its digest (identical bytes are stored once) and return the digest."""
        data = _as_bytes(data, "blob")
        self._require_writable("store a blob")
        digest = digest_of(data)
        self._store_blob(digest, data)
        return digest

    def get_blob(self, digest: str) -> bytes | None:
        """The bytes stored under ``digest``, re-hashed; None when absent, refused or corrupt."""
        if not is_digest(digest):
            return None
        found = self._read(self._ns.blobs, digest)
        if found is None:
            return None
        data = found[1]
        if type(data) is not bytes:
            self._refuse(self._ns.blobs, digest, "value is text, not bytes")
            return None
        if digest_of(data) != digest:
            self.quarantine_blob(digest, data)
            return None
        self._verified_blobs.add(digest)
        return data

    def has_blob(self, digest: str) -> bool:
        """Whether a blob row exists for ``digest`` (an index lookup; the bytes are not checked)."""
        return self._index(lambda: self._ns.blobs.contains(digest), False)

    def put_blob_stream(self, digest: str, stream: ByteStream) -> bool:
        """Store the bytes read from ``stream`` under ``digest`` in chunks; True if added.

        The bytes are hashed as they are copied: if they do not match ``digest`` the blob is removed
        again and CacheError raised, so nothing unverified stays in the cache.
        """
        if not is_digest(digest):
            raise ValueError(f"not a digest: {digest!r}")
        self._require_writable("store a blob")
        if self.has_blob(digest) and self.get_blob(digest) is not None:
            return False
        hashing = HashingReader(stream, xxhash.xxh3_128())
        added = self._ns.blobs.add_stream(digest, hashing)
        if added and hashing.hexdigest() != digest:
            self._ns.blobs.delete(digest)
            raise CacheError(f"blob {digest} changed while being stored (its bytes hash to {hashing.hexdigest()})")
        return added

    def delete_blob(self, digest: str) -> bool:
        self._require_writable("delete a blob")
        self._verified_blobs.discard(digest)
        return self._ns.blobs.delete(digest)

    def _store_blob(self, digest: str, data: bytes) -> None:
        # An existing blob is re-verified: a corrupt copy is quarantined and replaced, not trusted.
        if self._ns.blobs.contains(digest) and self.get_blob(digest) is not None:
            return
        self._ns.blobs.add(digest, data)

    def quarantine_blob(self, digest: str, data: bytes) -> None:
        """Count a blob that failed its digest check (logged once), keep its bytes in quarantine/
        and drop it when the store is writable."""
        self._digest_failures += 1
        self._verified_blobs.discard(digest)
        if ("blobs", digest) not in self._reported:
            self._reported.add(("blobs", digest))
            log.error(
                "cache %s: blob %s does not match its digest (%d bytes; disk corruption or a torn copy); "
                "treated as a miss%s",
                self._path, digest, len(data), "" if self._readonly else " and moved to quarantine/",
            )
        if not self._readonly:
            self._quarantine(digest)

    def _quarantine(self, digest: str) -> None:
        """Move the bad value file into quarantine/ (its bytes as they are on disk), then drop
        the row; where it cannot be moved it stays, a miss on every read."""
        qdir = self._path / QUARANTINE_DIR
        dest = qdir / f"{digest}.{os.getpid()}.{time.time_ns()}.bad"
        try:
            qdir.mkdir(exist_ok=True)
            self._ns.blobs.move_out(digest, dest)
        except (OSError, CacheError) as exc:
            log.warning("cache %s: could not move bad blob %s to %s (%s); left in place", self._path, digest,
                        qdir, exc)

    # -- compile entries ---------------------------------------------------------------------

    def put_compile(self, key: str, cubin: bytes, *, symbol: str, meta: dict[str, Any]) -> str:
        """Store a CUBIN and its compile entry under ``key``; returns the CUBIN's digest.

        The blob is committed before the entry, so no reader can see an entry without its CUBIN.
        An empty CUBIN is refused: a compile without output is a failure, never a cached success.
        """
        _check_key(key, "compile key")
        cubin = _as_bytes(cubin, "cubin")
        if not cubin:
            raise ValueError(f"refusing to cache an empty CUBIN for {key!r}: a compile without output is a failure")
        if not isinstance(symbol, str) or not symbol:
            raise ValueError(f"symbol must be a non-empty str, got {symbol!r}")
        if not isinstance(meta, dict):
            raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
        self._require_writable("store a compile entry")
        digest = digest_of(cubin)
        entry = {**meta, "digest": digest, "symbol": symbol, "size": len(cubin), "created": time.time()}
        if problem := fields_problem(entry, COMPILE_REQUIRED):  # readers would skip it: not stored
            raise ValueError(f"compile entry for {key!r}: {problem}")
        text = dumps(entry, what="compile meta")
        self._store_blob(digest, cubin)
        self._ns.compile.set(key, text, tag=digest)
        if not self._ns.blobs.contains(digest):  # a concurrent gc took the blob as an orphan: put it back
            self._ns.blobs.add(digest, cubin)
        return digest

    def get_compile(self, key: str) -> CompileHit | None:
        """The entry and verified CUBIN for ``key``; None if missing or if its blob is missing/corrupt."""
        found = self._read(self._ns.compile, key)
        if found is None:
            return None
        info, value = found
        entry = self._parse(self._ns.compile, key, value, COMPILE_REQUIRED)
        if entry is None:
            return None
        cubin = self.get_blob(entry["digest"])
        if cubin is None:
            self._report_once(
                ("missing", key),
                "cache %s: compile entry %s names blob %s, which is missing or bad; treated as a miss",
                key, entry["digest"],
            )
            return None
        self._ns.compile.touch(info.rowid)
        return CompileHit(key, cubin, entry["symbol"], entry)

    def has_compile(self, key: str) -> bool:
        """Whether ``key`` has an entry whose blob is intact — what a build may skip.

        Each blob is re-hashed the first time this process asks about it (then remembered), so a
        build skips only keys whose CUBIN verifies; a corrupt blob is quarantined and reads as a miss.
        """
        absent: tuple[bool, str | None] = (False, None)
        exists, digest = self._index(lambda: self._ns.compile.tag_of(key), absent)
        if not exists or digest is None:
            return False
        if digest in self._verified_blobs:
            return self.has_blob(digest)
        return self.get_blob(digest) is not None

    def compile_entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every readable compile entry as (key, entry JSON); blobs are not read."""
        yield from self._entries(self._ns.compile, COMPILE_REQUIRED)

    # -- tuning records and toolchains -------------------------------------------------------

    def put_tuning(self, key: str, record: dict[str, Any]) -> None:
        """Store a tuning record (needs str ``kernel``, ``arch`` and ``compile_key`` of the winner)."""
        _check_key(key, "tuning key")
        if not isinstance(record, dict):
            raise ValueError(f"tuning record must be a dict, got {type(record).__name__}")
        missing = [f for f in TUNING_REQUIRED if not isinstance(record.get(f), str) or not record[f]]
        if missing:
            raise ValueError(f"tuning record for {key!r} lacks non-empty str field(s) {missing}")
        record = {**record, "created": time.time()}
        if problem := fields_problem(record, TUNING_REQUIRED):  # readers would skip it: not stored
            raise ValueError(f"tuning record for {key!r}: {problem}")
        self._require_writable("store a tuning record")
        self._ns.tuning.set(key, dumps(record, what="tuning record"))

    def get_tuning(self, key: str) -> dict[str, Any] | None:
        found = self._read(self._ns.tuning, key)
        return None if found is None else self._parse(self._ns.tuning, key, found[1], TUNING_REQUIRED)

    def tuning_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from self._entries(self._ns.tuning, TUNING_REQUIRED)

    def put_toolchain(self, fingerprint: str, profile: dict[str, Any]) -> None:
        """Store the profile (versions, paths, env) of the toolchain a fingerprint stands for."""
        _check_key(fingerprint, "toolchain fingerprint")
        if not isinstance(profile, dict):
            raise ValueError(f"toolchain profile must be a dict, got {type(profile).__name__}")
        self._require_writable("store a toolchain profile")
        self._ns.toolchains.set(fingerprint, dumps(profile, what="toolchain profile"))

    def get_toolchain(self, fingerprint: str) -> dict[str, Any] | None:
        found = self._read(self._ns.toolchains, fingerprint)
        return None if found is None else self._parse(self._ns.toolchains, fingerprint, found[1], ())

    def toolchains(self) -> dict[str, dict[str, Any]]:
        return dict(self._entries(self._ns.toolchains, ()))

    # -- maintenance -------------------------------------------------------------------------

    def remove_kernel(self, kernel: str, key: str | None = None) -> int:
        """Drop compile entries and tuning records of ``kernel`` (only ``key``, if given).

        Their blobs become orphans that :meth:`gc` reclaims. Returns how many entries were dropped.
        """
        self._require_writable(f"remove entries of kernel {kernel!r}")
        removed = 0
        for ns, required in ((self._ns.compile, COMPILE_REQUIRED), (self._ns.tuning, TUNING_REQUIRED)):
            for k, entry in list(self._entries(ns, required)):
                if entry.get("kernel") == kernel and (key is None or k == key):
                    removed += ns.delete(k)
        return removed

    def integrity(self) -> dict[str, str]:
        """Namespaces whose index fails SQLite's quick check, with what it found (empty: all sound).
        Reads every index page once; no value file is read."""
        found = {}
        for ns in self._ns.all():
            problem = ns.quick_check()
            if problem is not None:
                found[ns.directory.name] = problem
        return found

    def stats(self) -> dict[str, Any]:
        """Counts and sizes (no blob is read) and the index check of :meth:`integrity`.
        ``bytes`` counts blob bytes; a damaged namespace counts what is still readable (or 0)."""
        damaged = self.integrity()
        size = self._index(self._ns.blobs.total_size, 0)
        return {
            "path": str(self._path),
            "readonly": self._readonly,
            "damaged": damaged,
            "blobs": self._index(self._ns.blobs.count, 0),
            "compile_entries": self._index(self._ns.compile.count, 0),
            "tuning_records": self._index(self._ns.tuning.count, 0),
            "toolchains": self._index(self._ns.toolchains.count, 0),
            "bytes": size,
            "size_limit": self.size_limit,
            "over_limit": None if self.size_limit is None else size > self.size_limit,
            "digest_failures": self._digest_failures,
            "refused_values": self._refused,
            "read_errors": self._read_errors,
        }

    def verify(self, *, repair: bool = False) -> dict[str, Any]:
        """Re-hash every blob and check every entry; see :func:`ctbuild.cache.integrity.verify`."""
        if repair:
            self._require_writable("repair")
        return integrity.verify(self, repair=repair)

    def gc(self, *, size_limit: int | None = None, evict_tuned: bool = False,
           orphan_grace_s: float = eviction.ORPHAN_GRACE_S) -> dict[str, Any]:
        """Drop orphans, then evict LRU compile entries down to ``size_limit`` (default: the store's);
        see :func:`ctbuild.cache.eviction.collect`."""
        self._require_writable("garbage-collect")
        limit = self.size_limit if size_limit is None else size_limit
        return eviction.collect(self, size_limit=limit, evict_tuned=evict_tuned, orphan_grace_s=orphan_grace_s)

    def drop(self, compile_keys: Sequence[str], tuning_keys: Sequence[str], *, dry_run: bool = False
             ) -> dict[str, Any]:
        """Remove these entries and the blobs only they used (``dry_run``: count, remove nothing);
        see :func:`ctbuild.cache.eviction.drop`."""
        if not dry_run:
            self._require_writable("remove entries")
        return eviction.drop(self, compile_keys, tuning_keys, dry_run=dry_run)

    def export_bundle(self, file: str | os.PathLike | IO[bytes], *, archs: Sequence[str] | None = None,
                      sign_key: Key | None = None, sequence: int | None = None,
                      expires: float | None = None) -> dict[str, Any]:
        """Write entries (of ``archs`` only, if given) and their blobs to a tar bundle, signed with
        ``sign_key`` (Ed25519 or HMAC-SHA256, :mod:`ctbuild.cache.signing`) if given; see
        :mod:`ctbuild.cache.bundle`."""
        return bundle.export_bundle(self, file, archs=archs, sign_key=sign_key, sequence=sequence, expires=expires)

    def import_bundle(self, file: str | os.PathLike | IO[bytes], *, require_key: Key | None = None,
                      limits: bundle.ImportLimits = bundle.DEFAULT_LIMITS,
                      min_sequence: int | None = None) -> dict[str, Any]:
        """Verify a bundle completely (and its signature with ``require_key``) within ``limits``,
        then merge it in (idempotent); see :mod:`ctbuild.cache.bundle`."""
        self._require_writable("import a bundle")
        return bundle.import_bundle(self, file, require_key=require_key, limits=limits,
                                    min_sequence=min_sequence)

    def read_entry(self, ns: Namespace, key: str) -> tuple[RowInfo, bytes | str] | None:
        """A row and its raw value from one of :attr:`namespaces` (None: absent, unsafe or unreadable)."""
        return self._read(ns, key)

    # -- internals ---------------------------------------------------------------------------

    def _require_writable(self, action: str) -> None:
        if self._readonly:
            blocker = unwritable(self._path)
            if blocker is not None and os.access(self._path, os.W_OK):  # the owner's files, not the mount
                raise PermissionDeniedError(f"cannot {action}: {blocker} is not writable: {PERMISSION_HINT}")
            raise ReadOnlyCacheError(
                f"cannot {action}: the cache at {self._path} is open read-only "
                "(its directory is not writable, or readonly=True was asked). "
                "Point --cache / CTBUILD_CACHE_DIR at a writable directory, or copy the cache "
                "(`ctbuild cache export` / `import`) to one."
            )

    def _read(self, ns: Namespace, key: str) -> tuple[RowInfo, bytes | str] | None:
        try:
            return ns.get(key)
        except UnsafeValueError as exc:
            self._refuse(ns, key, str(exc))
            return None
        except CacheError as exc:
            self._read_failed(exc)
            return None

    def _index(self, lookup: Callable[[], _T], fallback: _T) -> _T:
        """Run an index lookup; a read error is a miss (``fallback``), logged once and counted."""
        try:
            return lookup()
        except CacheError as exc:
            self._read_failed(exc)
            return fallback

    def _read_failed(self, exc: CacheError) -> None:
        self._read_errors += 1
        if not isinstance(exc, DamagedCacheError):
            log.warning("cache %s: %s; treated as a miss", self._path, exc)
            return
        if self._damage is None:
            self._damage = str(exc)
            log.error("cache %s is damaged (%s): every lookup it breaks is a miss; repair: %s",
                      self._path, exc, self.repair_hint())
            if self.on_damage is not None:
                self.on_damage(str(exc))

    def _parse(self, ns: Namespace, key: str, value: bytes | str, required: Sequence[str]) -> dict[str, Any] | None:
        problem = entry_problem(value, required)
        if problem is not None:
            self._refuse(ns, key, problem)
            return None
        return loads_object(value)  # type: ignore[arg-type]  # entry_problem checked it is JSON text

    def _entries(self, ns: Namespace, required: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        rows: list[RowInfo] = self._index(ns.rows, [])
        for info in rows:
            if info.key is None:
                self._refuse(ns, f"rowid {info.rowid}", "key is pickled or not text")
                continue
            try:
                value = ns.value_of(info)
            except UnsafeValueError as exc:
                self._refuse(ns, info.key, str(exc))
                continue
            except CacheError as exc:
                self._read_failed(exc)
                continue
            if value is not None and (entry := self._parse(ns, info.key, value, required)) is not None:
                yield info.key, entry

    def _refuse(self, ns: Namespace, key: str, reason: str) -> None:
        self._refused += 1
        self._report_once(
            (ns.directory.name, key),
            "cache %s: refusing %s entry %r: %s (treated as a miss; `ctbuild cache verify` lists it)",
            ns.directory.name, key, reason,
        )

    def _report_once(self, what: tuple[str, str], message: str, *args: object) -> None:
        if what not in self._reported:
            self._reported.add(what)
            log.error(message, self._path, *args)


def _check_key(key: object, what: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what} must be a non-empty str, got {key!r}")


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise ValueError(f"{what} must be bytes, got {type(data).__name__}")
