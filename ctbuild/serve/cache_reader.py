"""The serving read path of a cache directory: its SQLite indexes and blob files read directly,
read-only, without importing diskcache or the store (``ctbuild.cache.user_files`` only).

Importing ``cache`` (diskcache, its bundle, integrity and eviction modules) was most of a first
call's time. Serving reads four kinds of entries by key and never needs those modules: this
reader runs the same queries `ctbuild.cache.namespace.Namespace` runs on the same files (diskcache's
``Cache`` table: ``key``, ``raw``, ``tag``, ``mode``, ``filename``, ``value``) and makes the same
checks `ctbuild.cache.Store` makes: a value stored pickled (any diskcache mode but raw, binary or text)
is refused, JSON entries must be objects with their required fields, and every CUBIN is
re-hashed (xxh3-128) against its digest before it is served; a mismatch is a miss. What only a
writer does -- a JIT write-back, moving a corrupt blob to ``quarantine/`` -- goes to a
`ctbuild.cache.Store`, opened on first need. A directory this reader cannot take (no layout marker yet,
another layout) is opened as a `ctbuild.cache.Store`, which creates, stamps or refuses it.

Whatever is in the directory, a lookup returns or misses, never hangs or raises: an index or
value file that is not a regular file (a FIFO would block the call for ever), a value file of
another size than its row records (read whole, ``truncate -s 1G`` would take a GB) and a
file or directory this user may not read are misses, each logged once (the last as the
permission problem it is, with its owner and what to do: never as damage).

The layout constants below mirror ``cache/layout.py`` and ``cache/entries.py`` (a test checks
they agree): the ``cache`` package stays independent of ctbuild.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from ctbuild.cache.user_files import (
    FileTooLargeError,
    NotAFileError,
    first_denied,
    index_files,
    permission_problem,
    read_regular,
    refuse_odd,
)

from .kernel_store import KernelStore

log = logging.getLogger("ctbuild.runtime")

LAYOUT_FILE = "ctbuild-cache.json"
LAYOUT = {"format": "ctbuild-cache", "version": 1}
DBNAME = "cache.db"
SAFE_MODES = (1, 2, 3)  # diskcache's raw, binary, text; 4 is a pickle
COMPILE_REQUIRED = ("digest", "symbol")
TUNING_REQUIRED = ("kernel", "arch", "compile_key")
READ_TIMEOUT_S = 5.0
MAX_LAYOUT_BYTES = 4096
#: The columns a row's value is read from (`CacheReader._value`).
STORED = "mode, filename, value, size"


class ServedCubin:
    """A compile entry's verified CUBIN (what `KernelStore.get_compile` returns)."""
    __slots__ = ("cubin", "symbol", "meta")

    def __init__(self, cubin: bytes, symbol: str, meta: dict[str, Any]) -> None:
        self.cubin, self.symbol, self.meta = cubin, symbol, meta


