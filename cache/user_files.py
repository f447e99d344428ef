"""Files a user named (a report, the ledger, a bundle, a key), and the cache's own files:
written whole or not at all, never in place of something that is not a file; read only when
they are regular files, and never beyond a size limit.

One rule for every such writer (``precompile --report``, ``tune --report``, ``CTBUILD_LEDGER``,
``cache export``, ``cache keygen``):

- a path that does not exist, or a regular file: the bytes go to a temporary file beside it,
  renamed over it once complete, so a reader never sees half a file and a killed process
  leaves the old file or none. A replaced file keeps its permission bits.
- a symlink: followed to its final target, to which the same rule applies; the link stays a
  link (a dangling link's target is created).
- anything else (a character or block device such as ``/dev/null``, a FIFO, a socket, a
  directory): refused in one line naming the path, before anything is written. Renaming over a
  device node would replace it with a regular file (as root, ``/dev/null`` itself), and writing
  into a FIFO blocks until someone reads it; a report is a file, so ask for one.

Reading (`read_regular`, `open_regular`: a ledger, a key, a record file, a layout marker,
every cache value file) follows the same idea: a FIFO, device, socket or directory is refused
before a byte is read (reading a FIFO blocks until someone writes it; ``/dev/zero`` never ends),
and so is a file above the reader's limit (a ``truncate -s 1G`` blob would otherwise be read
whole into memory). Refusals are `NotAFileError` and `FileTooLargeError`, one line naming the
path; an OS error (absent, permission denied) is raised as the `OSError` it is.

The cache package holds it because ``ctbuild.cache`` may not import the rest of ctbuild, and
both sides write such files; importing it loads neither the store nor diskcache (the serving
process writes its ledger through it).
"""
from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import CacheError

#: A new file's permission bits before the umask (``open()``'s default); keys pass 0o600.
NEW_FILE_MODE = 0o666
KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotAFileError(CacheError):
    """The path names something other than a regular file (or a link to one): not written or read."""


class FileTooLargeError(CacheError):
    """A file is larger than what its reader takes: not read."""


def kind_of(info: os.stat_result) -> str:
    """What a non-regular file is, in words ("a FIFO")."""
    return next((name for test, name in KINDS if test(info.st_mode)), "not a regular file")


def file_target(path: str | os.PathLike[str]) -> tuple[Path, os.stat_result | None]:
    """The file a write to ``path`` replaces (``path``, or a link's final target) and its stat
    (None: it does not exist yet); raises NotAFileError for anything but a regular file."""
    given = Path(path)
    target = Path(os.path.realpath(given))
    via = f" (a link to {target})" if str(target) != os.path.abspath(given) else ""
    try:  # the path as given: the kernel follows /proc/self/fd/N to a pipe, realpath cannot
        info = os.stat(given)
    except FileNotFoundError:
        return target, None
    except OSError as exc:  # a link loop, a parent that is not a directory, no permission
        raise NotAFileError(f"{given}{via}: cannot tell what it is ({exc.strerror}): "
                            "give the path of a regular file") from None
    if not stat.S_ISREG(info.st_mode):
        raise NotAFileError(f"{given}{via} is {kind_of(info)}, not a regular file: ctbuild writes only "
                            "regular files; give the path of one (or of a new file)")
    return target, info


@contextmanager
def replacing(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[IO[bytes]]:
    """A binary stream whose bytes replace ``path`` (the module's rule) when the block ends
    without an error; an error leaves ``path`` as it was. ``mode``: the file's permission bits
    (default: a replaced file's own, else ``NEW_FILE_MODE`` less the umask)."""
    target, info = file_target(path)
    tmp = target.with_name(f".{target.name}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     NEW_FILE_MODE if mode is None else mode)
    except OSError as exc:  # named by the path asked for, not the temporary name
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            if mode is None and info is not None:
                os.fchmod(stream.fileno(), stat.S_IMODE(info.st_mode))
            yield stream
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_file(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` as the whole of ``path`` (see `replacing`)."""
    with replacing(path, mode=mode) as stream:
        stream.write(data)


@contextmanager
def open_regular(path: str | os.PathLike[str], *, limit: int, what: str) -> Iterator[IO[bytes]]:
    """A binary stream of the regular file at ``path`` (a link followed), checked to hold at most
    ``limit`` bytes; ``what`` names the file in a refusal ("a ledger"), to which the caller adds
    what to do.

    Not a regular file: `NotAFileError`, decided by a stat before opening (no device is opened)
    and again on the opened descriptor (opened non-blocking, so a FIFO swapped in between cannot
    block). Larger than ``limit``: `FileTooLargeError`. A reader must still read at most
    ``limit`` bytes (the file may grow while it reads): `read_regular` does."""
    _refuse_odd(path, os.stat(path), what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        _refuse_odd(path, info, what)
        if info.st_size > limit:
            raise FileTooLargeError(f"{path} is {info.st_size} bytes, more than the {limit} "
                                    f"bytes {what} can be: not read")
        yield stream


def read_regular(path: str | os.PathLike[str], *, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (see `open_regular`)."""
    with open_regular(path, limit=limit, what=what) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"{path} grew beyond the {limit} bytes {what} can be while it was "
                                "read: not read")
    return data


def refuse_odd(path: str | os.PathLike[str], *, what: str) -> None:
    """`NotAFileError` where ``path`` exists and is not a regular file, from a stat alone (nothing
    is opened): the check before handing a path to an opener that is not ours (SQLite opens a
    FIFO and blocks)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    _refuse_odd(path, info, what)


def index_files(db: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    """A SQLite index and the ``-wal`` and ``-shm`` files SQLite opens beside it by itself."""
    return Path(db), Path(f"{db}-wal"), Path(f"{db}-shm")


def first_denied(paths: Iterable[Path]) -> Path | None:
    """The first of ``paths`` this user may not open for reading (None: every one opens, or is
    absent): SQLite says "unable to open database file" for that and for damage alike. Opened
    non-blocking, so a FIFO among them cannot block."""
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except PermissionError:
            return path
        except OSError:
            continue
    return None


def permission_problem(path: str | os.PathLike[str]) -> str:
    """Why this user may not read ``path``, in one line: who owns the first of it and its parents
    that this user can see, its mode, and what to do. A permission problem is never damage: the
    bytes may be intact."""
    blocker = Path(path)
    while True:
        try:
            info = os.stat(blocker)
            break
        except OSError:
            if blocker.parent == blocker:
                return f"{path}: permission denied: run as the cache's owner or fix its ownership"
            blocker = blocker.parent
    return (f"{path}: permission denied ({blocker} is owned by {_user(info.st_uid)}, mode "
            f"{stat.filemode(info.st_mode)}; this process runs as {_user(os.geteuid())}): run as "
            f"its owner, or let this user read it (chown, or chmod -R a+rX {blocker})")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refuse_odd(path: str | os.PathLike[str], info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise NotAFileError(f"{path} is {kind_of(info)}, not a regular file: not read as {what}")
