"""``verify``: check every index, re-hash every blob and check every entry, reporting (and
optionally repairing) problems.

Problems are dicts ``{"kind", "namespace", "key", "detail"}``. Kinds:
``damaged_index`` (a namespace's SQLite file fails its integrity check or cannot be read),
``bad_key`` (pickled or non-text key), ``unsafe_value`` (pickled value), ``bad_entry`` (not the
expected JSON), ``corrupt_blob`` (bytes do not hash to their digest), ``missing_file`` (row without its
value file), ``missing_blob`` (compile entry whose blob is gone or corrupt), ``bad_tag`` (entry's index
tag is not its digest), ``missing_winner`` (tuning record whose winning compile entry is gone),
``permission_denied`` (a file or index this user may not read), ``unreadable_file`` (a value
file the OS cannot read, e.g. an I/O error), ``bad_file`` (a blob's value file is not a regular
file: quarantined by a repair, never read) and ``interrupted_repair`` (a rebuild was interrupted:
its aside directory is recovered first).

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
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diskcache.core import DBNAME, MODE_RAW

from .bundle_limits import MAX_BLOB_SIZE
from .digest import digest_of, is_digest
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, entry_problem
from .errors import (
    CacheError,
    DamagedCacheError,
    PermissionDeniedError,
    UnsafeValueError,
)
from .layout import QUARANTINE_DIR
from .namespace import Namespace, RowInfo, denied, file_kind

if TYPE_CHECKING:
    from .store import Store


# A namespace's readable entries: key -> (entry, its JSON text, its index tag).
_Entries = dict[str, tuple[dict[str, Any], str, str | None]]


def verify(store: Store, *, repair: bool) -> dict[str, Any]:
    """Check every namespace, in an order where each step can use what the earlier ones found
    (a compile entry is judged by its blob's verdict); see the module docstring for the rest."""
    walk = _Verification(store, repair)
    walk.check_indexes()
    blobs = walk.check_blobs()
    entries = walk.check_compile_entries(blobs)
    walk.check_tuning_records(entries)
    walk.load(store.namespaces.toolchains, ())  # toolchain profiles: each row a readable entry
    return walk.result()


class _BlobStates:
    """Each blob key's verdict, which the compile entries pointing at it are judged by."""

    def __init__(self) -> None:
        self.good: set[str] = set()
        self.corrupt: set[str] = set()
        self.unreadable: set[str] = set()


class _Verification:
    """One ``verify`` walk: the problems found, the counts checked and what was repaired.

    The namespaces are checked in order (indexes, blobs, compile entries, tuning records,
    toolchains), each step reading what the steps before it found; a namespace whose index could
    not be read is skipped by every later step.
    """

    def __init__(self, store: Store, repair: bool) -> None:
        self.store = store
        self.repair = repair
        self.problems: list[dict[str, str]] = []
        self.checked: dict[str, int] = {}
        self.repaired = 0
        self.rebuilt: dict[str, dict[str, int]] = {}
        self.unreadable: set[str] = set()

    def problem(self, kind: str, namespace: str, key: str, detail: str) -> None:
        """Record a problem that no repair deletes a row for."""
        self.problems.append({"kind": kind, "namespace": namespace, "key": key, "detail": detail})

    def report(self, kind: str, namespace: Namespace, key: str, detail: str,
               rowid: int | None = None) -> None:
        """Record a problem whose repair is deleting its row (by rowid when the key is unusable)."""
        self.problem(kind, namespace.directory.name, key, detail)
        if self.repair:
            self.repaired += namespace.delete(key) if rowid is None else namespace.delete_row(rowid)

    def unreadable_value(self, namespace: Namespace, key: str, exc: CacheError) -> None:
        """Reported, never repaired: the bytes may be intact."""
        kind = "permission_denied" if isinstance(exc, PermissionDeniedError) else "unreadable_file"
        self.problem(kind, namespace.directory.name, key, str(exc))

    def check_indexes(self) -> None:
        """Check every namespace's SQLite index, rebuilding a damaged one when repairing (after
        finishing any rebuild that was interrupted)."""
        for namespace in self.store.namespaces.all():
            name = namespace.directory.name
            try:
                if self.repair:
                    self.finish_rebuilds(namespace)
                detail = namespace.quick_check()
            except PermissionDeniedError as exc:
                self.unreadable.add(name)
                self.unreadable_value(namespace, str(namespace.directory / DBNAME), exc)
                continue
            if detail is None:
                continue
            self.problem("damaged_index", name, str(namespace.directory / DBNAME), detail)
            if not self.repair:
                self.unreadable.add(name)
                continue
            try:
                self.add_rebuilt(name, rebuild_index(self.store, namespace))
                self.repaired += 1
            except PermissionDeniedError as exc:  # a value file it would have to read: nothing moved
                self.unreadable.add(name)
                self.unreadable_value(namespace, str(namespace.directory), exc)

    def finish_rebuilds(self, namespace: Namespace) -> None:
        """Recover what a rebuild interrupted (Ctrl-C, a crash) left aside: its intact entries
        are still there, and nothing else would ever bring them back."""
        for aside in namespace.asides():
            self.problem("interrupted_repair", namespace.directory.name, str(aside),
                         "a rebuild of this index was interrupted; its intact entries are recovered")
            self.add_rebuilt(namespace.directory.name, recover(self.store, namespace, aside))
            self.repaired += 1

    def add_rebuilt(self, name: str, counts: dict[str, int]) -> None:
        """Count what a rebuild (or finishing one) kept and lost."""
        total = self.rebuilt.setdefault(name, {"kept": 0, "lost_rows": 0})
        for what, n in counts.items():
            total[what] += n

    def rows(self, namespace: Namespace) -> list[RowInfo]:
        """A namespace's rows, or none when its index cannot be read (reported, then skipped)."""
        if namespace.directory.name in self.unreadable:
            return []
        try:
            return namespace.rows()
        except PermissionDeniedError as exc:
            self.unreadable.add(namespace.directory.name)
            self.unreadable_value(namespace, str(namespace.directory / DBNAME), exc)
            return []
        except DamagedCacheError as exc:  # damage the quick check did not see
            self.unreadable.add(namespace.directory.name)
            self.problem("damaged_index", namespace.directory.name,
                         str(namespace.directory / DBNAME), str(exc))
            return []

    def load(self, namespace: Namespace, required: tuple[str, ...]) -> _Entries:
        """Readable entries of a namespace as key -> (entry, JSON text, tag), reporting the
        unreadable ones."""
        good: _Entries = {}
        found = self.rows(namespace)
        self.checked[namespace.directory.name] = len(found)
        for info in found:
            if info.key is None:
                self.report("bad_key", namespace, f"rowid {info.rowid}", "key is pickled or not text",
                            rowid=info.rowid)
                continue
            try:
                value = namespace.value_of(info)
            except UnsafeValueError as exc:
                self.report("unsafe_value", namespace, info.key, str(exc))
                continue
            except (PermissionDeniedError, DamagedCacheError) as exc:
                self.unreadable_value(namespace, info.key, exc)
                continue
            if value is None:
                continue  # removed while we walked
            why = entry_problem(value, required)
            if why is not None:
                self.report("bad_entry", namespace, info.key, why)
                continue
            assert isinstance(value, str)  # entry_problem refuses anything but JSON text
            good[info.key] = (json.loads(value), value, info.tag)
        return good

    def check_blobs(self) -> _BlobStates:
        """Re-hash every blob, quarantining the corrupt ones when repairing."""
        blobs = self.store.namespaces.blobs
        states = _BlobStates()
        blob_rows = self.rows(blobs)
        self.checked["blobs"] = len(blob_rows)
        for info in blob_rows:
            if info.key is None or not is_digest(info.key):
                self.report("bad_key", blobs, info.key or f"rowid {info.rowid}",
                            "blob key is not a digest", rowid=info.rowid)
                continue
            try:
                kind = _kind_of(blobs, info)
                data = blobs.value_of(info) if kind == "regular file" else None
            except UnsafeValueError as exc:
                self.report("unsafe_value", blobs, info.key, str(exc))
                continue
            except (PermissionDeniedError, DamagedCacheError) as exc:
                states.unreadable.add(info.key)
                self.unreadable_value(blobs, info.key, exc)
                continue
            if kind not in ("regular file", None):  # never read: a FIFO blocks, a link leads elsewhere
                states.corrupt.add(info.key)
                self.problem("bad_file", "blobs", info.key, f"value file {info.filename} is a {kind}")
                if self.repair:
                    (self.store.path / QUARANTINE_DIR).mkdir(exist_ok=True)
                    blobs.move_out(info.key, self.store.path / QUARANTINE_DIR / f"{info.key}.{time.time_ns()}.bad")
                    self.repaired += 1
                continue
            if data is None:
                if blobs.contains(info.key):
                    self.report("missing_file", blobs, info.key,
                                f"value file {info.filename} is missing")
                continue
            if type(data) is not bytes or digest_of(data) != info.key:
                states.corrupt.add(info.key)
                self.problem("corrupt_blob", "blobs", info.key,
                             f"{len(data)} bytes do not hash to their digest")
                if self.repair:
                    raw = data.encode() if isinstance(data, str) else data
                    self.store.quarantine_blob(info.key, raw)
                    self.repaired += 1
                continue
            states.good.add(info.key)
        return states

    def check_compile_entries(self, blobs: _BlobStates) -> _Entries:
        """Check each compile entry's blob and tag, retagging when repairing; returns the
        readable entries, which the tuning records' winners are looked up in."""
        compile_ns = self.store.namespaces.compile
        entries = self.load(compile_ns, COMPILE_REQUIRED)
        for key, (entry, text, tag) in entries.items():
            digest = entry["digest"]
            if digest in blobs.unreadable or "blobs" in self.unreadable:
                continue  # its blob is reported; the entry may well be fine
            if digest in blobs.corrupt or (digest not in blobs.good
                                           and self.store.get_blob(digest) is None):
                state = "corrupt" if digest in blobs.corrupt else "missing"
                self.report("missing_blob", compile_ns, key, f"blob {digest} is {state}")
            elif tag != digest:
                self.problem("bad_tag", "compile", key, f"tag {tag!r} != digest {digest}")
                if self.repair:
                    compile_ns.set(key, text, tag=digest)
                    self.repaired += 1
        return entries

    def check_tuning_records(self, entries: _Entries) -> None:
        """Check that each tuning record's winning compile entry exists."""
        tuning_ns = self.store.namespaces.tuning
        tuning = self.load(tuning_ns, TUNING_REQUIRED)
        for key, (record, _, _) in tuning.items():
            winner = record["compile_key"]
            if "compile" in self.unreadable:
                break  # whether its winner exists cannot be told
            if winner not in entries and not self.store.has_compile(winner):
                self.report("missing_winner", tuning_ns, key,
                            f"winning compile entry {winner!r} is missing")

    def result(self) -> dict[str, Any]:
        """The walk's answer: ok, the problems, the counts checked and, when repairing, what was
        repaired and rebuilt."""
        result: dict[str, Any] = {"ok": not self.problems, "problems": self.problems,
                                  "checked": self.checked}
        if self.repair:
            result["repaired"] = self.repaired
            result["rebuilt"] = self.rebuilt
        return result


def rebuild_index(store: Store, namespace: Namespace) -> dict[str, int]:
    """Replace a damaged namespace by a fresh one holding what is still readable.

    The namespace's directory is moved aside in one rename, then :func:`recover` copies what is
    intact back. An interruption at any point leaves every intact entry either in the namespace
    or in the aside directory, which the next repair recovers first (`Namespace.asides`).
    Returns counts of what was kept and lost.
    """
    directory = namespace.directory
    _check_readable(directory)
    namespace.close()
    aside = namespace.aside_path()
    try:
        directory.rename(aside)
    except OSError as exc:
        raise CacheError(f"cannot move the damaged index {directory} aside ({exc.strerror}): stop every process "
                         f"using the cache, delete {directory / DBNAME}* by hand, then re-run precompile") from None
    return recover(store, namespace, aside)


def recover(store: Store, namespace: Namespace, aside: Path) -> dict[str, int]:
    """Copy what is intact in ``aside`` (the namespace's old directory) into the namespace, keep
    its ``cache.db`` in ``quarantine/`` and remove the rest.

    Inline rows (JSON entries) are copied row by row, skipping rows on broken pages; the blob
    namespace is rebuilt from its value files, each re-hashed and stored under its digest, so every
    intact CUBIN survives even when its row was lost. Entries are added, never replaced (a newer
    one written since stays), and ``aside`` is removed last, so running this again after an
    interruption finishes the job. Anything but a directory at ``aside`` (a file where the
    namespace's directory was) is kept in ``quarantine/`` as it is.
    """
    quarantine = store.path / QUARANTINE_DIR
    quarantine.mkdir(exist_ok=True)
    name = namespace.directory.name
    if not stat.S_ISDIR(os.lstat(aside).st_mode):
        os.replace(aside, quarantine / f"{name}.{time.time_ns()}.not-a-directory")
        namespace.ensure_index()
        return {"kept": 0, "lost_rows": 0}
    blobs = namespace is store.namespaces.blobs
    old = Namespace(aside, readonly=False, inline=not blobs)
    rows = old.readable_rows()
    old.close()
    kept = lost = 0
    if blobs:
        for path in _value_files(aside):
            data = _read_value_file(path)
            if data:  # an empty file is no CUBIN
                namespace.add(digest_of(data), data)
                kept += 1
        lost = max(len(rows) - kept, 0)
    else:
        for key, raw, tag, mode, _filename, value in rows:
            if raw == 1 and type(key) is str and mode == MODE_RAW and type(value) is str:
                namespace.add(key, value, tag=tag)
                kept += 1
            else:  # a pickled key or value, or a value file: never valid in an inline namespace
                lost += 1
    namespace.ensure_index()
    if os.path.lexists(aside / DBNAME):
        os.replace(aside / DBNAME, quarantine / f"{name}.{time.time_ns()}.{DBNAME}")
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        raise CacheError(f"recovered {kept} entries of {aside}, but cannot remove it ({exc.strerror}): "
                         "delete it by hand") from None
    return {"kept": kept, "lost_rows": lost}


def _value_files(directory: Path) -> list[Path]:
    """The ``ab/cd/*.val`` files below ``directory``, through real directories only (a link
    named ``ab`` may lead anywhere)."""
    def subdirs(parent: Path) -> list[Path]:
        with os.scandir(parent) as entries:
            return [Path(e.path) for e in entries if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]

    try:
        return sorted(Path(f.path) for first in subdirs(directory) for second in subdirs(first)
                      for f in os.scandir(second) if f.name.endswith(".val"))
    except PermissionError as exc:
        raise PermissionDeniedError(denied(Path(exc.filename or directory))) from None


def _read_value_file(path: Path) -> bytes | None:
    """A value file's bytes, or None when it is no candidate CUBIN: not a regular file (a link,
    a FIFO, a device is never opened, let alone followed) or larger than any blob may be."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except PermissionError:
        raise PermissionDeniedError(denied(path)) from None
    except OSError:  # ELOOP: a symlink; gone since the listing
        return None
    with os.fdopen(fd, "rb") as stream:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BLOB_SIZE:
            return None
        data = stream.read(MAX_BLOB_SIZE + 1)
    return data if len(data) <= MAX_BLOB_SIZE else None


def _kind_of(namespace: Namespace, info: RowInfo) -> str | None:
    """What a row's value file is, from one ``lstat`` (nothing is read): "regular file" where it
    is one of the size its row records, else what it is ("directory", ..., "file of N bytes
    where its row records M": not what the cache wrote); None: no file, or gone."""
    if info.filename is None:
        return None
    path = namespace.directory / info.filename
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise PermissionDeniedError(denied(path)) from None
    kind = file_kind(found.st_mode)
    if kind == "regular file" and found.st_size != info.size:
        return f"file of {found.st_size} bytes where its row records {info.size}"
    return kind


def _check_readable(directory: Path) -> None:
    """Raise PermissionDeniedError unless every directory below ``directory`` can be listed and
    every regular file in it opened: a rebuild moves the old directory aside and removes what is
    left. Only regular files are opened, never through a link (a FIFO would block)."""
    def refuse(exc: OSError) -> None:
        if isinstance(exc, PermissionError):  # else nothing to list (no directory there): nothing to lose
            raise PermissionDeniedError(denied(Path(exc.filename or directory))) from None

    for root, _, files in os.walk(directory, onerror=refuse):
        for name in files:
            path = os.path.join(root, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                refuse(exc)