class CacheReader:
    """A `KernelStore` reading one cache directory directly (see the module doc)."""

    def __init__(self, path: Path, writable: bool) -> None:
        self._path, self._writable = path, writable
        self.on_damage: Callable[[str], None] | None = None
        self._damage: str | None = None
        self._lock = threading.Lock()
        self._cons: dict[str, tuple[sqlite3.Connection, str]] = {}
        self._verified: set[str] = set()
        #: The blob `_blob` read and verified last, (digest, bytes): resolving a call checks
        #: the CUBIN it will serve (`has_compile`), and its launch then reads it
        #: (`get_compile`); the second read is this one. One blob: bounded memory.
        self._last_blob: tuple[str, bytes] | None = None
        self._reported: set[tuple[str, str]] = set()
        self._writer: KernelStore | None = None
        #: What `preload` read ahead: tuning records and verified CUBINs by key.
        self.held_tuning: dict[str, dict[str, Any]] = {}
        self.held_cubins: dict[str, ServedCubin] = {}

    @classmethod
    def open(cls, path: Path) -> CacheReader | None:
        """A reader of the cache at ``path``, or None where `ctbuild.cache.Store` must open it (no
        marker yet, an unreadable one or another layout: the store says what to do)."""
        try:
            found = json.loads(read_regular(path / LAYOUT_FILE, limit=MAX_LAYOUT_BYTES,
                                            what="a layout marker"))
        except (OSError, ValueError, NotAFileError, FileTooLargeError):
            return None
        if found != LAYOUT:
            return None
        try:
            writable = all(os.access(p, os.W_OK) or not _exists(p) for p in (
                path, *(path / ns for ns in ("blobs", "compile", "tuning")),
                *(path / ns / DBNAME for ns in ("blobs", "compile", "tuning"))))
        except PermissionError:  # a namespace it may not look into: read what it can
            writable = False
        return cls(path, writable)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def readonly(self) -> bool:
        return not self._writable

    @property
    def damage(self) -> str | None:
        return self._damage

    # -- what serving reads ----------------------------------------------------------------
    def toolchains(self) -> dict[str, dict[str, Any]]:
        out = {}
        for key, *stored in self._rows("toolchains", f"SELECT key, {STORED} FROM Cache "
                                       "WHERE raw = 1", ()):
            entry = self._entry("toolchains", key, stored, ())
            if entry is not None:
                out[key] = entry
        return out

    def get_tuning(self, key: str) -> dict[str, Any] | None:
        held = self.held_tuning.get(key)
        return held if held is not None else self._get("tuning", key, TUNING_REQUIRED)

    def tuning_records(self) -> list[tuple[str, dict[str, Any]]]:
        """Every readable tuning record (what `preload` chooses from)."""
        out = []
        for key, *stored in self._rows("tuning", f"SELECT key, {STORED} FROM Cache "
                                       "WHERE raw = 1", ()):
            entry = self._entry("tuning", key, stored, TUNING_REQUIRED)
            if entry is not None:
                out.append((key, entry))
        return out

    def has_compile(self, key: str) -> bool:
        if key in self.held_cubins:
            return True
        rows = self._rows("compile", "SELECT tag FROM Cache WHERE key = ? AND raw = 1", (key,))
        if not rows or not isinstance(rows[0][0], str):
            return False
        digest = rows[0][0]
        return digest in self._verified or self._blob(digest) is not None

    def get_compile(self, key: str) -> ServedCubin | None:
        held = self.held_cubins.pop(key, None)  # served once: cuTile keeps its module
        if held is not None:
            return held
        entry = self._get("compile", key, COMPILE_REQUIRED)
        if entry is None:
            return None
        cubin = self._blob(entry["digest"])
        if cubin is None:
            self._report(("missing", key), "compile entry %s names blob %s, which is missing or "
                         "bad; treated as a miss", key, entry["digest"])
            return None
        return ServedCubin(cubin, entry["symbol"], entry)

    def put_compile(self, key: str, cubin: bytes, *, symbol: str, meta: dict[str, Any]) -> str:
        """A JIT write-back: through a `ctbuild.cache.Store` (the writer's invariants live there)."""
        return self.writer().put_compile(key, cubin, symbol=symbol, meta=meta)

    def writer(self) -> KernelStore:
        """The `ctbuild.cache.Store` of this directory, opened on first need."""
        if self._writer is None:
            from ctbuild.cache import Store
            self._writer = Store(self._path, on_damage=self.on_damage)
        return self._writer

    # -- internals ---------------------------------------------------------------------------
    def _get(self, ns: str, key: str, required: tuple[str, ...]) -> dict[str, Any] | None:
        rows = self._rows(ns, f"SELECT {STORED} FROM Cache WHERE key = ? AND raw = 1", (key,))
        return self._entry(ns, key, rows[0], required) if rows else None

    def _entry(self, ns: str, key: str, stored: Any, required: tuple[str, ...]
               ) -> dict[str, Any] | None:
        """A stored JSON entry, checked as `ctbuild.cache.entries.entry_problem` checks it."""
        text = self._value(ns, key, *stored)
        if text is None:
            return None
        entry, problem = _json_object(text)
        if entry is not None:
            missing = [f for f in required if not isinstance(entry.get(f), str) or not entry[f]]
            if missing:
                problem = f"fields {missing} missing or not str"
            elif "digest" in required and not _is_digest(entry["digest"]):
                problem = f"digest {entry['digest']!r} is malformed"
        if problem is not None:
            self._report((ns, key), "refusing %s entry %r: %s (treated as a miss; `ctbuild "
                         "cache verify` lists it)", ns, key, problem)
            return None
        return entry

    def _value(self, ns: str, key: str, mode: Any, filename: Any, value: Any, size: Any
               ) -> bytes | str | None:
        """A row's value (the `STORED` columns); a value file is read only when it is a regular
        file of the size the row records (the writer records it), else the lookup misses."""
        if mode not in SAFE_MODES:
            self._report((ns, key), "refusing %s entry %r: stored in diskcache mode %s (pickle "
                         "or unknown; treated as a miss)", ns, key, mode)
            return None
        if mode == 1:
            return bytes(value) if isinstance(value, memoryview) else value
        path = self._path / ns / str(filename)
        try:
            data = read_regular(path, limit=size if isinstance(size, int) else 0,
                                what=f"the value of {ns} entry {key} (its recorded size)")
        except FileNotFoundError:
            return None  # removed (gc, quarantine) after the row was read
        except PermissionError:
            self._denied(path)
            return None
        except (NotAFileError, FileTooLargeError) as exc:
            self._report((ns, key), "%s: not the file the cache wrote; treated as a miss "
                         "(`ctbuild cache verify` lists it)", exc)
            return None
        except OSError as exc:
            self._damaged(f"cannot read {path}: {exc.strerror or exc}")
            return None
        try:
            return data.decode("utf-8") if mode == 3 else data
        except UnicodeDecodeError:
            self._report((ns, key), "%s is not UTF-8 text; treated as a miss", path)
            return None

    def _blob(self, digest: str) -> bytes | None:
        """The blob ``digest``, re-hashed (but the one verified last, `_last_blob`); None when
        absent or corrupt (quarantined by the store where it may write)."""
        if not _is_digest(digest):
            return None
        last = self._last_blob
        if last is not None and last[0] == digest:
            return last[1]
        rows = self._rows("blobs", f"SELECT {STORED} FROM Cache WHERE key = ? AND raw = 1",
                          (digest,))
        data = self._value("blobs", digest, *rows[0]) if rows else None
        if not isinstance(data, bytes):
            return None
        if xxhash.xxh3_128_hexdigest(data) != digest:
            self._verified.discard(digest)
            self._report(("digest", digest), "blob %s fails its digest check; treated as a miss",
                         digest)
            if self._writable:
                self._quarantine(digest)
            return None
        self._verified.add(digest)
        self._last_blob = (digest, data)
        return data

    def _quarantine(self, digest: str) -> None:
        """Let the store read a corrupt blob again: it quarantines it."""
        try:
            self.writer().get_blob(digest)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - quarantine is best effort
            log.debug("ctbuild: could not quarantine blob %s: %s", digest, exc)

    def _rows(self, ns: str, sql: str, params: tuple) -> list[tuple]:
        """Rows of one namespace's index; a read SQLite cannot complete is a miss, and the
        first one on a damaged index is reported (``damage``, ``on_damage``); an index this user
        may not read is a miss reported as the permission problem it is."""
        try:
            con = self._connection(ns)
            if con is None:
                return []
            with self._lock:
                return con.execute(sql, params).fetchall()
        except PermissionError as exc:  # a namespace directory this user may not search
            self._denied(Path(exc.filename or self._path / ns))
        except NotAFileError as exc:
            self._damaged(f"{exc} (the cache did not write it)")
        except sqlite3.Error as exc:
            if "no such table" in str(exc):
                return []
            denied = first_denied(index_files(self._path / ns / DBNAME))
            if denied is not None:
                self._denied(denied)
            else:
                self._damaged(f"cannot read {self._path / ns / DBNAME}: {exc}")
        return []

    def _connection(self, ns: str) -> sqlite3.Connection | None:
        """A read-only connection to one namespace's index, following writers' WAL: ``mode=ro``
        where a WAL exists or the directory is writable, else ``immutable=1`` (``mode=ro``
        would try to create ``-shm`` files). Raises `NotAFileError` where an index file is not a
        regular file (SQLite would block on a FIFO) and PermissionError where this user may not
        look into the namespace."""
        db = self._path / ns / DBNAME
        wal = Path(f"{db}-wal")
        mode = "mode=ro" if self._writable or _exists(wal) else "immutable=1"
        with self._lock:
            found = self._cons.get(ns)
            if found is not None and (found[1] == mode or mode == "immutable=1"):
                return found[0]
            if not _exists(db):
                return None
            for index in index_files(db):
                refuse_odd(index, what="a cache index")
            con = sqlite3.connect(f"{db.as_uri()}?{mode}", uri=True, timeout=READ_TIMEOUT_S,
                                  isolation_level=None, check_same_thread=False)
            if found is not None:
                found[0].close()
            self._cons[ns] = (con, mode)
            return con

    def _damaged(self, detail: str) -> None:
        if self._damage is None:
            self._damage = detail
            log.error("cache %s is damaged (%s): every lookup it breaks is a miss; repair: "
                      "`ctbuild cache verify --repair --cache %s`", self._path, detail, self._path)
            if self.on_damage is not None:
                self.on_damage(detail)

    def _denied(self, path: Path) -> None:
        """A file or directory this user may not read: a miss, warned about once per path."""
        if ("denied", str(path)) not in self._reported:
            self._reported.add(("denied", str(path)))
            log.warning("cache %s: %s; the lookups that need it are misses", self._path,
                        permission_problem(path))

    def _report(self, what: tuple[str, str], message: str, *args: object) -> None:
        if what not in self._reported:
            self._reported.add(what)
            log.error("cache %s: " + message, self._path, *args)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists (PermissionError where this user may not look: the caller
    decides what that means, as ``Path.exists`` would not say)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _json_object(text: bytes | str) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object ``text`` holds, None) or (None, why it holds none)."""
    if type(text) is not str:
        return None, "value is bytes, not JSON text"
    try:
        entry = json.loads(text)
    except ValueError as exc:
        return None, f"value is not a JSON object ({exc})"
    return (entry, None) if isinstance(entry, dict) else (None, "value is not a JSON object")


def _is_digest(text: object) -> bool:
    return isinstance(text, str) and len(text) == 32 and \
        all(c in "0123456789abcdef" for c in text)
