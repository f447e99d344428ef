"""One namespace of the cache: a diskcache directory, written through diskcache, read through our
own SQLite connection.

Why the split:

* Writes go through ``diskcache.Cache`` with :class:`SafeDisk`: it already solves the hard part of
  multi-process writing (value file written *before* its row commits, rows changed in SQLite
  transactions, WAL journal), so a reader sees a key wholly or not at all, and a writer killed
  mid-store leaves at most an unreferenced file.
* Reads never go through ``diskcache.Cache``: opening one creates the database and rewrites its
  Settings table — impossible (and wrong) on a read-only mount. Our reader opens the SQLite file with
  ``mode=rw`` when writable; on a read-only store with ``mode=ro`` while a writer's WAL is live, else
  ``immutable=1`` (``mode=ro`` would create ``-wal``/``-shm`` files wherever it can, e.g. as root).
* diskcache's own LRU policy takes the write lock on every ``get``; we update ``access_time``
  ourselves with one best-effort UPDATE, and only on lookups the caller wants counted.

Rows use diskcache's schema (``Cache`` table: key, raw, tag, size, store_time, access_time, mode,
filename, value); the ``tag`` column carries a compile entry's blob digest (indexed).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import diskcache
from diskcache.core import DBNAME

from .errors import (
    PERMISSION_HINT,
    CacheError,
    DamagedCacheError,
    PermissionDeniedError,
    ReadOnlyCacheError,
)
from .safe_disk import SafeDisk
from .user_files import first_denied, index_files

INLINE_LIMIT = 2**30  # JSON values stay inside their SQLite row: one row = one whole entry.
READ_TIMEOUT_S = 5.0  # busy wait of our connection (WAL readers rarely wait; access-time updates may).
WRITE_TIMEOUT_S = 60.0


class ByteStream(Protocol):
    """What a streamed value is read from: a binary file, or a wrapper hashing what passes."""

    def read(self, size: int = -1, /) -> bytes: ...


class Hasher(Protocol):
    """An incremental hash (``xxhash.xxh3_128()``, ``hashlib.sha256()``)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class HashingReader:
    """A `ByteStream` that hashes what is read through it: a streamed blob's digest is known
    once it is stored, without reading it twice."""

    def __init__(self, stream: ByteStream, hasher: Hasher) -> None:
        self._stream = stream
        self._hasher = hasher

    def read(self, size: int = -1, /) -> bytes:
        chunk = self._stream.read(size)
        self._hasher.update(chunk)
        return chunk

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


@dataclass(frozen=True)
class RowInfo:
    """A row's metadata without its value. ``key`` is None when the stored key is not plain text."""

    rowid: int
    key: str | None
    tag: str | None
    size: int
    store_time: float
    access_time: float
    filename: str | None


class Namespace:
    """A diskcache directory holding one kind of value: ``bytes`` (files) or JSON text (inline)."""

    def __init__(self, directory: Path, *, readonly: bool, inline: bool, tag_index: bool = False) -> None:
        self.directory = directory
        self.readonly = readonly
        self._db = directory / DBNAME
        min_file_size = INLINE_LIMIT if inline else 0
        self._disk = SafeDisk(str(directory), min_file_size=min_file_size)
        self._settings = {
            "statistics": 0,
            "eviction_policy": "none",  # eviction is the store's job: it knows which entries are tuned winners
            "cull_limit": 0,  # never cull inside diskcache's set()
            "size_limit": 2**62,
            "tag_index": int(tag_index),
            "disk_min_file_size": min_file_size,
        }
        self._writer: diskcache.Cache | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[int, sqlite3.Connection]] = []

    # -- connections -------------------------------------------------------------------------

    def _cache(self) -> diskcache.Cache:
        if self.readonly:
            raise ReadOnlyCacheError(f"{self.directory} is read-only")
        with self._lock:
            if self._writer is None:
                self._writer = self._open_writer()
            return self._writer

    def _open_writer(self) -> diskcache.Cache:
        """diskcache's writer, opened again while other writers refuse it, for up to
        `WRITE_TIMEOUT_S`. Opening it writes its settings rows in statements of their own
        (diskcache retries only its ``BEGIN IMMEDIATE``), and SQLite refuses such a statement at
        once, without waiting, when another writer commits between the statement's read and its
        write: with writers committing back to back, a process's first write failed so."""
        self._refuse_odd_files()
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while True:
            try:
                return diskcache.Cache(str(self.directory), timeout=WRITE_TIMEOUT_S, disk=SafeDisk,
                                       **self._settings)
            except sqlite3.OperationalError as exc:
                if not ("locked" in str(exc) or "busy" in str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def _con(self) -> sqlite3.Connection | None:
        """This thread's (and process's) read connection; None while the database does not exist.

        A read-only store reads ``immutable=1`` while no writer is live (no ``-wal`` file) and switches
        to ``mode=ro`` — which follows the writer's WAL — as soon as one appears: one stat per query.
        """
        pid = os.getpid()
        con = getattr(self._local, "con", None)
        if self.readonly:
            mode = "mode=ro" if Path(f"{self._db}-wal").exists() else "immutable=1"
            if con is not None and self._local.pid == pid and (self._local.mode == mode or mode == "immutable=1"):
                return con
        else:
            mode = "mode=rw"
            if con is not None and self._local.pid == pid:
                return con
        if con is not None and self._local.pid == pid:  # an immutable connection a writer has outdated
            with self._lock:
                self._connections.remove((pid, con))
            con.close()
            self._local.con = None
        if not os.path.lexists(self._db):
            return None
        self._refuse_odd_files()
        try:
            con = sqlite3.connect(
                f"{self._db.as_uri()}?{mode}", uri=True, timeout=READ_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )
            if not self.readonly:
                con.execute("PRAGMA synchronous = NORMAL")  # as diskcache's writers: WAL commits without fsync
        except sqlite3.Error as exc:
            self._raise_if_denied()
            raise DamagedCacheError(f"cannot open {self._db}: {exc}") from None
        self._local.pid, self._local.con, self._local.mode = pid, con, mode
        with self._lock:
            self._connections.append((pid, con))
        return con

    def _refuse_odd_files(self) -> None:
        """`DamagedCacheError` where the index or its ``-wal``/``-shm`` file exists and is not a
        regular file (a link to /dev/zero or elsewhere, a FIFO): SQLite would follow it, or block
        on it for ever, so none is opened."""
        for path in index_files(self._db):
            if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
                raise DamagedCacheError(f"{path} is not a regular file")

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        con = self._con()
        if con is None:
            return []
        try:
            return con.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # database file exists but its first writer has not created the table yet
            if "locked" in str(exc) or "busy" in str(exc):
                raise CacheError(f"cannot read {self._db}: {exc} (a writer holds it too long)") from None
            self._raise_if_denied()
            raise DamagedCacheError(f"cannot read {self._db}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise DamagedCacheError(f"cannot read {self._db}: {exc}") from None

    def _raise_if_denied(self) -> None:
        """Tell "this user may not read the index" (PermissionDeniedError) from damage: SQLite
        says "unable to open database file" for both."""
        if (path := first_denied(index_files(self._db))) is not None:
            raise PermissionDeniedError(denied(path))

    def quick_check(self) -> str | None:
        """What is wrong with the index (None: nothing): `layout_problem`, else what SQLite's
        ``PRAGMA quick_check`` finds.

        quick_check walks every page but skips the slow index-vs-table cross-check, so it costs
        about one read of the database file (the value files are not read).
        """
        problem = self.layout_problem()
        if problem is not None:
            return problem
        try:
            rows = self._query("PRAGMA quick_check")
        except DamagedCacheError as exc:
            return str(exc)
        found = [str(row[0]) for row in rows if row and row[0] != "ok"]
        return "; ".join(found[:3]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "") if found else None

    def layout_problem(self) -> str | None:
        """What is wrong with the namespace's files before SQLite is asked (None: nothing): a
        directory left by an interrupted rebuild, the namespace's path not a directory, or its
        index missing from a directory that holds files (a lost ``cache.db`` reads as an empty
        namespace, and a repair would then drop every entry that needs it). No index in an
        empty or absent directory is a namespace never written."""
        if left := self.asides():
            return f"an interrupted repair left {left[0]}"
        try:
            mode = os.lstat(self.directory).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(mode):
            return f"{self.directory} is not a directory"
        if os.path.lexists(self._db):
            return None
        try:
            with os.scandir(self.directory) as found:
                holds_files = any(found)
        except PermissionError:
            raise PermissionDeniedError(denied(self.directory)) from None
        return f"{self._db} is missing but {self.directory} holds files" if holds_files else None

    def asides(self) -> list[Path]:
        """What an interrupted index rebuild left beside the namespace (`aside_path`)."""
        return sorted(self.directory.parent.glob(f".{self.directory.name}.damaged.*"))

    def aside_path(self) -> Path:
        """Where a rebuild moves the damaged namespace before copying what is intact back."""
        return self.directory.with_name(f".{self.directory.name}.damaged.{time.time_ns()}")

    def readable_rows(self) -> list[tuple]:
        """Every row that can still be read from a damaged index, one rowid at a time:
        (key, raw, tag, mode, filename, value). Rows on a broken page are skipped."""
        try:
            top = self._query("SELECT MAX(rowid) FROM Cache")[0][0] or 0
        except (DamagedCacheError, IndexError):
            top = 0
        found = []
        for rowid in range(1, top + 1):
            try:
                found += self._query("SELECT key, raw, tag, mode, filename, value FROM Cache WHERE rowid = ?", (rowid,))
            except DamagedCacheError:
                continue
        return found

    def close(self) -> None:
        """Release connections opened by this process; the namespace reopens them on next use."""
        pid = os.getpid()
        with self._lock:
            mine = [con for owner, con in self._connections if owner == pid]
            self._connections = []
            writer, self._writer = self._writer, None
        for con in mine:
            con.close()
        self._local = threading.local()
        if writer is not None:
            writer.close()

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[RowInfo, bytes | str] | None:
        """The row and value of ``key``, or None. Raises UnsafeValueError for a pickled value."""
        rows = self._query(
            "SELECT rowid, tag, size, store_time, access_time, mode, filename, value"
            " FROM Cache WHERE key = ? AND raw = 1",
            (key,),
        )
        if not rows:
            return None
        rowid, tag, size, store_time, access_time, mode, filename, value = rows[0]
        data = self._fetch(mode, filename, value)
        if data is None:
            return None
        return RowInfo(rowid, key, tag, size, store_time, access_time, filename), data

    def value_of(self, info: RowInfo) -> bytes | str | None:
        """The value of a row listed by :meth:`rows` (None if it has gone since)."""
        rows = self._query("SELECT mode, filename, value FROM Cache WHERE rowid = ?", (info.rowid,))
        if not rows:
            return None
        return self._fetch(*rows[0])

    def _fetch(self, mode: int, filename: str | None, value: bytes | str | None) -> bytes | str | None:
        """A row's value; None when its file was removed (gc, quarantine) after the row was read.
        A file that exists but cannot be read is an error, never "absent": callers that remove
        what is absent must not remove it."""
        try:
            if filename is not None:  # never follow a link or open a FIFO or device: it may block or leak
                kind = file_kind(os.lstat(self.directory / filename).st_mode)
                if kind != "regular file":
                    raise DamagedCacheError(f"{self.directory / filename} is a {kind}, not a regular file")
            return self._disk.fetch(mode, filename, value, False)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise PermissionDeniedError(denied(Path(exc.filename or self.directory))) from None
        except OSError as exc:
            raise DamagedCacheError(f"cannot read {exc.filename or filename}: {exc.strerror or exc}") from None

    def contains(self, key: str) -> bool:
        return bool(self._query("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)))

    def tag_of(self, key: str) -> tuple[bool, str | None]:
        """(whether ``key`` exists, its tag) — one indexed lookup, no value read."""
        rows = self._query("SELECT tag FROM Cache WHERE key = ? AND raw = 1", (key,))
        return (True, rows[0][0]) if rows else (False, None)

    def is_tagged(self, tag: str) -> bool:
        return bool(self._query("SELECT 1 FROM Cache WHERE tag = ? LIMIT 1", (tag,)))

    def rows(self) -> list[RowInfo]:
        """Metadata of every row (a snapshot list, so callers may write while walking it)."""
        return [
            RowInfo(rowid, key if raw == 1 and type(key) is str else None, tag, size, store_time, access_time, filename)
            for rowid, key, raw, tag, size, store_time, access_time, filename in self._query(
                "SELECT rowid, key, raw, tag, size, store_time, access_time, filename FROM Cache ORDER BY rowid"
            )
        ]

    def count(self) -> int:
        rows = self._query("SELECT COUNT(*) FROM Cache")
        return rows[0][0] if rows else 0

    def total_size(self) -> int:
        rows = self._query("SELECT COALESCE(SUM(size), 0) FROM Cache")
        return rows[0][0] if rows else 0

    def stray_files(self, older_than: float) -> list[Path]:
        """Value files no row refers to, last modified before ``older_than`` (epoch seconds).

        They are what a writer killed between writing a value file and committing its row leaves;
        the age limit spares files whose writer is about to commit.
        """
        if (problem := self.layout_problem()) is not None:  # a lost index refers to no file: all would look stray
            raise DamagedCacheError(f"cannot tell stray files in {self.directory} from entries: {problem}; "
                                    f"run `ctbuild cache verify --repair --cache {self.directory.parent}`")
        referenced = {row.filename for row in self.rows() if row.filename}
        stray = []
        for path in self.directory.glob("??/??/*.val"):
            name = str(path.relative_to(self.directory))
            try:
                if name not in referenced and path.stat().st_mtime < older_than:
                    stray.append(path)
            except FileNotFoundError:
                continue
        return stray

    # -- writes ------------------------------------------------------------------------------

    def set(self, key: str, value: bytes | str, *, tag: str | None = None) -> None:
        with self._writing():
            self._cache().set(key, value, tag=tag, retry=True)

    def add(self, key: str, value: bytes | str, *, tag: str | None = None) -> bool:
        """Insert unless present (atomic across processes); never replaces, so readers never race a replacement."""
        with self._writing():
            return self._cache().add(key, value, tag=tag, retry=True)

    def ensure_index(self) -> None:
        """Create the (empty) index where there is none: a rebuilt namespace has one even when
        nothing was recoverable."""
        with self._writing():
            self._cache()

    def add_stream(self, key: str, stream: ByteStream) -> bool:
        """Like :meth:`add` for a value read from ``stream`` in chunks (never whole in memory)."""
        with self._writing():
            return self._cache().add(key, stream, read=True, retry=True)

    def delete(self, key: str) -> bool:
        with self._writing():
            return self._cache().delete(key, retry=True)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A damaged index fails a write with one CacheError that says how to repair it."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
                raise CacheError(f"cannot write {self._db}: {exc} "
                                 f"(another writer held it for {WRITE_TIMEOUT_S:.0f} s)") from None
            if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
                raise CacheError(f"cannot write {self._db}: {exc}; "
                                 "free space and retry (the cache is intact)") from None
            raise DamagedCacheError(f"cannot write {self._db}: {exc}; run `ctbuild cache verify --repair --cache "
                                    f"{self.directory.parent}`") from None

    def move_out(self, key: str, dest: Path) -> bool:
        """Move ``key``'s value file to ``dest`` (same filesystem), then drop its row; False when
        there is no such file. The bytes are kept as they are on disk, not rewritten."""
        rows = self._query("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,))
        if not rows or not rows[0][0]:
            return False
        try:
            os.replace(self.directory / rows[0][0], dest)
        except FileNotFoundError:
            return False
        self.delete(key)
        return True

    def delete_row(self, rowid: int) -> bool:
        """Delete a row by rowid: the only handle on a row whose key is pickled or not text."""
        if self.readonly:
            raise ReadOnlyCacheError(f"{self.directory} is read-only")
        rows = self._query("SELECT filename FROM Cache WHERE rowid = ?", (rowid,))
        if not rows:
            return False
        con = self._con()
        assert con is not None  # the query above found the row
        try:
            deleted = con.execute("DELETE FROM Cache WHERE rowid = ?", (rowid,)).rowcount > 0
        except sqlite3.Error as exc:
            raise DamagedCacheError(f"cannot delete row {rowid} of {self._db}: {exc}") from None
        if deleted and rows[0][0]:
            self.remove_file(self.directory / rows[0][0])
        return deleted

    def touch(self, rowid: int) -> None:
        """Record an access for LRU eviction. Best effort: a busy database only skips the update."""
        con = self._con()
        if con is None or self.readonly:
            return
        try:
            con.execute("UPDATE Cache SET access_time = ? WHERE rowid = ?", (time.time(), rowid))
        except sqlite3.Error:
            pass  # busy, or a damaged page: the read itself already succeeded

    def remove_file(self, path: Path) -> None:
        if self.readonly:
            raise ReadOnlyCacheError(f"{self.directory} is read-only")
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def file_kind(mode: int) -> str:
    """What an ``lstat`` mode is, in words ("regular file", "directory", "symlink", ...)."""
    kinds = ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"),
             (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "device")


def denied(path: Path) -> str:
    """A permission problem in words: the path this user may not read, and the fix. The path
    named is the outermost one blocking it (a directory at mode 000 blocks every file below)."""
    blocker = path
    for parent in reversed(path.parents):
        if parent.exists() and not os.access(parent, os.R_OK | os.X_OK):
            blocker = parent
            break
    return (f"{blocker}: {PERMISSION_HINT} (not damage: `chown -R` it to the user running ctbuild, "
            f"or `chmod -R u+rwX {blocker}`)")
